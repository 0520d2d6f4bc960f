# fedsys: `make run` and `make test` do all the set-up.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
FEDSYS := $(VENV)/bin/fedsys
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1
export FLWR_DISABLE_UPDATE_CHECK := 1

.PHONY: run test test-fast lint data clean help

help:
	@echo "make run   - set up .venv, get Fashion-MNIST, run configs/default.yaml, print the table"
	@echo "make test  - set up .venv with the dev extra, lint, and run the whole test suite"
	@echo "make lint  - ruff and mypy"

# pip installs uv (the range flwr 1.41 requires, so flwr keeps it), and uv installs the rest:
# the same packages as pip, in less time (docs/performance.md "Setting up").
# uv honours pip's configured constraint file (on this machine it caps torch) and uses the
# system's certificates; it reads no other pip setting.  It compiles the bytecode as pip
# does: without it, three test workers starting Ray at once compiled Ray's modules side
# by side and Ray's start-up timed out.
UV_REQ := uv>=0.12.20,<0.13
PIP_CONSTRAINTS = $(shell $(PYTHON) -m pip config list 2>/dev/null \
                    | sed -n "s/^[^.]*\.constraint='\(.*\)'$$/\1/p" | tail -1)
UV_PIP = UV_NATIVE_TLS=1 $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) \
         $(foreach c,$(PIP_CONSTRAINTS),-c $(c))

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q '$(UV_REQ)'
	$(UV_PIP) -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(UV_PIP) -e '.[dev]'
	touch $@

data: $(VENV)/.installed
	$(FEDSYS) data fetch fashion-mnist

run: $(VENV)/.installed data
	$(FEDSYS) run configs/default.yaml

# three xdist workers on 2 cores, each file's tests on one (a module's deployment starts once;
# loadgroup does not group under pytest 9 with xdist 3.8): the tests wait on Ray's start-up,
# the SuperNodes' polling and round timeouts, and in CI one worker waits for the Docker images,
# so a third worker fills cores that two left idle (2026-11-25: the integration tests in 1166 s
# instead of about 1370 s); each worker's simulations join one Ray cluster of one CPU, so each
# starts one ClientApp actor (tests/conftest.py; the suite 1390 -> 1137 s beside a niced run)
test: $(VENV)/.installed-dev data lint
	$(PY) -m pytest -q -rs --durations=20 -n 3 --dist loadfile

test-fast: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m "not slow and not deploy"

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
