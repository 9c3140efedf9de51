# make book: build the Jupyter Book from the stored notebook outputs (no execution).
# make test: unit tests, then every notebook under nbval with the smoke profile.
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
	$(BIN)/python -m pytest tests
	MGPU_PROFILE=smoke $(BIN)/python -m pytest --nbval chapters exercises

clean:
	rm -rf _build
