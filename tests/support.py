"""What the tests share that is not a fixture (fixtures are in conftest.py): the pipeline-YAML builder, a user's
Dagster project, stub OpenAI-compatible servers, free ports, one wait-until helper for anything that comes up
or goes away, the loopback S3 server's buckets, and the browser's settings."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from dragon_dagster.engine.config.reporter import Reporter

TINY_ARGS = (
    "{max_steps: 8, batch_size: 4, grad_accum: 1, logging_steps: 2, save_steps: 4, max_seq_len: 256, "
    "learning_rate: 5.0e-3}"
)


# A test's `mlflow server` without MLflow's job runner: its huey consumers are eight more processes importing MLflow
# (91 -> 55 s to come up on a loaded 2-core machine, half the server's CPU), for server-side jobs (scorers, prompt
# optimisation) that neither the tests nor the project use. The deployment guide's server keeps them, as deployed.
MLFLOW_WITHOUT_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


# conftest.py's mlflow_tables_copied puts here what gives the session's empty MLflow store (its tables migrated once)
EMPTY_MLFLOW_STORE: list[Callable[[], Path]] = []


def seed_mlflow_store(path: Path) -> None:
    """A new sqlite store file at path holding MLflow's tables as MLflow creates them on first use, copied from the
    session's empty store: for a runs directory that processes a test starts (a webserver's runs, a CLI's) open
    first, which would each run MLflow's migrations again (3-5 s of CPU, 10-15 s on a busy machine). A store that
    exists already is left as it is."""
    import sqlite3

    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    [empty] = EMPTY_MLFLOW_STORE
    source, target = sqlite3.connect(empty()), sqlite3.connect(path)
    try:
        source.backup(target)  # sqlite's own copy, page by page
    finally:
        target.close()
        source.close()


# A tools file with one tool, `bump`, whose counter file counts its calls (format with counter=<path>): the tiny
# model is taught to call it (conftest's tool_caller). Calls 2, 5, 8, ... raise and calls 3, 6, 9, ... hang past the
# pipeline's timeout: a rollout goes on from both. COUNTING_BUMP is the same tool (the same schema, so the taught
# model calls it alike) that always answers.
BUMP_TOOLS = '''
import time
from pathlib import Path

COUNTER = Path({counter!r})


def bump() -> str:
    """Add one to the shop's counter and say its value."""
    with COUNTER.open("a") as f:
        f.write("x\\n")
    n = len(COUNTER.read_text().splitlines())
    if n % 3 == 2:
        raise RuntimeError("the counter jammed")
    if n % 3 == 0:
        time.sleep(30)  # past the pipeline's timeout: the call is stopped
    return f"count {{n}}"
'''
COUNTING_BUMP = '''
from pathlib import Path

COUNTER = Path({counter!r})


def bump() -> str:
    """Add one to the shop's counter and say its value."""
    with COUNTER.open("a") as f:
        f.write("x\\n")
    return f"count {{len(COUNTER.read_text().splitlines())}}"
'''


def component_yaml(attributes: str) -> str:
    """A pipeline component's defs.yaml around a pipeline's YAML (its attributes)."""
    return "type: dragon_dagster.PostTrainingPipeline\nattributes:\n" + textwrap.indent(attributes, "  ")


def write_pipeline(
    directory: Path,
    model: Path,
    name: str = "tiny",
    args: str = TINY_ARGS,
    prompt: str = "{subject}\\n\\n{body}",
    data: str = "example:tickets.csv",
) -> Path:
    """defs.yaml of a tiny pipeline component in directory/name; returns its path."""
    path = directory / name / "defs.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        component_yaml(
            textwrap.dedent(f"""\
        name: {name}
        model: {model}
        datasets:
          tickets: {{path: "{data}"}}
        stages:
          - {{name: sft_dataset, kind: chat_dataset, source: tickets, prompt: "{prompt}", response: reply,
              group_by: subject}}
          - {{name: sft_adapter, kind: sft, dataset: sft_dataset, args: {args}, n_samples: 2, max_new_tokens: 8}}
          - {{name: merged_model, kind: merge}}
          - {{name: evaluation_report, kind: evaluate, dataset: sft_dataset, max_new_tokens: 8, n_samples: 2}}
        feedback:
          min_new_records: 3
          sft: {{args: {args}, n_samples: 1, max_new_tokens: 4}}
          dpo: {{args: {args}, n_samples: 1, max_new_tokens: 4}}
          kto: {{args: {args}, n_samples: 1, max_new_tokens: 4}}
          evaluate: {{max_new_tokens: 4, n_samples: 1, skills: []}}  # the general-skills guard: its own tests
          gate: {{taste: [{{type: custom, file: taste.py, name: short}}]}}  # liked_share reported; reward decides
        """)
        )
    )
    (path.parent / "taste.py").write_text(
        "def reward(prompt, completion, reference, row):\n    return 1.0 if len(completion.split()) < 3 else 0.0\n"
    )
    return path


PROJECT_PYPROJECT = """\
[project]
name = "{name}"
version = "0.1.0"
dependencies = ["dragon-dagster"]

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "{name}"
defs_module = "{name}.defs"
code_location_target_module = "{name}.definitions"
code_location_name = "{name}"

[tool.dagster]
module_name = "{name}.definitions"
code_location_name = "{name}"
"""


PROJECT_DEFINITIONS = """\
from pathlib import Path

import dagster as dg

from dragon_dagster.resources import default_resources

defs = dg.Definitions.merge(dg.load_from_defs_folder(path_within_project=Path(__file__).parent),
                            dg.Definitions(resources=default_resources()))
"""


def user_project(root: Path, name: str = "trainlab") -> Path:
    """A Dagster project of a user's, as the README sets one up: pyproject, definitions.py, an empty defs/.
    Returns its defs folder; the project imports with root on PYTHONPATH."""
    (root / name / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PROJECT_PYPROJECT.format(name=name))
    (root / name / "__init__.py").write_text("")
    (root / name / "definitions.py").write_text(PROJECT_DEFINITIONS)
    return root / name / "defs"


def completion(content, model="stub") -> dict:
    return {
        "id": "x",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
    }


class StubServer:
    """A real threaded HTTP server on 127.0.0.1 speaking /v1/chat/completions; `respond(n, body)` scripts it
    and returns (status, dict-or-raw-text). It records every request and the peak number in flight."""

    def __init__(self, respond):
        self.respond, self.requests, self.lock = respond, [], threading.Lock()
        self.in_flight = self.max_in_flight = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with stub.lock:
                    stub.requests.append({"path": self.path, "body": body, "headers": dict(self.headers)})
                    n = len(stub.requests)
                    stub.in_flight += 1
                    stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
                try:
                    status, payload = stub.respond(n, body)
                finally:
                    with stub.lock:
                        stub.in_flight -= 1
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if isinstance(payload, dict) else "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port() -> int:
    return closed_port()


# ------------------------------------------------------------------- the loopback S3 server (conftest's moto_endpoint)


def s3_env(endpoint: str) -> dict[str, str]:
    """The AWS_* environment that points botocore and s3fs at the loopback S3 server (moto takes any keys)."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def s3_client(endpoint: str):
    """A boto3 S3 client on the loopback server, its settings given here, not read from the environment."""
    import boto3

    env = s3_env(endpoint)
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )


def new_bucket(endpoint: str) -> str:
    """A fresh bucket on the loopback server; its name."""
    import uuid

    name = f"art-{uuid.uuid4().hex[:10]}"
    s3_client(endpoint).create_bucket(Bucket=name)
    return name


def bucket_keys(bucket: str, prefix: str = "", endpoint: str | None = None) -> list[str]:
    """The keys under prefix in bucket, sorted; on endpoint, else where the AWS_* environment points."""
    import boto3

    client = s3_client(endpoint) if endpoint else boto3.client("s3")
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


WAIT_MS = 20_000  # generous: two shared CPU cores


def failed_message(outcome_instance, run_id) -> str:
    from dagster import DagsterEventType

    records = outcome_instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_FAILURE).records
    return "\n".join(str(r.event_log_entry.dagster_event.event_specific_data.error) for r in records)


def wait_until(
    ready: Callable[[], object],
    timeout: float,
    what: str,
    alive: Callable[[], str | None] | None = None,
    every: float = 0.25,
):
    """Poll ready() until it returns something truthy (returned), failing after timeout seconds with a message
    naming what was awaited; alive() may say why waiting is pointless (a server's process exited, with its log)."""
    import pytest

    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        gone = alive() if alive else None
        if gone:
            pytest.fail(f"{what}: {gone}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:g} s")
        time.sleep(every)


def healthy(url: str) -> bool:
    """Whether url answers 2xx on loopback (a server's health endpoint)."""
    import requests

    try:
        return requests.get(url, timeout=1).ok
    except requests.RequestException:
        return False


def workers(marker: str) -> list[int]:
    """Live worker processes whose job file path contains marker (the process table, as `ps` shows it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"dragon_dagster.engine.runtime.worker" in cmdline and marker.encode() in cmdline and _alive(int(pid)):
            found.append(int(pid))
    return found


def launcher_of(worker: int) -> int:
    """The process that launched a worker (the Dagster step): its parent, or the pid a worker forked by the warm
    worker names in its title."""
    title = Path(f"/proc/{worker}/cmdline").read_bytes().decode(errors="replace")
    if "[warm, for pid " in title:
        return int(title.split("[warm, for pid ", 1)[1].split("]", 1)[0])
    return int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    from dragon_dagster.engine.runtime.worker import alive

    return alive(pid)


def ticket_files(tmp_path: Path, n: int | None = None) -> tuple[Path, Path]:
    """The bundled tickets as SFT rows, split, written as train.jsonl and eval.jsonl into tmp_path."""
    from dragon_dagster.engine.data import holdout, row_mapping, tables
    from dragon_dagster.engine.pipeline.definition import EXAMPLE_DIR

    rows = row_mapping.map_rows(
        tables.read_table(EXAMPLE_DIR / "tickets.csv"),
        row_mapping.Mapping(prompt="{subject}\n\n{body}", response="reply"),
    )[:n]
    train, held = holdout.split_rows(rows)
    tables.write_jsonl(tmp_path / "train.jsonl", train)
    tables.write_jsonl(tmp_path / "eval.jsonl", held)
    return tmp_path / "train.jsonl", tmp_path / "eval.jsonl"


def sft_job(tmp_path, model, train, held, speed: dict | None = None, **args):
    """A typed SFT job on the tiny model: a few steps on CPU, checkpoints under tmp_path/ckpt, output tmp_path/out."""
    from dragon_dagster.engine import catalog
    from dragon_dagster.engine.config.hardware import Hardware, Speed
    from dragon_dagster.engine.config.job import TrainingInputs
    from dragon_dagster.engine.stages.sft.settings import SFT

    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    settings = {
        "max_steps": 4,
        "batch_size": 2,
        "grad_accum": 1,
        "logging_steps": 1,
        "save_steps": 2,
        "max_seq_len": 128,
        "learning_rate": 5e-3,
        **args,
    }
    stage = SFT(name="sft_adapter", kind="sft", dataset="tickets", args=settings, n_samples=2, max_new_tokens=4)
    return catalog.get("sft").job_model()(
        settings=stage,
        inputs=TrainingInputs(
            model=str(model), train_file=str(train), eval_file=str(held), checkpoint_dir=str(tmp_path / "ckpt")
        ),
        output_dir=str(out),
        hardware=Hardware(device="cpu"),
        speed=Speed(**(speed or {})),
    )


def on_a_command_line(secret: str) -> list[str]:
    """The command lines of this machine's processes that hold `secret` (a password must travel in the environment:
    every user can read a command line)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if secret.encode() in line:
            found.append(line.replace(b"\0", b" ").decode(errors="replace"))
    return found


def apt_install(package: str) -> str:
    """Install a Debian package with apt-get (refreshing stale package lists once); "" when it went in, else what
    apt-get said (the caller checks for the files it needs either way)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "--no-install-recommends", package]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:  # stale or missing package lists: refresh once and retry
        subprocess.run(["apt-get", "update"], capture_output=True, text=True, env=env)
        done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode == 0:
        return ""
    return f"apt-get install {package} failed (rc {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


def forget_modules(names, folder) -> None:
    """Drops from sys.modules those of `names` imported from under `folder`. All are picked before any goes: a
    namespace package's __path__ is recomputed from its parent's entry in sys.modules, so reading it after the
    parent went raises KeyError."""
    folder = str(folder) + os.sep

    def imported_from_folder(module) -> bool:
        origin = getattr(module, "__file__", None)
        if origin is None:
            spec = getattr(module, "__spec__", None)
            origin = next(iter((spec and spec.submodule_search_locations) or []), "")
        return str(origin).startswith(folder)

    for name in [name for name in names if imported_from_folder(sys.modules.get(name))]:
        sys.modules.pop(name, None)


# The shape of the tests' small random decoders (any Llama-like config takes it): two layers, grouped-query attention.
SMALL_DECODER = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def small_lora_model(vocab: int = 300, seed: int = 0, dropout: float = 0.0, kind: str = "llama"):
    """A random two-layer decoder of `kind` (Llama, or Qwen2 with its q/k/v biases made nonzero) under a LoRA on
    every linear layer whose B is not zero, so the adapter counts; in train mode, as PEFT returns it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    shape = dict(SMALL_DECODER, vocab_size=vocab)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**shape))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**shape, use_sliding_window=False))
        for layer in model.model.layers:  # Qwen2 starts its q/k/v biases at zero
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=dropout))
    for name, param in model.named_parameters():  # LoRA B starts at zero; make the adapter matter
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)
    return model


class Recorded(Reporter):
    """A reporter that keeps the lines a worker logs, for a test to read."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def log(self, message: str) -> None:
        self.lines.append(message)
