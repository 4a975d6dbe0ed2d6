"""What every room uses: bounded file and YAML reading, one-line messages, self-metrics, process helpers.

Imports nothing of the project: the ground floor.
"""
