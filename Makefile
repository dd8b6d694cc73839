# dubflow — the two commands of a fresh machine are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.dubflow-installed

.PHONY: setup demo test lint clean

setup: $(STAMP)

# torch is pinned first so the range in pyproject.toml never pulls another build:
# on CI / CPU boxes pip takes the local CPU wheel, on a GPU host PyPI's CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf .prefect out workspace
