# Two entry points on a fresh machine: `make train` and `make test`.
# Each creates .venv if it is missing; nothing else needs installing by hand. `make test` leaves
# out the tests marked slow (SIGKILL-and-resume, Ctrl-C, each family's Ctrl-C-and-resume,
# 8 devices, two processes, a second process's compile cache, an xdist worker's teardown, the
# notebook, the device benchmark's smoke run); `make test-slow` runs exactly those, and CI runs
# both.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORKDIR ?= runs/default
CONFIG ?= configs/default.py

.PHONY: train test test-slow lint benchmark clean

# Python 3.11+: jax 0.10.2 and numpy 2.4.6 have no wheels for older versions. A venv without the
# stamp is a failed or interrupted install: it is removed rather than reused.
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "error: Python 3.11 or newer is needed; '$(PY)' is $$($(PY) -V 2>&1). Use e.g. make PY=python3.11" >&2; \
	  exit 2; }
	@test -f $(STAMP) || rm -rf $(VENV)
	@echo "Installing the pinned requirements into $(VENV): the first time takes a few minutes."
	@{ test -x $(BIN)/python || $(PY) -m venv $(VENV); } \
	  && $(BIN)/pip install -q --upgrade pip \
	  && $(BIN)/pip install -q -r requirements-dev.txt \
	  && $(BIN)/pip install -q --no-deps -e . \
	  || { rm -rf $(VENV); echo "error: installing into $(VENV) failed (see above); removed $(VENV)" >&2; exit 1; }
	@touch $(STAMP)

train: $(STAMP)
	$(BIN)/python -m experiments.train --config=$(CONFIG) --workdir=$(WORKDIR)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -m "not slow" tests

test-slow: $(STAMP)
	$(BIN)/python -m pytest -n 2 -m slow tests

lint: $(STAMP)
	$(BIN)/ruff format --check . && $(BIN)/ruff check .

benchmark: $(STAMP)
	$(BIN)/python -m benchmarks all

clean:
	rm -rf $(VENV)
