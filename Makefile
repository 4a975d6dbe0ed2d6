# The two commands a newcomer needs: `make run-sample` and `make test` (what CI runs).
VENV ?= .venv
PY := $(VENV)/bin/python
SAMPLE_TOPOLOGY := samples/mig/topology/a100-40gb-active.yaml
SAMPLE_NODE := qa-mig-worker-gpu-a100

.PHONY: run-sample test lint venv

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
