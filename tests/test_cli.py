"""The `dragon` command against a materialized chain: runs, compare (from MLflow), generate; demo in a user's
project; one-line errors; the job files artifacts keep."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import requests
from click.testing import CliRunner

from dragon_dagster.cli import main
from tests.support import component_yaml, user_project

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]  # the dragon_dagster under test, whatever the environment installed


def run_cli(args, runs_dir, monkeypatch):
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(runs_dir))
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_runs_lists_artifact_dirs(materialized, monkeypatch):
    out = run_cli(["runs", "--pipeline", "tiny"], materialized["runs"], monkeypatch)
    assert out.exit_code == 0
    assert out.output.splitlines()[0].split() == ["asset", "kind", "created", "mlflow", "run", "directory"]
    for stage in ("tickets", "sft_dataset", "sft_adapter", "merged_model", "evaluation_report"):
        assert f"tiny/{stage}" in out.output


def test_compare_reads_every_run_from_mlflow(materialized, monkeypatch):
    out = run_cli(["compare", "--pipeline", "tiny", "--json"], materialized["runs"], monkeypatch)
    rows = {r["run"]: r for r in json.loads(out.output)}
    assert {"sft_adapter", "base", "evaluation_report"} <= set(rows)
    assert rows["evaluation_report"]["eval/loss"] < rows["base"]["eval/loss"]
    assert rows["evaluation_report"]["upstream"] == rows["sft_adapter"]["run_id"][:8]
    assert rows["sft_adapter"]["headline"].startswith("perplexity ") and "token_f1" in rows["sft_adapter"]["headline"]
    table = run_cli(["compare", "--pipeline", "tiny"], materialized["runs"], monkeypatch)
    assert "eval/loss" in table.output and "headline" in table.output and "base" in table.output


def test_compare_fills_grpo_and_dpo_rows_with_their_own_figures(tmp_path):
    """A GRPO run logs rewards and no eval/loss, a DPO run preference accuracy: each row shows them."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("fake", artifact_location=str(tmp_path / "artifacts"))
    logged = {
        "grpo_adapter": {
            "train/reward": [0.1, 0.3],
            "train/kl": [0.0, 0.02],
            "train/loss": [0.0, 0.0],
            "eval/reward_before": [0.125],
            "eval/reward": [0.5],
            "eval/reward_numeric": [0.25],
            "eval/reward_length": [0.75],
        },
        "dpo_adapter": {
            "train/loss": [0.69, 0.6],
            "eval/pref_accuracy": [0.8],
            "eval/reward_margin": [0.31],
            "eval/dpo_loss": [0.58],
        },
    }  # the DPO objective, not an NLL: no eval/loss
    for stage, metrics in logged.items():
        run = client.create_run(
            experiment, run_name=stage, tags={"stage": stage, "method": stage.split("_")[0], "pipeline": "fake"}
        )
        for name, values in metrics.items():
            for step, value in enumerate(values):
                client.log_metric(run.info.run_id, name, value, step=step)
        client.set_terminated(run.info.run_id)
    out = CliRunner().invoke(
        main, ["compare", "--pipeline", "fake", "--tracking-uri", uri, "--json"], catch_exceptions=False
    )
    rows = {r["run"]: r for r in json.loads(out.output)}
    grpo, dpo = rows["grpo_adapter"], rows["dpo_adapter"]
    assert grpo["stage"] == "grpo_adapter" and grpo["method"] == "grpo" and "eval/loss" not in grpo
    assert grpo["eval/reward"] == 0.5 and grpo["train/reward"] == 0.3  # the last training step's
    assert grpo["headline"] == "reward 0.125 -> 0.5 (length 0.75, numeric 0.25), train reward 0.3, kl 0.02"
    assert dpo["headline"] == "pref_accuracy 0.8, reward_margin 0.31, dpo_loss 0.58" and dpo["eval/dpo_loss"] == 0.58
    assert "eval/loss" not in dpo  # nothing puts a DPO loss in the column of the stages' reply NLL
    table = CliRunner().invoke(main, ["compare", "--pipeline", "fake", "--tracking-uri", uri], catch_exceptions=False)
    grpo_line = next(line for line in table.output.splitlines() if "grpo_adapter" in line)
    assert "reward 0.125 -> 0.5" in grpo_line and "FINISHED" in grpo_line
    dpo_line = next(line for line in table.output.splitlines() if "dpo_adapter" in line)
    assert "pref_accuracy 0.8" in dpo_line and "0.58" in dpo_line


def test_generate_from_an_asset_an_artifact_dir_and_the_base(materialized, monkeypatch):
    out = run_cli(
        ["generate", "tiny/sft_adapter", "My plug is offline", "--max-new-tokens", "4"],
        materialized["runs"],
        monkeypatch,
    )
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
    import signal

    from dragon_dagster.engine.infer.server_backend import ServerBackend
    from tests.support import closed_port, healthy, wait_until

    port = closed_port()
    adapter = materialized["outcome"]["artifacts"]["sft_adapter"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DRAGON_MODEL_CACHE": str(tmp_path / "cache")}
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dragon_dagster.cli",
            "serve",
            adapter,
            "--port",
            str(port),
            "--device",
            "cpu",
            "--no-trace",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def exited() -> str | None:
            code = proc.poll()
            return None if code is None else f"exited with {code}:\n{(tmp_path / 'serve.log').read_text()[-2000:]}"

        wait_until(lambda: healthy(f"http://127.0.0.1:{port}/health"), 120, "dragon serve to answer", alive=exited)
        served = next((tmp_path / "cache" / "served").iterdir())
        assert (served / "config.json").exists(), "the adapter was merged into a cached model dir"
        [name] = [m["id"] for m in requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"]]
        assert name == Path(adapter).parents[1].name, "served under its pipeline's name"
        replies = ServerBackend(f"http://127.0.0.1:{port}/v1", name, timeout=60).chat(
            [[{"role": "user", "content": "My plug is offline"}]], max_new_tokens=3
        )
        assert len(replies) == 1 and isinstance(replies[0], str)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def test_errors_print_one_line_without_a_traceback_unless_debugging(monkeypatch, tmp_path):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.delenv("DRAGON_DEBUG", raising=False)
    args = ["demo", "--pipeline", "nope", "--defs-module", "dragon_dagster.definitions"]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit)
    assert out.stderr.strip().splitlines() == [
        "Error: no pipeline named 'nope' in the loaded definitions; found ['orders', 'support', 'support_distill']"
    ]
    assert "Traceback" not in out.output
    bad = CliRunner().invoke(main, ["generate", "tiny/nothing", "hi"])  # a click error raised in a command body
    assert bad.exit_code == 1 and len(bad.stderr.strip().splitlines()) == 1 and "Usage" not in bad.output
    missing = CliRunner().invoke(main, ["generate"])  # a usage error
    assert missing.exit_code == 1 and missing.stderr.strip() == "Error: dragon generate: Missing argument 'TARGET'."
    for debug in (["--debug", *args], args):  # the traceback when asked for
        env = {"DRAGON_DEBUG": "1"} if debug is args else {}
        shown = CliRunner().invoke(main, debug, env=env)
        assert isinstance(shown.exception, ValueError) and "no pipeline named 'nope'" in str(shown.exception)


def test_demo_runs_a_pipeline_without_a_quick_profile_and_says_so(tmp_path):
    project = tmp_path / "project"
    defs = user_project(project)
    (defs / "plain").mkdir()
    (defs / "plain" / "defs.yaml").write_text(
        component_yaml(
            textwrap.dedent("""\
        name: plain
        datasets:
          tickets: {path: "example:tickets.csv"}
        stages:
          - {name: sft_dataset, kind: chat_dataset, source: tickets, prompt: "{subject}", response: reply}
        """)
        )
    )
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path / "home"),
        "DRAGON_RUNS_DIR": str(tmp_path / "runs"),
        "PYTHONPATH": str(project),
        "HF_HUB_OFFLINE": "1",
        "MLFLOW_PORT": "5077",  # `make ui MLFLOW_PORT=5077 DAGSTER_PORT=3077`: the printed links follow
        "DAGSTER_PORT": "3077",
    }
    for name in ("DRAGON_DEBUG", "MLFLOW_UI_URL", "DAGSTER_UI_URL"):
        env.pop(name, None)
    demo = subprocess.run(
        [str(BIN / "dragon"), "demo", "--pipeline", "plain", "--defs-module", "trainlab.definitions"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert (
        "pipeline 'plain' has no profile 'quick' (it has none): running without a profile" in demo.stderr.splitlines()
    )
    assert "profile none" in demo.stdout and "plain/sft_dataset" in demo.stdout
    assert "models:/plain@champion: none yet" in demo.stdout  # no merge in this pipeline: nothing registered
    assert "http://127.0.0.1:5077/#/experiments/" in demo.stdout and "/traces" in demo.stdout  # where chat turns show
    assert "Dagster http://127.0.0.1:3077, MLflow http://127.0.0.1:5077" in demo.stdout
    run_id = re.search(r"Dagster run ([0-9a-f-]{36})", demo.stdout).group(1)  # and its own page, which lists it
    assert f"in Dagster: http://127.0.0.1:3077/runs/{run_id}" in demo.stdout
    assert ":5000" not in demo.stdout
    assert "evaluation-runs" not in demo.stdout and "/#/prompts/" not in demo.stdout  # it evaluates nothing, has none
    assert list((tmp_path / "runs" / "artifacts" / "plain" / "sft_dataset").glob("*/train.jsonl"))
    assert "reused" not in demo.stdout

    def dragon(*args):
        return subprocess.run(
            [str(BIN / "dragon"), *args], cwd=project, env=env, capture_output=True, text=True, timeout=600
        )

    # nothing changed: a second run makes nothing and says so; `dragon status` has every stage up to date
    again = dragon("demo", "--pipeline", "plain", "--defs-module", "trainlab.definitions")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"reused (run {run_id[:8]})" in again.stdout and "so nothing was trained" in again.stdout
    status = dragon("status", "plain", "--defs-module", "trainlab.definitions")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "every stage is up to date" in status.stdout
    fresh = dragon("demo", "--pipeline", "plain", "--defs-module", "trainlab.definitions", "--fresh")
    assert fresh.returncode == 0 and "reused" not in fresh.stdout, fresh.stdout[-3000:]
    assert len(list((tmp_path / "runs" / "artifacts" / "plain" / "sft_dataset").glob("*/train.jsonl"))) == 2
    missing = subprocess.run(
        [str(BIN / "dragon"), "demo", "--pipeline", "nope"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines() == [
        "Error: no pipeline named 'nope' in the loaded definitions; found ['plain']"
    ]


STAGE_LINE = re.compile(r"^(… |✓ |✗ )")
STEP_LINE = re.compile(r"small__sft_adapter - step (\d+)/6 loss ")


def test_the_demo_says_a_line_per_stage_and_verbose_brings_each_step_back(tiny_model, tmp_path):
    """`make demo`'s terminal on the smallest training pipeline: not a terminal here (captured, as `make demo >
    log` is), so a line per stage as it starts and one as it ends, then the table and the closing lines; no
    training step's line. The same bounds on the demo's ten stages: 2 x 10 + the table's 15 + 10 closing lines,
    with room left under 60 for its report's and GGUF files' lines. --verbose brings back every step's line (the
    event log and MLflow have them either way: tests/assets/test_materialize.py)."""
    project = tmp_path / "project"
    defs = user_project(project)
    (defs / "small").mkdir()

    def write(steps: int) -> None:
        args = f"{{max_steps: {steps}, batch_size: 4, grad_accum: 1, logging_steps: 2, max_seq_len: 128}}"
        (defs / "small" / "defs.yaml").write_text(
            component_yaml(
                textwrap.dedent(f"""\
            name: small
            model: {tiny_model}
            datasets:
              tickets: {{path: "example:tickets.csv"}}
            stages:
              - {{name: sft_dataset, kind: chat_dataset, source: tickets, prompt: "{{subject}}", response: reply,
                 group_by: subject}}
              - {{name: sft_adapter, kind: sft, dataset: sft_dataset, args: {args}, n_samples: 1, max_new_tokens: 4}}
            """)
            )
        )

    write(steps=4)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path / "home"),
        "DRAGON_RUNS_DIR": str(tmp_path / "runs"),
        "PYTHONPATH": str(project),
        "HF_HUB_OFFLINE": "1",
    }
    for name in ("DRAGON_DEBUG", "DRAGON_LOG_LEVEL"):
        env.pop(name, None)

    def demo(*flags) -> list[str]:
        done = subprocess.run(
            [str(BIN / "dragon"), "demo", "--pipeline", "small", "--defs-module", "trainlab.definitions", *flags],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stderr.splitlines() + done.stdout.splitlines()

    quiet = demo()
    stages = ["small/tickets", "small/sft_dataset", "small/sft_adapter"]
    said = [line for line in quiet if STAGE_LINE.match(line)]
    assert [line.split()[1] for line in said] == [name for name in stages for _ in (0, 1)], quiet
    assert re.fullmatch(r"✓ small/sft_adapter  \d+\.\d s  new  train loss [\d.]+, held-out loss .+", said[5]), said
    assert not [line for line in quiet if " - step " in line or "STEP_START" in line or "%|" in line], quiet
    table = [line for line in quiet if line.startswith(("│", "┏", "┃", "┡", "└")) or "pipeline, profile" in line]
    assert len(table) == len(stages) + 5, quiet
    closing = len(quiet) - len(said) - len(table)
    assert closing <= 10, quiet  # the profile notice, the total, the registry, the UIs' links

    write(steps=6)  # the adapter is trained again, the datasets are reused
    verbose = demo("--verbose")
    assert {2, 4, 6} <= {int(m.group(1)) for line in verbose if (m := STEP_LINE.search(line))}, verbose
    said = [line for line in verbose if STAGE_LINE.match(line)]
    assert [line.split()[1] for line in said] == [name for name in stages for _ in (0, 1)], verbose
    assert "  reused (run " in said[1] and "  reused (run " in said[3] and "  new  " in said[5], said


def test_demo_prints_why_a_check_failed_and_what_fixes_it(tmp_path):
    """A held-out split that leaks (ten customers ask each of four questions and get the same reply; no group_by,
    so rows are split by prompt and held-out replies appear in train): the demo prints the check's verdict with its
    reason and the settings that fix it, the same text the check result carries in Dagster."""
    from dagster import AssetCheckKey, AssetKey, DagsterInstance

    project = tmp_path / "project"
    defs = user_project(project)
    (defs / "leaky").mkdir()
    rows = [
        f"Customer {n} here: how do I reset my {device}?,Hold the {device}'s button for ten seconds."
        for device in ("Doorbell Cam", "Thermostat", "Smart Plug", "Hub")
        for n in range(10)
    ]
    (tmp_path / "questions.csv").write_text("question,reply\n" + "\n".join(rows) + "\n")
    (defs / "leaky" / "defs.yaml").write_text(
        component_yaml(
            textwrap.dedent(f"""\
        name: leaky
        datasets:
          questions: {{path: "{tmp_path / "questions.csv"}"}}
        stages:
          - {{name: sft_dataset, kind: chat_dataset, source: questions, prompt: "{{question}}", response: reply,
             eval_frac: 0.2, seed: 1}}
        """)
        )
    )
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path / "home"),
        "DRAGON_RUNS_DIR": str(tmp_path / "runs"),
        "PYTHONPATH": os.pathsep.join([str(project), str(REPO)]),
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("DRAGON_DEBUG", None)
    demo = subprocess.run(
        [str(BIN / "dragon"), "demo", "--pipeline", "leaky", "--defs-module", "trainlab.definitions"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 1, demo.stdout[-3000:] + demo.stderr[-3000:]  # a failed blocking check fails the run
    lines = [
        line for line in demo.stdout.splitlines() if line.startswith("check leaky/sft_dataset held_out_not_leaking")
    ]
    assert len(lines) == 1, demo.stdout[-3000:]
    _, _, why = lines[0].partition(": ")
    assert why.startswith("FAILED - "), lines[0]
    reason = why.removeprefix("FAILED - ")
    assert re.search(
        r"\d+% of the held-out rows have a prompt that also appears in train .* and \d+% an answer", reason
    )
    assert "group_by" in reason and "allow_leakage: true" in reason  # the settings that fix it
    # a pass says no more than the table's count: the checks column of the stage's row
    [row] = [line for line in demo.stdout.splitlines() if "│ leaky/sft_dataset " in line]
    assert "2 passed, held_out_not_leaking FAILED" in row, row
    assert not [line for line in demo.stdout.splitlines() if line.startswith("check ") and ": passed" in line]
    with DagsterInstance.from_config(str(tmp_path / "home")) as instance:  # what the UI shows with the check
        key = AssetCheckKey(AssetKey(["leaky", "sft_dataset"]), "held_out_not_leaking")
        (record,) = instance.event_log_storage.get_asset_check_execution_history(key, limit=1)
        evaluation = record.event.dagster_event.event_specific_data
        assert not evaluation.passed and " ".join(evaluation.description.split()) == reason


def test_a_finished_artifact_s_job_file_names_it_relatively_and_runs_again(materialized, tmp_path):
    """job.json is written in the staging dir, renamed when complete: it names its own files relatively, and
    resolved against the artifact dir it is what the worker runs."""
    from dragon_dagster.engine.config.job import absolute_paths
    from dragon_dagster.engine.runtime.execution import load_job

    art = {k: Path(v) for k, v in materialized["outcome"]["artifacts"].items()}
    for name in ("sft_adapter", "merged_model", "evaluation_report"):
        text = (art[name] / "job.json").read_text()
        assert ".tmp-" not in text, name
        written = json.loads(text)
        assert written["output_dir"] == ".", name
        job, _ = load_job(written)  # a job the worker can run
        resolved = absolute_paths(job, art[name])
        assert resolved.output_dir == str(art[name].resolve())
    sft = json.loads((art["sft_adapter"] / "job.json").read_text())
    assert sft["inputs"]["train_file"] == "./data/train.jsonl" and sft["inputs"]["eval_file"] == "./data/eval.jsonl"
    resolved = absolute_paths(load_job(sft)[0], art["sft_adapter"])
    assert Path(resolved.inputs.train_file).read_text() == (art["sft_dataset"] / "train.jsonl").read_text()
    assert Path(resolved.inputs.checkpoint_dir).is_absolute()  # outside the artifact: unchanged

    # the merge's job file, resolved and pointed at a new output dir, runs through the worker again
    merge, _ = load_job(json.loads((art["merged_model"] / "job.json").read_text()))
    job = absolute_paths(merge, art["merged_model"]).model_copy(update={"output_dir": str(tmp_path / "again")})
    (tmp_path / "again").mkdir()
    (tmp_path / "job.json").write_text(job.model_dump_json())
    ran = subprocess.run(
        [sys.executable, "-m", "dragon_dagster.engine.runtime.worker", str(tmp_path / "job.json")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (tmp_path / "again" / "model" / "config.json").exists()


def test_chat_defaults_to_the_pipeline_s_system_prompt_and_the_whole_conversation(monkeypatch, tmp_path):
    """`dragon chat` and `dragon chat-ui` send the system prompt every training row carries unless --system says
    otherwise ('' for none), and every earlier exchange unless --context-turns limits them."""
    import dragon_dagster
    from dragon_dagster import chat_ui
    from dragon_dagster import terminal_chat as chat_module
    from dragon_dagster.engine.pipeline import load

    trained = load(Path(dragon_dagster.__file__).parent / "defs" / "support" / "defs.yaml").system_prompt()
    assert trained  # the bundled pipeline trains with a fixed system prompt
    chats, pages = [], []
    monkeypatch.setattr(chat_module, "run_terminal", lambda chat: chats.append(chat))
    monkeypatch.setattr(chat_ui, "launch", lambda *a, **kw: pages.append(kw))
    server = ["--model", "http://127.0.0.1:9/v1"]

    def chat(*args):
        out = run_cli(["chat", *server, *args], tmp_path, monkeypatch)
        assert out.exit_code == 0, out.output
        return chats[-1]

    default = chat()
    assert (default.system, default.context_turns) == (trained, None)
    said = " ".join(run_cli(["chat", *server], tmp_path, monkeypatch).output.split())
    assert f"system prompt: {trained!r}" in said and "context: all earlier exchanges" in said
    assert chat("--system", "Talk like a pirate.").system == "Talk like a pirate."
    assert chat("--system", "").system is None  # explicitly none
    assert chat("--context-turns", "0").context_turns == 0  # explicitly no earlier exchange
    assert chat("--pipeline", "no_such_pipeline").system is None  # any model can be chatted with: no prompt
    assert run_cli(["chat", *server, "--context-turns", "-1"], tmp_path, monkeypatch).exit_code != 0

    assert run_cli(["chat-ui", *server], tmp_path, monkeypatch).exit_code == 0
    assert (pages[-1]["system"], pages[-1]["context_turns"]) == (trained, None)
    assert run_cli(["chat-ui", *server, "--system", "Be brief."], tmp_path, monkeypatch).exit_code == 0
    assert pages[-1]["system"] == "Be brief."


def test_the_demo_links_the_reports_evaluation_with_both_runs_selected(tmp_path):
    """The link `dragon demo` prints for "base and merged side by side" is the report's own (merged selected,
    compared to base: test_mlflow_evaluation.py opens it in a browser), not the bare Evaluations tab."""
    from dragon_dagster.cli import evaluation_link

    url = "http://127.0.0.1:5000/#/experiments/1/evaluation-runs?selectedRunUuid=m&compareToRunUuid=b"
    (tmp_path / "report.json").write_text(json.dumps({"mlflow_evaluation": {"url": url}}))
    assert evaluation_link(str(tmp_path)) == url
    (tmp_path / "report.json").write_text(json.dumps({"mlflow_evaluation": {"error": "server down"}}))
    assert evaluation_link(str(tmp_path)) is None and evaluation_link(None) is None
    assert evaluation_link(str(tmp_path / "gone")) is None


def test_links_follow_the_configured_ui_ports(monkeypatch):
    from dragon_dagster.resources.tracking import MLflowTracking, dagster_ui_url

    for name in ("MLFLOW_UI_URL", "DAGSTER_UI_URL", "MLFLOW_PORT", "DAGSTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert MLflowTracking().ui == "http://127.0.0.1:5000" and dagster_ui_url() == "http://127.0.0.1:3000"
    monkeypatch.setenv("MLFLOW_PORT", "5001")
    monkeypatch.setenv("DAGSTER_PORT", "3001")
    assert MLflowTracking().ui == "http://127.0.0.1:5001" and dagster_ui_url() == "http://127.0.0.1:3001"
    monkeypatch.setenv("MLFLOW_UI_URL", "https://mlflow.example/")
    assert MLflowTracking().ui == "https://mlflow.example"
    assert MLflowTracking(ui_url="http://h:9/").ui == "http://h:9" and "h:9/#/prompts/" in MLflowTracking(
        ui_url="http://h:9"
    ).prompt_url("support")
