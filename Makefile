# dubflow — the two commands of a fresh machine are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.dubflow-installed
# GPU hosts also get the `cuda` extra (cuDNN frontend attention graphs); every host `dev` and `team`
# (asyncpg: the server on PostgreSQL, scripts/stack.sh team).
EXTRAS ?= $(if $(shell command -v nvidia-smi 2>/dev/null),dev$(comma)team$(comma)cuda,dev$(comma)team)
comma := ,

.PHONY: setup demo demo-local test lint clean lock chromium

setup: $(STAMP)

# torch is pinned first so the range in pyproject.toml never pulls another build:
# on CI / CPU boxes pip takes the local CPU wheel, on a GPU host PyPI's CUDA build.
# scripts/constraints.txt holds every other package at the version the suite last passed with (`make lock`).
CONSTRAINTS := scripts/constraints.txt
$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e ".[$(EXTRAS)]"
	touch $(STAMP)

# Re-lock scripts/constraints.txt to the venv's packages after a deliberate upgrade (keeps its header comment;
# torch, triton and nvidia-* stay out: the Makefile pins torch, a GPU host takes its CUDA build).
lock: setup
	{ grep '^#' $(CONSTRAINTS); $(BIN)/pip freeze --exclude-editable | grep -viE '^(torch|triton|nvidia-)[=-]'; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)

# A second ffmpeg build for tests/test_ffmpeg_builds.py: imageio-ffmpeg 0.6.0's static ffmpeg 7.0.2, the one
# the GPU host's bundle carries (scripts/device_bundle.py). Without PyPI the test skips.
FFMPEG7 := $(VENV)/ffmpeg-builds/ffmpeg-7.0.2
$(FFMPEG7):
	mkdir -p $(VENV)/ffmpeg-builds
	$(BIN)/pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
		-d $(VENV)/ffmpeg-builds "imageio-ffmpeg==0.6.0" \
	&& $(BIN)/python -c 'import glob, os, sys, zipfile; z = zipfile.ZipFile(glob.glob(sys.argv[1] + "/imageio_ffmpeg-0.6.0-*.whl")[0]); \
		n = next(n for n in z.namelist() if "binaries/ffmpeg-" in n); open(sys.argv[2], "wb").write(z.read(n)); os.chmod(sys.argv[2], 0o755); os.remove(z.filename)' \
		$(VENV)/ffmpeg-builds $(FFMPEG7) \
	|| echo "make: no second ffmpeg build (PyPI unreachable?): tests/test_ffmpeg_builds.py skips"

# Debian's Chromium for the review step's browser test (tests/test_review_e2e.py; playwright drives it): installed
# with apt-get where it is missing and we may (root); else that test skips.
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
	|| echo "make: no Chromium (not root?): tests/test_review_e2e.py's browser test skips"

# The test files run on TEST_WORKERS pytest-xdist workers (whole files per worker, the longest first, each
# worker's torch threads the cores shared out: tests/scheduling.py, tests/conftest.py); TEST_WORKERS=0 is one
# process. Two on a 2-core box: benchmarks/RESULTS.md ("make test", both ways).
TEST_WORKERS ?= 2
test: setup chromium $(if $(filter x86_64,$(shell uname -m)),$(FFMPEG7))
	DUBFLOW_TEST_FFMPEGS="$$(test -x $(FFMPEG7) && realpath $(FFMPEG7))" \
		$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The bundled sample film through the real deployment (scripts/demo.sh): starts the local Prefect stack
# (server + UI, pools, deployments, one worker on GPU 0 or the CPU), runs `prefect deployment run
# dub-film/default ... --watch` with the default config (infinitetalk in tiny mode without weights: TINY
# RANDOM WEIGHTS, a pipeline check, NOT a dubbing result), prints the output path, its report and the run's
# UI URL.
# Safe to run twice (the second run reuses every shot); `make stack-stop` stops the stack.
demo: setup
	scripts/demo.sh

# The same film through the local command (Prefect in-process, no stack): `DEMO_ARGS=--no-prefect` skips
# Prefect, `DEMO_ARGS="--backend passthrough"` is the dry run.
demo-local: setup
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
