"""The pipeline as a Dagster Component, through the real `dg` CLI: in this repository, and in a user's own
project that depends on this package (scaffold, edit, check, list, launch, `dragon demo`)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import seed_mlflow_store, user_project

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200", **(env or {})}
    env.pop("VIRTUAL_ENV", None)  # dg warns when an activated venv differs from a project's .venv
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_dg_checks_and_lists_the_bundled_pipeline_in_this_repository(tmp_path):
    env = {"DAGSTER_HOME": str(tmp_path)}
    checked = run([str(BIN / "dg"), "check", "yaml"], ROOT, env)
    assert checked.returncode == 0 and "All component YAML validated successfully" in checked.stdout, checked.stderr
    listed = run([str(BIN / "dg"), "list", "defs", "--json"], ROOT, env)
    assert listed.returncode == 0, listed.stderr
    assert '"support/grpo_adapter"' in listed.stdout and '"support_pipeline"' in listed.stdout
    components = run([str(BIN / "dg"), "list", "components"], ROOT, env)
    assert "dragon_dagster.PostTrainingPipeline" in components.stdout


def test_a_users_own_project_scaffolds_checks_lists_launches_and_demos_a_pipeline(tmp_path, tiny_model):
    project = tmp_path / "project"
    defs = user_project(project)
    env = {
        "DAGSTER_HOME": str(tmp_path / "home"),
        "DRAGON_RUNS_DIR": str(tmp_path / "runs"),
        "PYTHONPATH": str(project),
    }
    (tmp_path / "home").mkdir()
    seed_mlflow_store(tmp_path / "runs" / "mlflow.db")  # what `dg launch` and `dragon demo` track into, made once

    scaffolded = run(
        [str(BIN / "dg"), "scaffold", "defs", "dragon_dagster.PostTrainingPipeline", "my_pipeline"], project, env
    )
    assert scaffolded.returncode == 0, scaffolded.stdout + scaffolded.stderr
    yaml_file = defs / "my_pipeline" / "defs.yaml"
    starter = yaml_file.read_text()
    assert starter.startswith("type: dragon_dagster.PostTrainingPipeline") and "name: my_pipeline" in starter

    # the user points it at their model and shortens training, then makes a typo and a wrong type
    edited = starter.replace("model: smollm2-135m", f"model: {tiny_model}").replace(
        "epochs: 1, learning_rate: 2.0e-4", "epochs: 1, max_steps: 2, learning_rate: 2e-4"
    )
    yaml_file.write_text(edited.replace("grad_accum: 1", "grad_acum: 1").replace("eval_frac: 0.05", "eval_frac: lots"))
    bad = run([str(BIN / "dg"), "check", "yaml"], project, env)
    assert bad.returncode != 0
    line_of = {
        word: 1 + next(i for i, line in enumerate(yaml_file.read_text().splitlines()) if word in line)
        for word in ("grad_acum", "eval_frac")
    }
    assert re.search(
        rf"defs\.yaml:{line_of['grad_acum']} - .*attributes\.stages\.1\.args\.grad_acum "
        r"Additional properties are not allowed",
        bad.stdout,
    ), bad.stdout
    assert re.search(rf"defs\.yaml:{line_of['eval_frac']} - .*attributes\.stages\.0\.eval_frac 'lots'", bad.stdout)

    yaml_file.write_text(edited)
    good = run([str(BIN / "dg"), "check", "yaml"], project, env)
    assert good.returncode == 0 and "validated successfully" in good.stdout, good.stdout + good.stderr
    listed = run([str(BIN / "dg"), "list", "defs", "--json"], project, env)
    assert '"my_pipeline/sft_adapter"' in listed.stdout and '"my_pipeline/evaluation_report"' in listed.stdout

    launched = run([str(BIN / "dg"), "launch", "--assets", "my_pipeline/tickets,my_pipeline/sft_dataset"], project, env)
    assert launched.returncode == 0 and "RUN_SUCCESS" in launched.stdout + launched.stderr, launched.stderr[-3000:]
    assert list((tmp_path / "runs" / "artifacts" / "my_pipeline" / "sft_dataset").glob("*/train.jsonl"))

    # `dragon demo` finds the pipeline in the project's definitions (its pyproject) and runs it end to end
    demo = run([str(BIN / "dragon"), "demo", "--pipeline", "my_pipeline", "--profile", ""], project, env)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "my_pipeline/evaluation_report" in demo.stdout
    # a quiet terminal: no library's warning or notice, no stack trace (a line per stage is the progress)
    noise = [
        line
        for line in (demo.stdout + demo.stderr).splitlines()
        if re.search(r"Warning\b|warnings\.warn|Traceback|Stack Trace| INFO mlflow\.| WARNING ", line)
    ]
    assert not noise, noise
    # the stage's check in its table row (a pass is counted there, a failure or warning named)
    [row] = [line for line in demo.stdout.splitlines() if "│ my_pipeline/sft_adapter " in line]
    assert re.search(r"│ (1 passed|losses_finite_and_falling (FAILED|warning)) +│$", row), row
    missing = run([str(BIN / "dragon"), "demo", "--pipeline", "nope"], project, env)
    assert missing.returncode != 0 and "no pipeline named 'nope'" in missing.stdout + missing.stderr
    assert "my_pipeline" in missing.stdout + missing.stderr


def test_dg_check_yaml_names_a_misspelled_reward_option(tmp_path):
    project = tmp_path / "project"
    defs = user_project(project)
    (defs / "arith").mkdir()
    text = (ROOT / "dragon_dagster" / "defs" / "support" / "defs.yaml").read_text()
    assert "{type: length, max_chars: 16, weight: 0.2}" in text
    (defs / "arith" / "defs.yaml").write_text(
        text.replace("{type: length, max_chars: 16, weight: 0.2}", "{type: length, max_chars: 16, patern: x}")
    )
    env = {"DAGSTER_HOME": str(tmp_path), "PYTHONPATH": str(project)}
    bad = run([str(BIN / "dg"), "check", "yaml"], project, env)
    line = 1 + next(i for i, row in enumerate(text.splitlines()) if "max_chars: 16" in row)
    assert bad.returncode != 0
    assert re.search(
        rf"defs\.yaml:{line} - .*attributes\.stages\.5\.rewards\.1.*'patern' was unexpected", bad.stdout
    ), bad.stdout
    # the rloo kind reads the same typed reward specs
    (defs / "arith" / "defs.yaml").write_text(text)  # dg stops at the first file it refuses
    (defs / "rloo").mkdir()
    rloo = (ROOT / "dragon_dagster" / "defs" / "support_distill" / "defs.yaml").read_text()
    assert rloo.count("{type: length, max_chars: 16, weight: 0.2}") == 1
    (defs / "rloo" / "defs.yaml").write_text(
        rloo.replace("{type: length, max_chars: 16, weight: 0.2}", "{type: length, max_char: 16}")
    )
    bad = run([str(BIN / "dg"), "check", "yaml"], project, env)
    line = 1 + next(i for i, row in enumerate(rloo.splitlines()) if "max_chars: 16" in row)
    assert re.search(
        rf"rloo/defs\.yaml:{line} - .*attributes\.stages\.3\.rewards\.1.*'max_char' was unexpected", bad.stdout
    ), bad.stdout
