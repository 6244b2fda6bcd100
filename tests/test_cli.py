"""The `dragon` command against a materialized chain: runs, compare (from MLflow), generate."""

import json
import subprocess
import sys

from click.testing import CliRunner

from dragon_dagster.cli import main


def run_cli(args, runs_dir, monkeypatch):
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(runs_dir))
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_runs_lists_artifact_dirs(materialized, monkeypatch):
    out = run_cli(["runs", "--pipeline", "tiny"], materialized["runs"], monkeypatch)
    assert out.exit_code == 0
    for stage in ("tickets", "sft_dataset", "sft_adapter", "merged_model", "evaluation_report"):
        assert f"tiny/{stage}" in out.output


def test_compare_reads_every_run_from_mlflow(materialized, monkeypatch):
    out = run_cli(["compare", "--pipeline", "tiny", "--json"], materialized["runs"], monkeypatch)
    rows = {r["run"]: r for r in json.loads(out.output)}
    assert {"sft_adapter", "base", "evaluation_report"} <= set(rows)
    assert rows["evaluation_report"]["eval/loss"] < rows["base"]["eval/loss"]
    assert rows["evaluation_report"]["upstream"] == rows["sft_adapter"]["run_id"][:8]
    table = run_cli(["compare", "--pipeline", "tiny"], materialized["runs"], monkeypatch)
    assert "eval/loss" in table.output and "base" in table.output


def test_generate_from_an_asset_an_artifact_dir_and_the_base(materialized, monkeypatch):
    out = run_cli(["generate", "tiny/sft_adapter", "My plug is offline", "--max-new-tokens", "4"],
                  materialized["runs"], monkeypatch)
    assert out.exit_code == 0 and "1 adapter(s)" in out.output and "> My plug is offline" in out.output
    merged = materialized["outcome"]["artifacts"]["merged_model"]
    out = run_cli(["generate", merged, "Hello", "--max-new-tokens", "4"], materialized["runs"], monkeypatch)
    assert out.exit_code == 0 and "merged model" in out.output
    out = run_cli(["generate", merged, "Hello", "--base", "--max-new-tokens", "4"], materialized["runs"], monkeypatch)
    assert out.exit_code == 0 and "base model" in out.output
    bad = CliRunner().invoke(main, ["generate", "tiny/nothing", "hi"])
    assert bad.exit_code != 0 and "neither a directory nor a materialized asset" in bad.output


def test_presets_and_help_run_as_a_console_script():
    out = subprocess.run([sys.executable, "-m", "dragon_dagster.cli", "presets"], capture_output=True, text=True)
    assert out.returncode == 0 and "smollm2-135m" in out.stdout


def test_serve_answers_over_the_openai_protocol(materialized, tmp_path):
    import os
    import signal
    import time

    import requests

    from dragon_dagster.engine.infer.backends import ServerBackend

    from .conftest import closed_port

    port = closed_port()
    adapter = materialized["outcome"]["artifacts"]["sft_adapter"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DRAGON_MODEL_CACHE": str(tmp_path / "cache")}
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "dragon_dagster.cli", "serve", adapter, "--port", str(port),
                             "--device", "cpu"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok:
                    break
            except requests.RequestException:
                time.sleep(0.5)
        served = next((tmp_path / "cache" / "served").iterdir())
        assert (served / "config.json").exists(), "the adapter was merged into a cached model dir"
        replies = ServerBackend(f"http://127.0.0.1:{port}/v1", str(served), timeout=60).chat(
            [[{"role": "user", "content": "My plug is offline"}]], max_new_tokens=3)
        assert len(replies) == 1 and isinstance(replies[0], str)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
