"""Faults an operator meets, reproduced on the tiny model with real parts: secrets kept out of every record,
custom reward code kept out of the Dagster process, a broken pipeline kept from taking the others down,
inputs too large to read refused with a name, workers that never outlive their job."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance

from dragon_dagster.assets.launch import materialize_pipeline
from dragon_dagster.engine.artifacts.directories import sha256
from dragon_dagster.engine.artifacts.manifest import read_manifest
from dragon_dagster.engine.data.errors import DataError
from dragon_dagster.engine.data.tables import read_table
from dragon_dagster.engine.pipeline import PipelineError, load
from dragon_dagster.engine.rewards import RewardSet
from tests.support import completion, component_yaml, user_project


def manifest_of(directory) -> dict:
    """An artifact's manifest as the mapping its JSON holds (every field, the kind's own ones too)."""
    return read_manifest(directory).model_dump()


KEY = "sk-planted-5f1c0a9e7d"
STEPS = "{max_steps: 2, batch_size: 2, grad_accum: 1, logging_steps: 1, save_steps: 100, max_seq_len: 128}"


def everything_written(*roots: Path) -> bytes:
    """Every byte of every file under roots: artifacts, job files, manifests, MLflow's store, Dagster's logs."""
    return b"".join(p.read_bytes() for root in roots for p in Path(root).rglob("*") if p.is_file())


def test_a_server_judge_s_key_comes_from_the_environment_and_is_written_nowhere(
    tiny_model, tmp_path, stub, resources_for, monkeypatch
):

    def judge(n, body):
        return 200, completion('{"winner": "A", "reason": "ok"}')

    server = stub(judge)
    monkeypatch.setenv("DRAGON_TEST_JUDGE_KEY", KEY)
    path = tmp_path / "p" / "defs.yaml"
    path.parent.mkdir()
    path.write_text(
        component_yaml(
            textwrap.dedent(f"""\
        name: secret
        model: {tiny_model}
        datasets: {{tickets: {{path: "example:tickets.csv"}}}}
        stages:
          - {{name: sft_dataset, kind: chat_dataset, source: tickets, prompt: "{{subject}}", response: reply}}
          - {{name: sft_adapter, kind: sft, dataset: sft_dataset, args: {STEPS}, n_samples: 1, max_new_tokens: 4}}
          - {{name: merged_model, kind: merge}}
          - name: evaluation_report
            kind: evaluate
            dataset: sft_dataset
            n_samples: 1
            max_new_tokens: 4
            n_judge: 1
            judge: {{base_url: "{server.url}", model: judge, api_key_env: DRAGON_TEST_JUDGE_KEY}}
        """)
        )
    )
    home = tmp_path / "home"
    home.mkdir()
    instance = DagsterInstance.local_temp(str(home))
    outcome = materialize_pipeline(load(path), resources=resources_for(tmp_path / "runs"), instance=instance)
    assert outcome["success"], outcome["stages"]
    # header names as sent: httpx (under the openai client) sends them in lower case
    seen = [{k.lower(): v for k, v in r["headers"].items()}.get("authorization") for r in server.requests]
    assert seen and set(seen) == {f"Bearer {KEY}"}, "the judge was called with the key from the environment"
    written = everything_written(tmp_path / "runs", home)
    assert KEY.encode() not in written and b"DRAGON_TEST_JUDGE_KEY" in written  # the name is on record, not the key
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    for run in client.search_runs([client.get_experiment_by_name("secret").experiment_id]):
        assert KEY not in json.dumps({**run.data.params, **run.data.tags})


def test_a_key_written_in_the_pipeline_is_refused_with_the_field_named(tmp_path):
    path = tmp_path / "defs.yaml"
    path.write_text(
        component_yaml(
            textwrap.dedent(f"""\
        name: leaky
        datasets: {{t: {{path: "example:tickets.csv"}}}}
        stages:
          - {{name: d, kind: chat_dataset, source: t, prompt: subject, response: reply}}
          - {{name: s, kind: sft, dataset: d}}
          - {{name: m, kind: merge}}
          - {{name: r, kind: evaluate, dataset: d,
              judge: {{base_url: "http://127.0.0.1:9/v1", model: j, api_key: {KEY}}}}}
        """)
        )
    )
    with pytest.raises(PipelineError) as raised:
        load(path)
    # the judge mapping is on line 10 of the file (its stage starts on line 9)
    assert "stages[3].judge (line 10): Value error, do not write an API key" in str(raised.value)
    assert KEY not in str(raised.value) and "api_key_env" in str(raised.value)


def test_custom_reward_code_runs_only_in_the_worker_and_its_hash_is_recorded(tiny_model, tmp_path, resources_for):
    pipelines = tmp_path / "p"
    pipelines.mkdir()
    marker = tmp_path / "imported-by.txt"
    reward = pipelines / "marked_reward.py"
    reward.write_text(
        textwrap.dedent(f"""\
        import os
        with open({str(marker)!r}, "a") as f:  # a side effect at import: who ran this file?
            f.write(str(os.getpid()) + "\\n")

        def reward(prompt, completion, reference, row):
            return 1.0 if len(completion) < 12 else 0.0
        """)
    )
    (pipelines / "defs.yaml").write_text(
        component_yaml(
            textwrap.dedent(f"""\
        name: marked
        model: {tiny_model}
        stages:
          - {{name: prompts, kind: prompt_dataset, path: "example:arithmetic.csv", prompt: question, reference: answer}}
          - {{name: grpo_adapter, kind: grpo, dataset: prompts, group_size: 2, max_new_tokens: 4, max_eval_prompts: 2,
              n_samples: 1, args: {STEPS}, rewards: [{{type: custom, file: marked_reward.py, name: short}}]}}
        """)
        )
    )
    outcome = materialize_pipeline(
        load(pipelines / "defs.yaml"), resources=resources_for(tmp_path / "runs"), instance=DagsterInstance.ephemeral()
    )
    assert outcome["success"], outcome["stages"]
    importers = set(marker.read_text().split())
    assert importers and str(os.getpid()) not in importers, "the Dagster step process never imports the file"
    manifest = manifest_of(outcome["artifacts"]["grpo_adapter"])
    assert manifest["reward_files"] == {"short": sha256(reward)}
    from mlflow import MlflowClient

    run = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}").get_run(manifest["mlflow_run_id"])
    assert run.data.tags["reward_file.short.sha256"] == sha256(reward)


def test_a_custom_reward_that_hangs_is_stopped_at_its_timeout(tmp_path):
    path = tmp_path / "slow.py"
    path.write_text(
        "import time\n\ndef reward(prompt, completion, reference, row):\n    time.sleep(30)\n    return 1.0\n"
    )
    rewards = RewardSet([{"type": "custom", "file": str(path), "name": "slow", "timeout": 0.5}])
    started = time.monotonic()
    scores = rewards.score(["a", "b"], [{"prompt": "p"}, {"prompt": "q"}], on_error="zero")
    assert time.monotonic() - started < 5
    assert scores.scores["slow"] == [0.0, 0.0] and scores.errors["slow"] == 2
    with pytest.raises(Exception, match=r"reward\(\) in .*slow.py took longer than 0.5 s"):
        rewards.score(["a"], [{"prompt": "p"}], on_error="raise")


def test_a_broken_pipeline_is_reported_by_file_and_field_while_the_others_load(tmp_path, tiny_model):
    from tests.support import write_pipeline

    defs = user_project(tmp_path)
    write_pipeline(defs, tiny_model, name="good")
    (defs / "broken").mkdir()
    (defs / "broken" / "defs.yaml").write_text(
        component_yaml(
            "name: broken\ndatasets: [a]\nstages: [{name: m, kind: merge}]\nfeedback: {min_new_records: lots}\n"
        )
    )
    code = (
        "from trainlab.definitions import defs; "
        "print(sorted(k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys())); "
        "print([(s.name, s.description) for s in defs.sensors if 'broken' in s.name])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(tmp_path), "DAGSTER_HOME": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assets, sensors = out.stdout.strip().splitlines()[-2:]
    assert "'good/sft_adapter'" in assets and "broken/" not in assets
    where = defs / "broken" / "defs.yaml"
    assert "broken_pipeline_is_broken" in sensors and f"{where}: datasets (line 4)" in sensors
    assert "feedback.min_new_records (line 6)" in sensors and "'lots'" in sensors
    assert "pipeline not loaded" in out.stderr  # and the load logs it


def test_a_table_too_large_to_read_is_refused_with_a_name(tmp_path, monkeypatch):
    big = tmp_path / "huge.csv"
    with big.open("wb") as f:  # a sparse 2 GiB file: no disk used, but it is what read_table would face
        f.truncate(2 * 2**30)
    with pytest.raises(
        DataError,
        match=r"huge.csv is 2,048 MB, over the 1,024 MB a table may have.*"
        "DRAGON_MAX_TABLE_MB",
    ):
        read_table(big)
    monkeypatch.setenv("DRAGON_MAX_TABLE_MB", "0.0001")
    small = tmp_path / "small.csv"
    small.write_text("a,b\n" + "x,y\n" * 100)
    with pytest.raises(DataError, match="over the 0 MB"):
        read_table(small)


def test_a_worker_that_ignores_sigterm_is_killed_with_everything_it_started(tmp_path):
    """stop_process_group: SIGTERM to the group, SIGKILL to all of it after the timeout (Dagster's own Pipes
    client gives up and leaves the child running)."""
    import logging

    from dragon_dagster.resources.launchers.subprocess import stop_process_group

    child_pid = tmp_path / "child.pid"
    code = textwrap.dedent(f"""\
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)       # a worker stuck where it cannot stop
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        open({str(child_pid)!r}, "w").write(str(child.pid))
        time.sleep(600)
        """)
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 30
    while not (child_pid.exists() and child_pid.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(child_pid.read_text())
    started = time.monotonic()
    stop_process_group(proc, timeout_s=1.0, log=logging.getLogger("test"))
    assert time.monotonic() - started < 10 and proc.poll() is not None
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        if Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break  # killed, waiting to be reaped by init
        time.sleep(0.1)
    gone = (
        not Path(f"/proc/{child}").exists()
        or Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    )
    assert gone, "the worker's own child was killed too"
