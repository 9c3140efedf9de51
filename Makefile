# make book: build the Jupyter Book from the stored notebook outputs (no execution).
# make test: unit tests (the Colab simulation and the built book's HTML check among them), then
# every notebook under nbval with the smoke profile.
# Each sets up .venv from pyproject.toml first; a second run reuses it.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: book test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . -W --keep-going

test: $(STAMP)
	MGPU_CHECK_BOOK=1 $(BIN)/python -m pytest tests
	MGPU_PROFILE=smoke $(BIN)/python -m pytest --nbval chapters exercises

clean:
	rm -rf _build

# make gpu-check: measure this machine's GPU in stages under a time budget (tools/gpu_check.py):
# facts, the CUDA tests, a full run, bench, calibration, both exercises; one JSON line a stage.
# Options go in GPU_CHECK_ARGS, e.g. make gpu-check GPU_CHECK_ARGS="--budget-s 900" (a T4 needs it).
.PHONY: gpu-check
gpu-check: $(STAMP)
	$(BIN)/python tools/gpu_check.py $(GPU_CHECK_ARGS)
