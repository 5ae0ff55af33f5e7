# Two entry points on a fresh machine: `make train` and `make test`.
# Each creates .venv if it is missing; nothing else needs installing by hand.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORKDIR ?= runs/default
CONFIG ?= configs/default.py

.PHONY: train test lint benchmark clean

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/python -m experiments.train --config=$(CONFIG) --workdir=$(WORKDIR)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 tests

lint: $(STAMP)
	$(BIN)/ruff format --check . && $(BIN)/ruff check .

benchmark: $(STAMP)
	$(BIN)/python -m benchmarks all

clean:
	rm -rf $(VENV)
