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

# The bundled sample film through the local command with the default config: the infinitetalk backend in
# tiny mode (TINY RANDOM WEIGHTS, written once under workspace/.cache: a pipeline check, NOT a dubbing result;
# ~1-2 min on 2 CPU cores); prints the output path. Prefect runs in-process (its ephemeral server unless
# PREFECT_API_URL is set: ~20-40 s of start-up); `make demo DEMO_ARGS=--no-prefect` skips Prefect,
# `DEMO_ARGS="--backend passthrough"` is the dry run.
demo: setup
	$(BIN)/dubflow dub data/sample_film.mp4 --audio data/sample_dub.wav --out out/sample_film.dubbed.mp4 \
		$(DEMO_ARGS)

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf .prefect out workspace

# Prefect stack on this host (server, pools, deployments, one worker per GPU): see "Running on a GPU pool".
.PHONY: stack-start stack-stop screenshot
stack-start: setup
	scripts/stack.sh start

stack-stop:
	scripts/stack.sh stop

# make screenshot RUN=<flow-run-id> [OUT=run.png]
screenshot:
	@test -n "$(RUN)" || { echo "usage: make screenshot RUN=<flow-run-id> [OUT=run.png]" >&2; exit 2; }
	scripts/screenshot.sh "$(RUN)" "$(or $(OUT),run.png)"
