# make book: build the Jupyter Book from the stored notebook outputs (no execution).
# make check: the fast tests (`pytest -m "not slow"`), under 2 minutes, for use while working.
# make test: everything (torchrun, the book build, its HTML check and its layout in headless
# chromium among them), and every notebook executed once under nbval with the smoke profile, the
# Colab way (conftest.py): the same as a bare `pytest --nbval` from the repository root. The
# layout test needs Debian's chromium (`apt-get install chromium`; .ci/run tries) and skips
# without it; Playwright comes with the dev extras and drives it (never `playwright install`).
# Each sets up .venv from pyproject.toml first; a second run reuses it.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export PATH := $(abspath $(BIN)):$(PATH)
# The offline Fashion-MNIST copy beside the repository, where there is one and none is named (as
# .ci/run finds it): `make floors`' DDP smoke trains on real data, and there is no network here.
ifneq ($(wildcard ../shared/data/fashion-mnist),)
export MGPU_FASHION_MNIST_DIR ?= $(abspath ../shared/data/fashion-mnist)
endif

.PHONY: book check test venv clean

venv: $(STAMP)

# setuptools warns on every editable install that a folder named like the package may shadow it:
# here that folder is the package itself, so the note is silenced (issue 29: a quiet install).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . -W --keep-going

check: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" tests

test: $(STAMP)
	$(BIN)/python -m pytest --nbval

clean:
	rm -rf _build

# make gpu-check: one prepared run on this machine's GPU, within 8 minutes on an H100 or H200
# (tools/gpu_check.py): facts, the CUDA tests, bench (TF32, bf16, fp16, compile), the chapter's
# run, the accuracy drop and exercise 2's split; a record a stage (default runs/gpu_<device>.jsonl)
# and beside it precision.json and the run and drop stores, to ship into mgpu_lib/recorded/.
# Options go in GPU_CHECK_ARGS, e.g. make gpu-check GPU_CHECK_ARGS="--dry-run" (the plan only).
.PHONY: gpu-check
gpu-check: $(STAMP)
	$(BIN)/python tools/gpu_check.py $(GPU_CHECK_ARGS)

# make floors: every dependency at its declared floor (constraints/floors.txt, checked against
# pyproject.toml by tests/test_floors.py) in its own .venv-floors on Python 3.9, the declared floor
# (FLOORS_PYTHON=... names another interpreter), then the fast tests and the DDP smoke: 10 short
# DDP trains in a row, each of which must end with its result file within a minute (issue 41).
FLOORS_PYTHON ?= python3.9
FLOORS        := .venv-floors
.PHONY: floors
floors: $(FLOORS)/.installed
	PATH="$(abspath $(FLOORS))/bin:$$PATH" $(FLOORS)/bin/python -m pytest -m "not slow" tests
	PATH="$(abspath $(FLOORS))/bin:$$PATH" $(FLOORS)/bin/python tools/ddp_smoke.py --runs 10 \
	    --timeout 60 --out runs/ddp_smoke

$(FLOORS)/.installed: pyproject.toml constraints/floors.txt
	test -x $(FLOORS)/bin/python || $(FLOORS_PYTHON) -m venv $(FLOORS)
	$(FLOORS)/bin/python -m pip install --quiet --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(FLOORS)/bin/python -m pip install --quiet \
	    -c constraints/floors.txt -e '.[dev]'
	touch $@
