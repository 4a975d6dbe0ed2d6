# The two commands a newcomer needs: `make run-sample` and `make test` (what CI runs).
VENV ?= .venv
PY := $(VENV)/bin/python
SAMPLE_TOPOLOGY := samples/mig/topology/a100-40gb-active.yaml
SAMPLE_NODE := qa-mig-worker-gpu-a100

.PHONY: run-sample test lint venv bench

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

run-sample: $(VENV)/.installed
	$(PY) -m exporter --topology-file $(SAMPLE_TOPOLOGY) --node-name $(SAMPLE_NODE)

lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

test: $(VENV)/.installed lint
	./scripts/install-test-tools
	$(PY) -m pytest

# The scale benchmark at full size (minutes; see BENCHMARKS.md). Not part of `make test`:
# tests/test_bench.py runs it at a tiny size only.
bench: $(VENV)/.installed
	$(PY) bench/scale.py --nodes 5000 --gpus 8 --runs 3 --events 2000 --rate 200 --exporter-nodes 1000
	$(PY) bench/events.py --nodes 5000
