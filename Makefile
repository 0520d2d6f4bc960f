# fedsys: `make run` and `make test` do all the set-up.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
FEDSYS := $(VENV)/bin/fedsys
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1
export FLWR_DISABLE_UPDATE_CHECK := 1

.PHONY: run test test-fast test-flwr-oldest test-flwr-next oldest-venv lint data clean help

help:
	@echo "make run   - set up .venv, get Fashion-MNIST, run configs/default.yaml, print the table"
	@echo "make test  - set up .venv with the dev extra, lint, and run the whole test suite"
	@echo "make lint  - ruff and mypy"
	@echo "make test-flwr-oldest - unit tests, a simulation and Flower's template under flwr $(FLWR_OLDEST)"
	@echo "make test-flwr-next - unit tests and a simulation under the newest Flower pre-release (not CI)"

# fedsys supports flwr >=1.41,<1.43 (pyproject.toml); `make` installs the newest, FLWR_DEFAULT,
# and `make test-flwr-oldest` tests the oldest, FLWR_OLDEST, in a venv of its own (.ci/run
# runs both).  Each flwr release requires its own uv range, disjoint ones: 1.41 uv
# >=0.12.20,<0.13, 1.42 uv >=0.13.5,<0.14.
FLWR_DEFAULT := 1.42.0
FLWR_OLDEST  := 1.41.0
# pip installs uv (the range FLWR_DEFAULT requires, so flwr keeps it), and uv installs the rest:
# the same packages as pip, in less time (docs/performance.md "Setting up").
# uv honours pip's configured constraint file (on this machine it caps torch) and uses the
# system's certificates; it reads no other pip setting.
# Bytecode is compiled when a module is first imported and kept, not for the whole venv at
# install (docs/performance.md "Setting up"); an inherited PYTHONDONTWRITEBYTECODE is undone.
# IMPORT_AHEAD compiles the heavy modules once before the test workers start, which would
# otherwise compile them side by side (docs/development.md "Why things are as they are").
unexport PYTHONDONTWRITEBYTECODE
IMPORT_AHEAD := -c 'import fedsys_launch.commands.cli, fedsys_launch.apps.client_app, fedsys_launch.apps.server_app, fedsys_launch.engines.simulation, ray, flwr.simulation'
UV_REQ := uv>=0.13.5,<0.14
UV_REQ_OLDEST := uv>=0.12.20,<0.13
PIP_CONSTRAINTS = $(shell $(PYTHON) -m pip config list 2>/dev/null \
                    | sed -n "s/^[^.]*\.constraint='\(.*\)'$$/\1/p" | tail -1)
UV_PIP = UV_NATIVE_TLS=1 $(VENV)/bin/uv pip install -q --python $(PY) \
         $(foreach c,$(PIP_CONSTRAINTS),-c $(c))
VENV_OLDEST := .venv-flwr$(FLWR_OLDEST)
TEMPLATE_TEST := tests/integration/test_flower_template.py::test_flowers_template_trains_under_every_fedsys_strategy

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q '$(UV_REQ)'
	$(UV_PIP) -e . 'flwr[simulation]==$(FLWR_DEFAULT)'
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(UV_PIP) -e '.[dev]'
	touch $@

data: $(VENV)/.installed
	$(FEDSYS) data fetch fashion-mnist

run: $(VENV)/.installed data
	$(FEDSYS) run configs/default.yaml

# three xdist workers on 2 cores, each file's tests on one (a module's deployment starts
# once): the tests wait more than they compute (docs/development.md "Why things are as they are")
test: $(VENV)/.installed-dev data lint
	$(PY) $(IMPORT_AHEAD)
	$(PY) -m pytest -q -rs --durations=20 -n 3 --dist loadfile

test-fast: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m "not slow and not deploy"

# the oldest supported flwr: its own venv (uv's cache makes it quick after .venv), the unit
# tests, one simulation and Flower's app template under IMA over FedCDA with partition-id
$(VENV_OLDEST)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_OLDEST)
	$(VENV_OLDEST)/bin/python -m pip install -q '$(UV_REQ_OLDEST)'
	UV_NATIVE_TLS=1 $(VENV_OLDEST)/bin/uv pip install -q \
	    --python $(VENV_OLDEST)/bin/python $(foreach c,$(PIP_CONSTRAINTS),-c $(c)) \
	    -e '.[dev]' 'flwr[simulation]==$(FLWR_OLDEST)'
	touch $@

# unit tests that touch no Flower code (plain torch and NumPy maths, the report script and the
# seeds driver): the newest Flower's run covers them, the oldest's skips them (CI time)
FLOWER_FREE_UNIT_TESTS := test_clients test_fedelmy_scaling test_lss test_metrics_identical test_models_data test_params \
    test_reproduce test_report test_trainable
oldest-venv: $(VENV_OLDEST)/.installed

test-flwr-oldest: $(VENV_OLDEST)/.installed data
	$(VENV_OLDEST)/bin/python -c 'import flwr; assert flwr.__version__ == "$(FLWR_OLDEST)", flwr.__version__'
	$(VENV_OLDEST)/bin/python $(IMPORT_AHEAD)
	$(VENV_OLDEST)/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile tests/unit \
	    $(foreach t,$(FLOWER_FREE_UNIT_TESTS),--ignore=tests/unit/$(t).py) \
	    tests/integration/test_simulation.py::test_three_nodes_two_rounds_two_strategies \
	    "$(TEMPLATE_TEST)[fedcda+ima-client_app_pid]"

# the newest Flower pre-release the package index serves: Flower's nightly builds are the
# distribution flwr-nightly (it installs the module flwr), so fedsys and its dev extra go in
# first, then flwr leaves for the nightly.  Not part of CI: a nightly that changed one of
# Flower's internals fedsys patches shows it as a WARNING of fedsys_launch/flower_patches.py
# (printed at the end), and a test that fails shows what else moved.
VENV_NEXT := .venv-flwr-next
$(VENV_NEXT)/.installed: pyproject.toml
	rm -rf $(VENV_NEXT)
	$(PYTHON) -m venv $(VENV_NEXT)
	$(VENV_NEXT)/bin/python -m pip install -q uv
	UV_NATIVE_TLS=1 $(VENV_NEXT)/bin/uv pip install -q --python $(VENV_NEXT)/bin/python \
	    $(foreach c,$(PIP_CONSTRAINTS),-c $(c)) -e '.[dev]'
	UV_NATIVE_TLS=1 $(VENV_NEXT)/bin/uv pip uninstall -q --python $(VENV_NEXT)/bin/python flwr
	UV_NATIVE_TLS=1 $(VENV_NEXT)/bin/uv pip install -q --python $(VENV_NEXT)/bin/python \
	    $(foreach c,$(PIP_CONSTRAINTS),-c $(c)) --prerelease allow 'flwr-nightly[simulation]'
	touch $@

test-flwr-next: $(VENV_NEXT)/.installed data
	$(VENV_NEXT)/bin/python -c 'import importlib.metadata as m; print("flwr-nightly", m.version("flwr-nightly"))'
	$(VENV_NEXT)/bin/python -c 'from fedsys_launch import flower_patches as p; \
	    bad = {n: c() for n, c in p.CHECKS.items() if c()}; \
	    print("Flower patches that no longer fit:", bad or "none")'
	$(VENV_NEXT)/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile tests/unit \
	    tests/integration/test_simulation.py::test_three_nodes_two_rounds_two_strategies

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(VENV_OLDEST) $(VENV_NEXT) runs .pytest_cache .mypy_cache .ruff_cache
