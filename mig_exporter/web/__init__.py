"""The HTTP server both daemons serve /metrics and /health with, and its web config (TLS, basic auth).

Below both daemons: neither imports the other for it.
"""
