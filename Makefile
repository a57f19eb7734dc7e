# The two README commands: `make demo` and `make test`. Both install into .venv first.
# Install order matters (../shared/ENVIRONMENT.md): the local CPU torch before anything that
# depends on torch, and resemblyzer without its broken webrtcvad dependency.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYANNOTE_METRICS_ENABLED := 0

.PHONY: install system-deps demo test lint unit clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q webrtcvad-wheels
	$(PY) -m pip install -q --no-deps resemblyzer==0.1.4
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Programs the tests start themselves (Postgres for the shared store); installed from Debian when
# the machine lacks them (CI runs as root).
system-deps:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		{ apt-get update -q && apt-get install -y -q postgresql; }

demo: install
	$(PY) examples/ai_multi_speaker.py

lint: install
	$(PY) -m ruff check .
	$(PY) -m mypy

unit: install system-deps
	$(PY) -m pytest -q

test: lint unit

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
