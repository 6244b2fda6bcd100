"""Does the feedback loop learn? A simulated user chats with the live model, rates and edits, the sensor retrains.

A scripted user with a clear, checkable taste (`liked`: the reply names the ticket's product, case-blind, and
is under 60 words) talks to the real chat API (`Chat`) about support tickets from the bundled tickets.csv: one
conversation per ticket, with the pipeline's system prompt. It rates every reply (up when the taste holds, else
down) and edits a disliked reply, with probability --edit-prob, into a short reply in its taste (the ticket's
reference reply cut to two sentences, naming the product). The feedback goes to the pipeline's FeedbackStore;
then the pipeline's feedback sensor is evaluated against a real Dagster instance, and the retraining it requests
runs through Dagster (the `<pipeline>_retrain_from_feedback` job's selection, with the promotion gate as a
blocking asset check), as in tests/test_feedback_loop.py. Each round measures the share of greedy replies the
user would like on held-out tickets (subjects never chatted about nor trained on) from the champion before the
retraining and after it (or from the rejected challenger, for information, when the gate said no), with an exact
McNemar test on the paired held-out prompts.

Then the objectives are compared on the same feedback (round 1's records): each variant of `feedback.objectives`
(--variants, e.g. "sft" "sft,dpo" "sft,dpo,kto") retrains from the same first champion in its own runs folder and
Dagster instance, and its held-out liked share and gate decision are reported. A variant equal to the main
pipeline's objectives reuses round 1.

    .venv/bin/python benchmarks/feedback_learning.py --quick          # smoke run, ~10 min on 2 shared cores
    .venv/bin/python benchmarks/feedback_learning.py                  # 2 rounds x 32 prompts, 48 held out (>1 h)
    .venv/bin/python benchmarks/feedback_learning.py --rounds 3 --variants sft sft,dpo sft,dpo,kto
    # RLHF against the existing objectives on the same records, paired (vs_main):
    .venv/bin/python benchmarks/feedback_learning.py --rounds 1 --variants sft,dpo,kto,rlhf
    # the objectives alone, on a round's recorded feedback (<out>/round1_feedback.sqlite) and first model:
    .venv/bin/python benchmarks/feedback_learning.py --from-feedback F.sqlite --first-model M --variants sft sft,dpo
    # the loop over the wire: the user talks to `dragon serve` and rates over HTTP, the server swaps by itself
    .venv/bin/python benchmarks/feedback_learning.py --quick --over-http --chat-prompts 24 --max-steps -1

With --over-http the benchmark starts `dragon serve <pipeline> --watch 2` on its own runs folder and registry (a
process of its own, stopped at the end, on error too; its log is <out>/serve.log). Each conversation is one
completion asked through the official `openai` client (model=<pipeline>, the chat temperature) and rated with POST
/v1/feedback (an edit is a dislike with the corrected reply: one record per completion, where the in-process
Chat stores the dislike and the edit as two). The sensor reads those records; after a promotion the benchmark
polls GET /health until the server names the new champion's version (--swap-timeout), then asks one greedy reply
that must come from it, and the held-out tickets are also answered through the server (`over_http` in the
record: the versions that answered, when the swap was seen, each round's wall time). The objective comparison
(--variants) stays in-process and runs only when asked.

On 2 shared CPU cores a chat round of 24 tickets takes ~8 min, a retraining ~4-6 min and a held-out
measurement of 48 greedy replies 2-5 min.

The starting model is the embedded SmolLM2-135M-Instruct after a one-step, near-zero-learning-rate SFT (so the
pipeline has a merged model to deploy while its behaviour stays the embedded model's). Log lines go to stderr;
stdout carries only the JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import re
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT / "dragon_dagster" / "example_data" / "tickets.csv"
SYSTEM = "You are a concise, warm support agent for a smart-home company."
NAME = "fbloop"
MAX_WORDS = 60
TASTE = f"liked <=> the reply names the ticket's product (case-insensitive) and has fewer than {MAX_WORDS} words"

DEFAULTS = dict(
    rounds=2,
    chat_prompts=32,
    held_out=48,
    edit_prob=0.5,
    max_new_tokens=96,
    chat_temperature=0.7,
    sft_epochs=3,
    sft_lr=2e-4,
    dpo_epochs=1,
    dpo_lr=5e-5,
    max_seq_len=320,
    max_steps=-1,
    eval_rows=8,
    variants=["sft", "sft,dpo", "sft,dpo,kto"],
)
QUICK = dict(rounds=1, chat_prompts=6, held_out=8, max_new_tokens=48, max_steps=2, eval_rows=4, variants=["sft"])


def log(message: str) -> None:
    print(f"[feedback_learning {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def liked(reply: str, product: str) -> bool:
    """The simulated user's taste: the reply names the ticket's product and stays under MAX_WORDS words."""
    return product.lower() in reply.lower() and len(reply.split()) < MAX_WORDS


def edit_text(ticket: dict) -> str:
    """The user's edit: the ticket's reference reply cut to two sentences, naming the product (in the taste)."""
    sentences = re.split(r"(?<=[.!?])\s+", ticket["reply"].strip())
    text = " ".join(sentences[:2])
    if ticket["product"].lower() not in text.lower():
        text = f"About your {ticket['product']}: {text}"
    words = text.split()
    if len(words) >= MAX_WORDS:
        text = " ".join(words[: MAX_WORDS - 1])
    assert liked(text, ticket["product"]), text
    return text


def prompt_of(ticket: dict) -> str:
    return f"{ticket['subject']}\n\n{ticket['body']}"


def mcnemar(before: list[bool], after: list[bool]) -> dict:
    """Exact McNemar test on paired outcomes: a two-sided binomial test on the discordant pairs."""
    gained = sum(1 for b, a in zip(before, after) if a and not b)
    lost = sum(1 for b, a in zip(before, after) if b and not a)
    n = gained + lost
    p = 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2**n)
    return {"gained": gained, "lost": lost, "p": float(f"{p:.3g}")}


def split(seed: int, held_out: int) -> tuple[list[dict], list[dict]]:
    """(chat pool, held-out tickets): whole subjects held out, so no held-out subject is chatted about."""
    rows = list(csv.DictReader(DATA.open()))
    subjects = sorted({r["subject"] for r in rows})
    rng = random.Random(seed)
    rng.shuffle(subjects)
    held_subjects: set[str] = set()
    for subject in subjects:
        if sum(r["subject"] in held_subjects for r in rows) >= held_out:
            break
        held_subjects.add(subject)
    held = [r for r in rows if r["subject"] in held_subjects]
    pool = [r for r in rows if r["subject"] not in held_subjects]
    rng.shuffle(held)
    rng.shuffle(pool)
    return pool, held[:held_out]


def pipeline_yaml(directory: Path, objectives: list[str], a: argparse.Namespace, train_csv: Path) -> Path:
    import yaml

    steps = {"max_steps": a.max_steps} if a.max_steps and a.max_steps > 0 else {}
    common = {
        "batch_size": 4,
        "grad_accum": 1,
        "max_seq_len": a.max_seq_len,
        "logging_steps": 1,
        "save_steps": 10_000,
        "seed": a.seed,
        **steps,
    }
    attributes = {
        "name": NAME,
        "model": a.model,
        "datasets": {"tickets": {"path": str(train_csv)}},
        "stages": [
            {
                "name": "sft_dataset",
                "kind": "chat_dataset",
                "source": "tickets",
                "prompt": "{subject}\n\n{body}",
                "response": "reply",
                "system": SYSTEM,
                "group_by": "subject",
                "eval_frac": 0.1,
                "seed": a.seed,
            },
            # one step at a near-zero learning rate: a deployable merged model that still behaves like the base
            {
                "name": "sft_adapter",
                "kind": "sft",
                "dataset": "sft_dataset",
                "n_samples": 0,
                "args": {
                    "max_steps": 1,
                    "learning_rate": 1e-7,
                    "batch_size": 2,
                    "grad_accum": 1,
                    "max_seq_len": 256,
                    "logging_steps": 1,
                    "save_steps": 10_000,
                    "seed": a.seed,
                },
            },
            {"name": "merged_model", "kind": "merge"},
            {
                "name": "evaluation_report",
                "kind": "evaluate",
                "dataset": "sft_dataset",
                "n_samples": 1,
                "max_new_tokens": 32,
                "max_eval_rows": a.eval_rows,
                "n_judge": 0,
            },
        ],
        "feedback": {
            "min_new_records": a.chat_prompts,
            "objectives": objectives,
            "sft": {"args": {**common, "epochs": a.sft_epochs, "learning_rate": a.sft_lr}, "n_samples": 0},
            "dpo": {
                "beta": 0.1,
                "args": {**common, "batch_size": 2, "epochs": a.dpo_epochs, "learning_rate": a.dpo_lr},
                "n_samples": 0,
            },
            "kto": {
                "beta": 0.1,
                "args": {**common, "batch_size": 2, "epochs": a.dpo_epochs, "learning_rate": a.dpo_lr},
                "n_samples": 0,
            },
            # rlhf (when listed): a reward model on the feedback pairs, then GRPO on the rated prompts against it
            "reward_model": {
                "args": {**common, "batch_size": 2, "epochs": 2, "learning_rate": a.rm_lr},
                "n_samples": 0,
                "min_accuracy": 0.5,
            },
            "rlhf": {
                "args": {
                    **{k: v for k, v in common.items() if k != "max_steps"},
                    "batch_size": 2,
                    "max_steps": a.rlhf_steps,
                    "learning_rate": a.rlhf_lr,
                },
                "group_size": 4,
                "temperature": 0.9,
                "max_new_tokens": 96,
                "max_eval_prompts": 8,
                "n_samples": 0,
            },
            "evaluate": {"max_new_tokens": 48, "n_samples": 1, "max_eval_rows": a.eval_rows, "n_judge": 0},
        },
    }
    path = directory / NAME / "defs.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump({"type": "dragon_dagster.PostTrainingPipeline", "attributes": attributes}, sort_keys=False)
    )
    return path


class Loop:
    """A pipeline with its own runs folder and Dagster instance: the sensor, the retraining job, the gate."""

    def __init__(self, root: Path, objectives: list[str], a: argparse.Namespace, train_csv: Path):
        from dagster import DagsterInstance

        from dragon_dagster.assets.automation import retrain_job_name
        from dragon_dagster.assets.factory import build_pipeline_defs
        from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
        from dragon_dagster.engine.pipeline import load
        from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

        self.root, self.objectives, self.args = root, objectives, a
        self.pipeline = load(pipeline_yaml(root / "defs", objectives, a, train_csv))
        self.runs = root / "runs"
        self.resources = {
            "store": ArtifactStore(runs_dir=str(self.runs)),
            "tracking": MLflowTracking(runs_dir=str(self.runs)),
            "training": TrainingResource(device=a.device),
        }
        (root / "dagster_home").mkdir(parents=True, exist_ok=True)
        self.instance = DagsterInstance.local_temp(str(root / "dagster_home"))
        self.parts = build_pipeline_defs(self.pipeline)
        [self.job] = [j for j in self.parts["jobs"] if j.name == retrain_job_name(self.pipeline)]
        [self.sensor] = self.parts["sensors"]
        self.store_path = self.resources["store"].feedback_path(NAME)
        self.feedback = SQLiteFeedbackStore(self.store_path)

    def job_assets(self) -> list[str]:
        from dagster import Definitions

        graph = Definitions(assets=self.parts["assets"], resources=self.resources).resolve_asset_graph()
        return sorted(k.path[-1] for k in self.job.selection.resolve(graph))

    def live_model(self) -> Path:
        return self.resources["tracking"].live_model(NAME, self.runs)

    def tick(self):
        from dagster import build_sensor_context

        with build_sensor_context(instance=self.instance, resources={"store": self.resources["store"]}) as context:
            data = self.sensor.evaluate_tick(context)
        return list(data.run_requests or []), data.skip_message

    def retrain(self) -> dict:
        """The sensor's request, run through Dagster: the job's selection with the gate, as the daemon would."""
        from dagster import materialize

        from dragon_dagster.assets.automation import RANGE_TAG

        requests, why = self.tick()
        if not requests:
            raise RuntimeError(f"the feedback sensor requested no retraining: {why}")
        [request] = requests
        started = time.time()
        result = materialize(
            self.parts["assets"] + self.parts["asset_checks"],
            instance=self.instance,
            resources=self.resources,
            selection=self.job.selection,
            tags=request.tags,
            raise_on_error=False,
        )
        steps = {s.step_key.split("__", 1)[-1]: s.status.value for s in self.instance.get_run_step_stats(result.run_id)}
        events = {
            e.asset_key.path[-1]: {k: _plain(v.value) for k, v in e.metadata.items()}
            for e in (ev.event_specific_data.materialization for ev in result.get_asset_materialization_events())
        }
        gates = [e for e in result.get_asset_check_evaluations() if e.check_name == "promotion_gate"]
        gate = (
            {"passed": gates[0].passed, **{k: _plain(v.value) for k, v in gates[0].metadata.items()}} if gates else None
        )
        retrained = events.get("retrained_model", {}).get("artifact_dir")
        rows = {n: events[n].get("rows") for n in events if "rows" in events[n]}
        return {
            "run_key": request.run_key,
            "range": request.tags.get(RANGE_TAG),
            "success": result.success,
            "steps": steps,
            "gate": gate,
            "dataset_rows": rows,
            "skipped_stages": sorted(n for n, m in events.items() if m.get("skipped")),
            "retrained_model": str(Path(retrained) / "model") if retrained else None,
            "wall_s": round(time.time() - started, 1),
        }


def _plain(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def measure(model_dir: Path, tickets: list[dict], a: argparse.Namespace) -> dict:
    """Greedy replies of the model to the held-out tickets, and which the user likes."""
    from dragon_dagster.engine.infer.local_backend import LocalBackend, clear_cache

    started = time.time()
    backend = LocalBackend(str(model_dir), device=a.device, keep_loaded=1, batch_size=8, seed=a.seed)
    replies = backend.chat(
        [[{"role": "user", "content": prompt_of(t)}] for t in tickets],
        max_new_tokens=a.max_new_tokens,
        temperature=0.0,
        system=SYSTEM,
    )
    clear_cache()
    flags = [liked(r, t["product"]) for r, t in zip(replies, tickets)]
    named = [t["product"].lower() in r.lower() for r, t in zip(replies, tickets)]
    short = [len(r.split()) < MAX_WORDS for r in replies]
    log(
        f"held-out liked {sum(flags)}/{len(flags)} (names product {sum(named)}, short {sum(short)}) "
        f"from {model_dir} in {time.time() - started:.0f}s"
    )
    return {
        "model": str(model_dir),
        "liked": sum(flags),
        "n": len(flags),
        "share": round(sum(flags) / len(flags), 4),
        "names_product": sum(named),
        "under_limit": sum(short),
        "mean_words": round(sum(len(r.split()) for r in replies) / len(replies), 1),
        "flags": flags,
        "examples": [{"product": t["product"], "reply": r} for t, r in zip(tickets[:3], replies)],
    }


def chat_round(loop: Loop, tickets: list[dict], a: argparse.Namespace, rng: random.Random) -> dict:
    """The simulated user talks to the live model through Chat, one conversation per ticket, and gives feedback."""
    from dragon_dagster.engine.infer.chat import Chat
    from dragon_dagster.engine.infer.local_backend import LocalBackend, clear_cache

    started = time.time()
    model = loop.live_model()
    backend = LocalBackend(str(model), device=a.device, keep_loaded=1, seed=a.seed)
    ups = downs = edits = 0
    for i, ticket in enumerate(tickets):
        chat = Chat(
            backend,
            system=SYSTEM,
            model_label=str(model),
            store=loop.feedback,
            max_new_tokens=a.max_new_tokens,
            temperature=a.chat_temperature,
        )
        reply = chat.say(prompt_of(ticket))
        if liked(reply, ticket["product"]):
            chat.rate(True)
            ups += 1
        else:
            chat.rate(False)
            downs += 1
            if rng.random() < a.edit_prob:
                chat.edit(edit_text(ticket))
                edits += 1
        if i % 8 == 7:
            log(f"  chatted {i + 1}/{len(tickets)}: {ups} liked, {downs} disliked, {edits} edited")
    clear_cache()
    log(f"chat: {ups} liked, {downs} disliked ({edits} edited) of {len(tickets)} in {time.time() - started:.0f}s")
    return {
        "model": str(model),
        "prompts": len(tickets),
        "liked": ups,
        "disliked": downs,
        "edited": edits,
        "chat_liked_share": round(ups / len(tickets), 4),
        "records": loop.feedback.max_id(),
        "wall_s": round(time.time() - started, 1),
    }


# ------------------------------------------------------------------------------------------ --over-http
USER = "simulated-user"


class Served:
    """`dragon serve <pipeline> --watch 2` on the loop's own runs folder and registry, in a process group of its
    own (stopped by stop(), which main calls in a finally). The simulated user's chats go through the official
    openai client, its ratings and edits through POST /v1/feedback; /health names the champion's version."""

    def __init__(self, loop: Loop, a: argparse.Namespace, log_path: Path):
        self.loop, self.args, self.log_path = loop, a, log_path
        self.proc = None
        self.port = 0

    def env(self) -> dict:
        import os

        runs = self.loop.runs.resolve()
        return {
            **os.environ,
            "DRAGON_RUNS_DIR": str(runs),
            "MLFLOW_TRACKING_URI": self.loop.resources["tracking"].uri,
            "DAGSTER_HOME": str(self.loop.root / "serve_dagster_home"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "OMP_NUM_THREADS": str(self.args.threads),
        }

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float) -> float:
        """Start the server and wait for /health; the seconds it took. A port taken before the server binds it:
        another port (three tries)."""
        import socket
        import subprocess

        import httpx

        started = time.time()
        (self.loop.root / "serve_dagster_home").mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            with self.log_path.open("a") as handle:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "dragon_dagster.cli", "serve", NAME, "--watch", "2"]
                    + ["--port", str(self.port), "--max-batch", "8", "--cache-tokens", "4096"],
                    env=self.env(),
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            deadline = time.time() + timeout
            while time.time() < deadline and self.proc.poll() is None:
                try:
                    if httpx.get(f"{self.base}/health", timeout=5).status_code == 200:
                        log(f"dragon serve {NAME} up at {self.base} in {time.time() - started:.0f}s: {self.health()}")
                        return round(time.time() - started, 1)
                except httpx.HTTPError:
                    pass
                time.sleep(1)
            if self.proc.poll() is not None and "address already in use" in self.log_path.read_text():
                continue
            self.stop()
            break
        raise RuntimeError(
            f"dragon serve did not come up; its log {self.log_path}:\n{self.log_path.read_text()[-3000:]}"
        )

    def stop(self) -> None:
        import os
        import signal
        import subprocess

        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                log(f"dragon serve stopped (exit {self.proc.returncode})")
                return
            except subprocess.TimeoutExpired:
                continue

    def health(self) -> dict:
        import httpx

        return httpx.get(f"{self.base}/health", timeout=30).json()

    def version(self) -> str | None:
        """The champion's version the server serves now, from GET /health's listing."""
        [entry] = [m for m in self.health().get("models", []) if m["id"] == NAME]
        return entry["version"]

    def client(self):
        import openai

        return openai.OpenAI(base_url=f"{self.base}/v1", api_key="none", max_retries=2, timeout=600)

    def chat(self, ticket: dict, temperature: float, seed: int | None = None) -> tuple[str, str, str, str]:
        """One conversation's reply through the openai client: (reply, completion id, its `model`, the version
        header)."""
        raw = self.client().chat.completions.with_raw_response.create(
            model=NAME,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt_of(ticket)}],
            temperature=temperature,
            max_tokens=self.args.max_new_tokens,
            user=USER,
            **({"seed": seed} if seed is not None else {}),
        )
        reply = raw.parse()
        return reply.choices[0].message.content or "", reply.id, reply.model, raw.headers.get("x-dragon-model-version")

    def rate(self, completion_id: str, like: bool, correction: str | None = None) -> dict:
        import httpx

        body = {"completion_id": completion_id, "rating": "like" if like else "dislike", "user": USER}
        if correction is not None:
            body["correction"] = correction
        answer = httpx.post(f"{self.base}/v1/feedback", json=body, timeout=120)
        answer.raise_for_status()
        return answer.json()

    def wait_for_version(self, version: str, timeout: float) -> float | None:
        """Seconds until /health names `version` (the server swapped by itself), None past the timeout."""
        started = time.time()
        while time.time() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dragon serve exited ({self.proc.returncode}); its log: {self.log_path}")
            if self.version() == version:
                return round(time.time() - started, 1)
            time.sleep(1)
        return None

    def swap_lines(self) -> list[str]:
        return [line for line in self.log_path.read_text().splitlines() if f"{NAME}@champion is now version" in line]


def champion_version(loop: Loop) -> str | None:
    from dragon_dagster.engine.release.model_registry import CHAMPION, alias_version

    return alias_version(loop.resources["tracking"].client(), NAME, CHAMPION)


def ensure_champion(loop: Loop, model: Path) -> str:
    """The registry's champion, for `dragon serve NAME` to serve: when no gate has promoted one yet, the first
    merged model's registered version, promoted by hand (as the variants' first champion is)."""
    from dragon_dagster.engine.release.model_registry import version_for

    version = champion_version(loop)
    if version is None:
        version = version_for(loop.resources["tracking"].client(), NAME, model.parent)
        if version is None:
            raise RuntimeError(f"{model.parent} is not a registered version of {NAME!r}")
        loop.resources["tracking"].promote(NAME, version, "feedback_learning --over-http: the first merged model")
        log(f"promoted {NAME}/{version} (the first merged model) by hand, to serve it")
    return version


def chat_round_http(loop: Loop, served: Served, tickets: list[dict], a: argparse.Namespace, rng: random.Random) -> dict:
    """chat_round over the wire: each conversation is one completion from `dragon serve` (the openai client,
    model=<pipeline>), rated with POST /v1/feedback; an edit is a dislike with the corrected reply (one record per
    completion: the server keeps one rating per rater and completion, where the in-process Chat records the
    dislike and the edit apart)."""
    started = time.time()
    ups = downs = edits = 0
    versions: dict[str, int] = {}
    completions = []
    for i, ticket in enumerate(tickets):
        reply, completion_id, model, header = served.chat(ticket, a.chat_temperature, seed=a.seed * 100_003 + i)
        versions[model] = versions.get(model, 0) + 1
        if header != model:
            raise RuntimeError(f"the reply's model {model!r} and its version header {header!r} disagree")
        if liked(reply, ticket["product"]):
            answer = served.rate(completion_id, True)
            ups += 1
        else:
            downs += 1
            correction = None
            if rng.random() < a.edit_prob:
                correction = edit_text(ticket)
                edits += 1
            answer = served.rate(completion_id, False, correction)
        completions.append({"id": completion_id, "model": model, "record": answer["id"], "trace": answer["assessment"]})
        if i % 8 == 7:
            log(f"  chatted {i + 1}/{len(tickets)} over HTTP: {ups} liked, {downs} disliked, {edits} edited")
    log(
        f"chat over HTTP: {ups} liked, {downs} disliked ({edits} edited) of {len(tickets)} in "
        f"{time.time() - started:.0f}s; answered by {versions}"
    )
    return {
        "model": f"models:/{NAME}@champion",
        "answered_by": versions,
        "prompts": len(tickets),
        "liked": ups,
        "disliked": downs,
        "edited": edits,
        "chat_liked_share": round(ups / len(tickets), 4),
        "records": loop.feedback.max_id(),
        "assessments_logged": sum(c["trace"] == "logged" for c in completions),
        "completions": completions,
        "wall_s": round(time.time() - started, 1),
    }


def measure_http(served: Served, tickets: list[dict], a: argparse.Namespace) -> dict:
    """measure() through the server: greedy replies to the held-out tickets (sent together, so the server
    batches them), and which the user likes; for comparison with the in-process measurement of the same model."""
    from concurrent.futures import ThreadPoolExecutor

    started = time.time()
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda t: served.chat(t, 0.0), tickets))
    replies = [r for r, *_ in answers]
    flags = [liked(r, t["product"]) for r, t in zip(replies, tickets)]
    versions = sorted({m for _, _, m, _ in answers})
    log(f"held-out liked {sum(flags)}/{len(flags)} over HTTP from {versions} in {time.time() - started:.0f}s")
    return {
        "via": "dragon serve",
        "answered_by": versions,
        "liked": sum(flags),
        "n": len(flags),
        "names_product": sum(t["product"].lower() in r.lower() for r, t in zip(replies, tickets)),
        "under_limit": sum(len(r.split()) < MAX_WORDS for r in replies),
        "mean_words": round(sum(len(r.split()) for r in replies) / len(replies), 1),
        "flags": flags,
        "wall_s": round(time.time() - started, 1),
    }


def copy_store(source: Path, target: Path) -> None:
    """A consistent copy of a feedback store (SQLite backup, WAL included)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)


def run_variant(
    objectives: list[str],
    out: Path,
    a: argparse.Namespace,
    train_csv: Path,
    store_copy: Path,
    first_model: Path,
    held: list[dict],
    before: dict,
) -> dict:
    """Retrain from the same first champion on the same feedback with other objectives, in a fresh folder."""
    from dagster import AssetSelection, materialize

    started = time.time()
    name = "+".join(objectives)
    loop = Loop(out / f"variant-{name}", objectives, a, train_csv)
    # the pipeline's datasets (the report's held-out rows); the first champion registered and promoted by hand
    assert materialize(
        loop.parts["assets"],
        instance=loop.instance,
        resources=loop.resources,
        selection=AssetSelection.assets([NAME, "tickets"], [NAME, "sft_dataset"]),
    ).success
    tracking = loop.resources["tracking"]
    version = tracking.register_model(NAME, first_model, None, {"note": "feedback_learning: the first champion"})
    tracking.promote(NAME, version, "feedback_learning: same start as the main loop")
    copy_store(store_copy, loop.store_path)
    log(f"variant {name}: job assets {loop.job_assets()}")
    retrained = loop.retrain()
    log(f"variant {name}: success={retrained['success']} gate={retrained['gate']} in {retrained['wall_s']}s")
    after = measure(Path(retrained["retrained_model"]), held, a) if retrained["retrained_model"] else None
    return {
        "objectives": objectives,
        "job_assets": loop.job_assets(),
        "retraining": retrained,
        "after": _strip(after),
        "vs_start": mcnemar(before["flags"], after["flags"]) if after else None,
        "liked_flags": after["flags"] if after else None,  # per held-out ticket, to compare variants paired
        "stages": stage_results(loop.runs),
        "wall_s": round(time.time() - started, 1),
    }


# what a reader of the comparison needs from the feedback stages' manifests beyond the liked share
STAGE_FIGURES = {
    "feedback_reward_model": ("train_pairs", "eval_pairs", "accuracy", "margin", "train_accuracy"),
    "rlhf_on_feedback": ("global_step", "kl", "reward_before", "reward_after", "clipped_ratio"),
}


def stage_results(runs: Path) -> dict:
    """The reward model's and the RLHF stage's figures (held-out pairs ranked right, KL, learned reward) from the
    newest manifest of each under a runs folder; stages that did not run are left out."""
    found = {}
    for asset, keys in STAGE_FIGURES.items():
        manifests = sorted((runs / "artifacts" / NAME / asset).glob("*/manifest.json"))
        if manifests:
            result = json.loads(manifests[-1].read_text())["result"]
            found[asset] = {k: result.get(k) for k in keys}
    return found


def _strip(m: dict | None) -> dict | None:
    return None if m is None else {k: v for k, v in m.items() if k != "flags"}


def from_feedback(a: argparse.Namespace, out: Path, train_csv: Path, held: list[dict], t0: float) -> dict:
    """The objectives compared on recorded feedback: each variant retrains from the same first champion through
    the sensor and the retraining job, in its own runs folder and instance. Results also go to variants.jsonl
    as each finishes."""
    first_model = Path(a.first_model)
    start = measure(first_model, held, a)
    partial = out / "variants.jsonl"
    with partial.open("a") as f:
        f.write(json.dumps({"start": start}) + "\n")
    records = sqlite3.connect(a.from_feedback).execute("SELECT verdict, COUNT(*) FROM feedback GROUP BY verdict")
    feedback = dict(records.fetchall())
    variants = []
    for spec in a.variants or []:
        objectives = [o for o in spec.split(",") if o]
        try:
            variants.append(run_variant(objectives, out, a, train_csv, Path(a.from_feedback), first_model, held, start))
        except Exception as exc:  # noqa: BLE001 - a variant this build cannot run is reported, not fatal
            log(f"variant {spec} failed: {type(exc).__name__}: {exc}")
            variants.append({"objectives": objectives, "error": f"{type(exc).__name__}: {exc}"[:500]})
        with partial.open("a") as f:
            f.write(json.dumps(variants[-1], default=str) + "\n")
        log(
            f"variant {spec}: {json.dumps(variants[-1].get('after') and variants[-1]['after']['liked'])} liked, "
            f"vs start {variants[-1].get('vs_start')}"
        )
    result = {
        "taste": TASTE,
        "settings": vars(a) | {"n_held_out": len(held)},
        "feedback_records": feedback,
        "start": _strip(start),
        "variants": variants,
        "wall_s": round(time.time() - t0, 1),
        "out": str(out),
    }
    print(json.dumps(result, default=str), flush=True)
    return result


def run_rounds(
    loop: Loop, pool: list[dict], held: list[dict], a: argparse.Namespace, first_model: Path, out: Path, served
) -> tuple[list[dict], dict, dict, dict | None]:
    """The chat-retrain rounds: (rounds, the start's measurement, the last champion's, what the wire did). With
    `served` (--over-http) the user talks to `dragon serve` and rates over HTTP, and each promotion is followed
    until the server answers from the new champion by itself."""
    rng = random.Random(a.seed)
    current = measure(first_model, held, a)
    start_measure = current
    wire = None
    if served is not None:
        version = ensure_champion(loop, first_model)
        wire = {"start_s": served.start(a.serve_timeout), "base": served.base, "log": str(served.log_path)}
        wire["champion_at_start"] = version
        wire["start_over_http"] = measure_http(served, held, a)
        wire["start_over_http"]["same_flags_as_in_process"] = sum(
            x == y for x, y in zip(wire["start_over_http"]["flags"], current["flags"])
        )
    rounds, store_copy, next_ticket = [], out / "round1_feedback.sqlite", 0
    for r in range(1, a.rounds + 1):
        log(f"--- round {r}/{a.rounds}: live model {loop.live_model()}")
        tickets = [pool[(next_ticket + i) % len(pool)] for i in range(a.chat_prompts)]
        next_ticket += a.chat_prompts
        round_started = time.time()
        if served is None:
            chatted = chat_round(loop, tickets, a, rng)
        else:
            served_before = served.version()
            chatted = chat_round_http(loop, served, tickets, a, rng)
        if r == 1:
            copy_store(loop.store_path, store_copy)
        retrained = loop.retrain()
        gate = retrained["gate"] or {}
        log(
            f"round {r}: retraining success={retrained['success']} gate passed={gate.get('passed')} "
            f"({gate.get('regressions')}) in {retrained['wall_s']}s; rows {retrained['dataset_rows']}"
        )
        promoted = bool(gate.get("passed"))
        swap = swap_check(served, loop, served_before, promoted, a, held[0]) if served is not None else None
        round_wall_s = round(time.time() - round_started, 1)
        model_after = loop.live_model()
        if promoted:
            after = measure(model_after, held, a)
        elif retrained["retrained_model"]:
            log("the gate kept the champion; measuring the rejected challenger for information")
            after = measure(Path(retrained["retrained_model"]), held, a)
        else:
            after = None
        rounds.append(
            {
                "round": r,
                "chat": chatted,
                "retraining": retrained,
                "promoted": promoted,
                "live_before": current["model"],
                "live_after": str(model_after),
                "before": _strip(current),
                "after": _strip(after),
                "after_is": "champion" if promoted else "rejected challenger",
                "liked_flags": after["flags"] if after else None,  # per held-out ticket: variants compare paired
                "mcnemar": mcnemar(current["flags"], after["flags"]) if after else None,
            }
        )
        if served is not None:
            rounds[-1]["over_http"] = swap
            rounds[-1]["round_wall_s"] = round_wall_s  # chat + retraining + the wait for the swap
            if promoted and swap["swapped"]:
                swap["after_over_http"] = measure_http(served, held, a)
                swap["after_over_http"]["same_flags_as_in_process"] = sum(
                    x == y for x, y in zip(swap["after_over_http"]["flags"], after["flags"])
                )
        log(
            f"round {r}: liked {current['liked']}/{current['n']} -> {after and after['liked']}/{current['n']} "
            f"({rounds[-1]['after_is']}), McNemar {rounds[-1]['mcnemar']}"
        )
        if promoted:
            current = after
    return rounds, start_measure, current, wire


def gate_time(instance) -> float | None:
    """When the latest run's promotion gate was evaluated (it promotes as it decides), from Dagster's event log."""
    from dagster import DagsterEventType

    runs = instance.get_runs(limit=1)
    if not runs:
        return None
    times = [
        e.timestamp
        for e in instance.all_logs(runs[0].run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
        if e.dagster_event.event_specific_data.check_name == "promotion_gate"
    ]
    return max(times) if times else None


def swap_check(
    served: Served, loop: Loop, before: str | None, promoted: bool, a: argparse.Namespace, probe: dict
) -> dict:
    """After a retraining: did the server move to the registry's new champion by itself, and how long after the
    retraining job ended (negative: before it ended; from the server's log line)? Then one greedy request, whose
    reply must name the new version."""
    from datetime import datetime

    ended = time.time()
    champion = champion_version(loop)
    found = {"served_before": before, "champion_after": champion, "promoted": promoted}
    if not promoted or champion == before:
        found |= {"swapped": False, "served_after": served.version(), "swap_lines": served.swap_lines()}
        log(f"no promotion: the server still serves {NAME}/{found['served_after']}")
        return found
    waited = served.wait_for_version(champion, a.swap_timeout)
    found["swapped"] = waited is not None
    found["swap_seen_after_s"] = waited  # polling /health from the retraining job's end
    found["swap_lines"] = lines = served.swap_lines()
    if lines:  # "2026-12-07 06:10:11,123 INFO fbloop@champion is now version 2 (was 1)..."
        at = datetime.strptime(lines[-1][:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        found["swapped_vs_retraining_end_s"] = round(at - ended, 1)
        decided = gate_time(loop.instance)
        if decided is not None:  # the gate promotes as it decides: from the promotion to the server's switch
            found["swapped_after_gate_s"] = round(at - decided, 1)
    if waited is None:
        log(f"the server did not swap to {NAME}/{champion} within {a.swap_timeout:g}s")
        return found
    reply, completion_id, model, header = served.chat(probe, 0.0)
    found["next_reply"] = {"id": completion_id, "model": model, "header": header}
    found["next_reply_from_new_champion"] = model == header == f"{NAME}/{champion}"
    log(f"the server swapped {NAME}/{before} -> {NAME}/{champion} by itself; the next reply came from {model}")
    return found


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a smoke run of a few minutes (explicit options win)")
    p.add_argument("--rounds", type=int, help="chat-retrain rounds")
    p.add_argument("--chat-prompts", type=int, help="tickets the user chats about per round (= min_new_records)")
    p.add_argument("--held-out", type=int, help="held-out tickets measured (whole subjects held out)")
    p.add_argument("--edit-prob", type=float, help="chance the user edits a disliked reply")
    p.add_argument("--max-new-tokens", type=int, help="reply budget, in chat and in measurement")
    p.add_argument("--chat-temperature", type=float, help="sampling temperature while chatting")
    p.add_argument("--sft-epochs", type=float)
    p.add_argument("--sft-lr", type=float)
    p.add_argument("--dpo-epochs", type=float, help="epochs of DPO and KTO")
    p.add_argument("--dpo-lr", type=float, help="learning rate of DPO and KTO")
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--max-steps", type=int, help="cap on each feedback training stage's steps (-1: epochs decide)")
    p.add_argument("--eval-rows", type=int, help="the pipeline's held-out rows in the reports the gate reads")
    p.add_argument("--objectives", default="sft,dpo,kto", help="the main loop's feedback.objectives")
    p.add_argument("--rm-lr", type=float, default=1e-4, help="rlhf: the reward model's learning rate")
    p.add_argument("--rlhf-steps", type=int, default=12, help="rlhf: GRPO steps on the rated prompts")
    p.add_argument("--rlhf-lr", type=float, default=5e-5, help="rlhf: GRPO's learning rate")
    p.add_argument(
        "--variants",
        nargs="*",
        help="objective sets compared on round 1's feedback, e.g. sft sft,dpo (none: skip the comparison)",
    )
    p.add_argument("--model", default="smollm2-135m", help="base model (preset, hub id or directory)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads for chat and measurement")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", help="output directory (default: a temporary one)")
    p.add_argument(
        "--from-feedback",
        help="skip the chat rounds: compare the --variants on this recorded feedback "
        "store (a round's SQLite copy), each retrained from --first-model",
    )
    p.add_argument("--first-model", help="with --from-feedback: the first champion's model directory")
    p.add_argument(
        "--over-http",
        action="store_true",
        help="the user talks to `dragon serve <pipeline> --watch 2` (the openai client) and rates over POST "
        "/v1/feedback; each promotion is followed until the server swaps by itself (no --variants unless given)",
    )
    p.add_argument("--serve-timeout", type=float, default=900, help="--over-http: seconds for the server to start")
    p.add_argument("--swap-timeout", type=float, default=600, help="--over-http: seconds to wait for its swap")
    a = p.parse_args(argv)
    if a.over_http and a.from_feedback:
        p.error("--over-http chats; --from-feedback skips the chats")
    if a.over_http and a.variants is None:
        a.variants = []  # the objective comparison is in-process either way: only when asked
    preset = {**DEFAULTS, **(QUICK if a.quick else {})}
    for k, v in preset.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    return a


def main(argv=None) -> dict:
    a = parse_args(argv)
    if a.over_http:  # a SIGTERM ends the run through its finally, which stops the server
        import signal

        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    from dragon_dagster.assets.launch import materialize_pipeline

    t0 = time.time()
    out = Path(a.out or tempfile.mkdtemp(prefix="feedback_learning_"))
    out.mkdir(parents=True, exist_ok=True)
    log(f"taste: {TASTE}; output in {out}")
    pool, held = split(a.seed, a.held_out)
    train_csv = out / "tickets_train.csv"  # the pipeline never sees a held-out subject either
    with train_csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["subject", "body", "product", "reply"])
        writer.writeheader()
        writer.writerows(pool)
    log(f"{len(pool)} chat tickets, {len(held)} held out ({len({t['subject'] for t in held})} subjects)")

    if a.from_feedback:
        return from_feedback(a, out, train_csv, held, t0)
    main_objectives = [o for o in a.objectives.split(",") if o]
    loop = Loop(out / "main", main_objectives, a, train_csv)
    log(f"retraining job {loop.job.name}: {loop.job_assets()}")
    started = time.time()
    materialize_pipeline(loop.pipeline, resources=loop.resources, instance=loop.instance)
    first_model = loop.live_model()
    log(f"pipeline materialized in {time.time() - started:.0f}s; first live model {first_model}")
    setup_s = round(time.time() - started, 1)

    store_copy = out / "round1_feedback.sqlite"
    served = Served(loop, a, out / "serve.log") if a.over_http else None
    try:
        rounds, start_measure, final, wire = run_rounds(loop, pool, held, a, first_model, out, served)
    finally:
        if served is not None:
            served.stop()
    overall = mcnemar(start_measure["flags"], final["flags"])

    variants = []
    round1 = rounds[0] if rounds else None
    for spec in a.variants or []:
        objectives = [o for o in spec.split(",") if o]
        if round1 and objectives == main_objectives:
            log(f"variant {spec}: the main loop's round 1")
            after = round1["after"]
            variants.append(
                {
                    "objectives": objectives,
                    "job_assets": loop.job_assets(),
                    "same_as": "round 1",
                    "retraining": round1["retraining"],
                    "after": after,
                    "vs_start": round1["mcnemar"],
                }
            )
            continue
        try:
            variant = run_variant(objectives, out, a, train_csv, store_copy, first_model, held, start_measure)
            if round1 and round1.get("liked_flags") and variant.get("liked_flags"):
                # paired on the same held-out tickets against the main objectives' retraining on the same records
                variant["vs_main"] = mcnemar(round1["liked_flags"], variant["liked_flags"])
                variant["main_objectives"] = main_objectives
            variants.append(variant)
        except Exception as exc:  # noqa: BLE001 - a variant this build cannot run is reported, not fatal
            log(f"variant {spec} failed: {type(exc).__name__}: {exc}")
            variants.append({"objectives": objectives, "error": f"{type(exc).__name__}: {exc}"[:500]})

    result = {
        "taste": TASTE,
        "settings": {k: v for k, v in vars(a).items()} | {"n_chat_pool": len(pool), "n_held_out": len(held)},
        "start": _strip(start_measure),
        "rounds": rounds,
        "overall": {
            "liked_start": start_measure["liked"],
            "liked_end": final["liked"],
            "n": final["n"],
            "promotions": sum(r["promoted"] for r in rounds),
            **overall,
        },
        "variants": variants,
        "setup_s": setup_s,
        "wall_s": round(time.time() - t0, 1),
        "out": str(out),
    }
    if wire is not None:
        result["over_http"] = wire
    print(json.dumps(result, default=str), flush=True)
    return result


if __name__ == "__main__":
    main()
