# The two commands a newcomer needs: `make run-sample` and `make test` (what CI runs).
VENV ?= .venv
PY := $(VENV)/bin/python
SAMPLE_TOPOLOGY := samples/mig/topology/a100-40gb-active.yaml
SAMPLE_NODE := qa-mig-worker-gpu-a100

.PHONY: run-sample test test-slow lint venv bench bench-many bench-dra soak mutation mutation-sample docs-help docs-upgrade

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
	$(VENV)/bin/lint-imports

# Two workers (pytest-xdist): the live tests mostly wait on their processes, so two of them side by
# side halve the wall time on the 2-core CI machine. WORKERS=0 runs in this process (pdb, -x).
WORKERS ?= 2
test: $(VENV)/.installed lint
	./scripts/install-test-tools
	./scripts/install-helm
	./scripts/install-dashboard-tools
	$(PY) -m pytest -n $(WORKERS)

# Exploration, which `make test` leaves out: the tests marked slow (many long fault sequences from
# random seeds against the updater, tests/live/test_faults.py) and every generated test with new random
# examples, ten times as many (minutes). A failing seed or example joins the fixed set once fixed.
test-slow: $(VENV)/.installed
	HYPOTHESIS_PROFILE=explore $(PY) -m pytest -m ''

# The scale benchmark at full size (minutes; see BENCHMARKS.md). Not part of `make test`:
# tests/live/test_bench.py runs it at a tiny size only.
bench: $(VENV)/.installed
	$(PY) -m bench.scale --nodes 5000 --gpus 8 --runs 3 --events 2000 --rate 200 --exporter-nodes 1000
	$(PY) -m bench.events --nodes 5000

# Many-nodes mode at 5,000 nodes (issue 24; about 20 minutes, see BENCHMARKS.md): one exporter beside
# the one before per-node targets (a git ref), four shards, and a real Prometheus scraping 2,000
# node targets for 5 minutes; then a fleet fault policy over them (issue 35: the updater's cost,
# what it changes, the exporter healthy and with faults). tests/live/test_bench.py runs both at a
# tiny size only.
bench-many: $(VENV)/.installed
	./scripts/install-test-tools
	$(PY) -m bench.many --nodes 5000 --gpus 8 --runs 3 --shards 4 --prometheus-targets 2000
	$(PY) -m bench.faults --nodes 5000 --gpus 8 --runs 3 --fraction 0.02
	$(PY) -m bench.kai --nodes 5000 --gpus 8 --runs 3

# DRA at cluster size (issue 32; about 30 minutes, see BENCHMARKS.md): the updater publishing 5,000
# H100 x 8 dynamic-MIG nodes' ResourceSlices to an API that takes every write at once (unpaced:
# the figure is the updater's own), its restart and claim latency, render of 1,000 nodes; beside
# the updater before this work from git. tests/live/test_bench_dra.py runs it at a tiny size only.
bench-dra: $(VENV)/.installed
	$(PY) -m bench.dra --nodes 5000 --gpus 8 --runs 3 --baseline-nodes 300 --render-nodes 1000 \
		-- --kube-api-qps 100000 --kube-api-burst 100000

# Both daemons as real processes under 10 minutes of churn against the API emulator: RSS at the
# start and end, verdict FAIL (exit 1) if it grows (see BENCHMARKS.md). tests/live/test_soak.py runs it
# for 18 s only.
soak: $(VENV)/.installed
	$(PY) -m bench.soak --minutes 10

# Mutation testing (hours for everything on 2 cores: see tests/README.md for the method and the
# recorded results). MUTANTS narrows it, e.g. make mutation MUTANTS='status_updater.state*'.
MUTANTS ?=
mutation: $(VENV)/.installed
	HYPOTHESIS_PROFILE=mutation $(VENV)/bin/mutmut run $(MUTANTS)
	$(VENV)/bin/mutmut results

# The score in about an hour instead of a day: mutmut over a random sample of each package's
# mutants, with a 95 % interval (scripts/mutation_sample.py; the recorded run is in tests/README.md).
SAMPLE_ARGS ?= --per-package 150 --seed 9 --rejudge-seconds 50
mutation-sample: $(VENV)/.installed
	HYPOTHESIS_PROFILE=mutation $(PY) scripts/mutation_sample.py $(SAMPLE_ARGS)

# docs/help.md: each command's --help as printed (tests/pipeline/test_help.py fails while it is stale).
docs-help: $(VENV)/.installed
	$(PY) -m tests.support.helptext > docs/help.md

# docs/upgrade.md from the generation table (a test fails when they disagree).
docs-upgrade: $(VENV)/.installed
	$(PY) -m exporter.upgrade > docs/upgrade.md
