"""Serving under load: time to first token, inter-token latency and aggregate tokens/s of OpenAI-compatible servers.

A load driver on the official `openai` package (AsyncOpenAI). For each concurrency level of --streams (default
1,4,16,32) that many clients run at once against one server, each sending --requests-per-client (2) streaming chat
completions one after another: greedy (temperature 0), max_tokens 64, stream_options.include_usage, the support
pipeline's system prompt and one ticket of the bundled tickets.csv as the user turn (every request of a level its
own ticket, in a fixed shuffled order: client c's request r is ticket c * requests_per_client + r). Measured per
request: the time to first token (the first chunk with content), the inter-token latencies (the gaps between
content chunks), the output tokens (the stream's usage) and the reply; per level: the aggregate output tokens/s (all
output tokens over the level's wall time, first request sent to last stream ended), TTFT p50/p99 and ITL p50/p99
(over every request's gaps). With 2 requests per client, p99 is close to the worst request.

Targets, each a server this script starts, waits for (GET /health, or /v1/models where /health is a 404), loads
and stops (its whole process group, on Ctrl-C and SIGTERM too), one server at a time:
- `llama`: llama.cpp's `llama-server` (the path in /work/llama-src/LLAMA_SERVER, or --llama-server) on the demo's f16
  GGUF export, restarted for every level with `--parallel` = the level's streams and continuous batching (`-cb`,
  also its default);
- `transformers`: `transformers serve <newest merged model> --continuous-batching`, model name = the directory;
- `ours`: `dragon serve models:/support@champion --port {port}` (--ours-cmd), model name `support`;
- any other: `--target NAME=COMMAND` (placeholders {port}, {parallel}, {ctx}, {host}) or `--target NAME=URL` for a
  server that is already running (not started nor stopped); its model name is --model-name NAME=MODEL or the first
  of its /v1/models.
Each (repeat, level) runs every target in turn, each after a fresh start and one short warm-up request, so the
machine's speed drift hits all targets alike; the table gives the median over --repeats (3) with the min-max range.

    .venv/bin/python benchmarks/serving.py --quick --targets llama,transformers   # 1 and 4 streams, 1 repeat
    .venv/bin/python benchmarks/serving.py --targets ours,llama,transformers       # 1,4,16,32 streams, 3 repeats
    .venv/bin/python benchmarks/serving.py --targets llama,vllm --target vllm=http://127.0.0.1:8000/v1

Options --runs (default ./runs; the demo's artifacts), --gguf and --merged-model pick the model files. The markdown
table goes to stdout, log lines to stderr (the servers' own logs to --log-dir), and a JSON record with every raw
number (each request's times, gaps, tokens and reply, each server's start time and command) to
benchmarks/records/serving-<date>.json (--out), rewritten after every level so an interrupted run keeps its data.
It also says how often the greedy replies agree: a target's replies to the same ticket at every level (batch
invariance) and one target's against another's.

llama-server, built offline from the llama.cpp source that llama-cpp-python's source distribution carries (in the
benchmark's own environment, never in CI; about 5 minutes on 2 idle cores, 11 on busy ones):

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d /work/llama-src   # then untar it
    cd /work/llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -G Ninja -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DCMAKE_BUILD_TYPE=Release
    cmake --build build --target llama-server -j2
    echo $PWD/build/bin/llama-server > /work/llama-src/LLAMA_SERVER

The Python `llama_cpp.server` serialises requests: it is not a fair peer.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TICKETS = ROOT / "dragon_dagster" / "example_data" / "tickets.csv"
SYSTEM = "You are a concise, warm support agent for a smart-home company."
LLAMA_SERVER_FILE = Path("/work/llama-src/LLAMA_SERVER")
QUICK = dict(streams="1,4", repeats=1)
METRICS = ("tokens_per_s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99")


def log(message: str) -> None:
    print(f"[serving {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def prompts() -> list[str]:
    """The tickets' distinct bodies in a fixed shuffled order (the file groups them by subject)."""
    with TICKETS.open(newline="") as f:
        bodies = list(dict.fromkeys(row["body"].strip() for row in csv.DictReader(f)))
    random.Random(0).shuffle(bodies)
    return bodies


def messages(body: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": body}]


# --- servers ---------------------------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    command: str | None  # a template with {port} {parallel} {ctx} {host}; None: an already running server at url
    url: str | None = None
    model: str | None = None  # None: the first of /v1/models
    cwd: Path = ROOT
    env: dict = field(default_factory=dict)

    @property
    def per_level(self) -> bool:
        return bool(self.command) and "{parallel}" in self.command


class Server:
    """One started server: its process group, log file and base URL; stop() ends the whole group."""

    live: list[Server] = []

    def __init__(self, target: Target, parallel: int, log_dir: Path, tag: str):
        self.target = target
        self.process: subprocess.Popen | None = None
        self.command: list[str] = []
        self.log_path: Path | None = None
        if target.command is None:
            self.base_url = target.url.rstrip("/")
            return
        port = free_port()
        ctx = max(8192, 256 * parallel)
        line = target.command.format(port=port, parallel=parallel, ctx=ctx, host="127.0.0.1")
        self.command = shlex.split(line)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.log_path = log_dir / f"{tag}.log"
        with self.log_path.open("w") as out:
            out.write(f"$ {line}\n")
            out.flush()
            self.process = subprocess.Popen(
                self.command,
                cwd=target.cwd,
                env={**os.environ, **target.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stop() reaches the workers it starts
            )
        Server.live.append(self)

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, timeout: float) -> float:
        """Seconds until GET /health says 200 (or /v1/models, where /health is a 404)."""
        root = self.base_url.removesuffix("/v1")
        start = time.perf_counter()
        health = f"{root}/health"
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.target.name} exited with {self.process.returncode} before it was ready:\n{self.log_tail()}"
                )
            if time.perf_counter() - start > timeout:
                raise TimeoutError(f"{self.target.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")
            status = http_status(health)
            if status == 404 and health.endswith("/health"):
                health = f"{self.base_url}/models"
                continue
            if status == 200:
                return time.perf_counter() - start
            time.sleep(0.25)

    def model_name(self) -> str:
        if self.target.model:
            return self.target.model
        with urllib.request.urlopen(f"{self.base_url}/models", timeout=10) as response:
            return json.load(response)["data"][0]["id"]

    def stop(self) -> None:
        if self.process is None or self not in Server.live:
            return
        Server.live.remove(self)
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # whatever the leader left behind in its group
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


# --- the load --------------------------------------------------------------------------------------------------


async def one_request(client, model: str, ticket: int, body: str, max_tokens: int, t0: float) -> dict:
    record = {"ticket": ticket, "start": time.perf_counter() - t0, "first": None, "end": None}
    gaps: list[float] = []
    text: list[str] = []
    usage = finish = error = None
    last = None
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages(body),
            stream=True,
            stream_options={"include_usage": True},
            temperature=0,
            max_tokens=max_tokens,
        )
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                content = choice.delta.content if choice.delta else None
                if content:
                    if last is None:
                        record["first"] = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
                    text.append(content)
    except Exception as exc:  # a failed request is counted, not fatal to the level
        error = f"{type(exc).__name__}: {exc}"
    record["end"] = time.perf_counter() - t0
    ttft = record["first"] - record["start"] if record["first"] is not None else None
    record.update(
        ttft=ttft,
        itl=[round(g, 6) for g in gaps],
        content_chunks=len(text),
        output_tokens=usage if usage is not None else len(text),
        usage_reported=usage is not None,
        finish_reason=finish,
        reply="".join(text),
        error=error,
    )
    return record


async def run_level(base_url: str, model: str, streams: int, per_client: int, max_tokens: int, timeout: float):
    from openai import AsyncOpenAI

    bodies = prompts()
    client = AsyncOpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "none"), max_retries=0)
    client = client.with_options(timeout=timeout)
    t0 = time.perf_counter()

    async def one_client(c: int) -> list[dict]:
        out = []
        for r in range(per_client):
            ticket = (c * per_client + r) % len(bodies)
            record = await one_request(client, model, ticket, bodies[ticket], max_tokens, t0)
            out.append({"client": c, "request": r, **record})
        return out

    try:
        results = await asyncio.gather(*(one_client(c) for c in range(streams)))
    finally:
        await client.close()
    return [record for per in results for record in per]


async def warm_up(base_url: str, model: str, timeout: float) -> None:
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=timeout) as client:
        await client.chat.completions.create(model=model, messages=messages(prompts()[-1]), temperature=0, max_tokens=8)


def summarise(requests: list[dict]) -> dict:
    done = [r for r in requests if r["error"] is None]
    wall = max(r["end"] for r in requests) - min(r["start"] for r in requests)
    tokens = sum(r["output_tokens"] for r in done)
    ttft = [r["ttft"] for r in done if r["ttft"] is not None]
    itl = [g for r in done for g in r["itl"]]
    return {
        "requests": len(requests),
        "failed": len(requests) - len(done),
        "output_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "itl_p50": percentile(itl, 50),
        "itl_p99": percentile(itl, 99),
        "itl_samples": len(itl),
        "usage_missing": sum(not r["usage_reported"] for r in done),
        "content_chunks_per_token": (sum(r["content_chunks"] for r in done) / tokens) if tokens else None,
    }


# --- targets ---------------------------------------------------------------------------------------------------


def newest(paths: list[Path], what: str) -> Path:
    if not paths:
        raise SystemExit(f"no {what} found (make demo writes it; or name it with an option)")
    return max(paths, key=lambda p: p.stat().st_mtime)


def build_targets(a: argparse.Namespace) -> dict[str, Target]:
    runs = Path(a.runs).resolve()
    targets: dict[str, Target] = {}
    names = [n for n in a.targets.split(",") if n]
    custom = dict(spec.split("=", 1) for spec in a.target)
    names += [n for n in custom if n not in names]
    models = dict(spec.split("=", 1) for spec in a.model_name)
    for name in names:
        if name in custom:
            value = custom[name]
            if value.startswith(("http://", "https://")):
                targets[name] = Target(name, None, url=value, model=models.get(name))
            else:
                targets[name] = Target(name, value, model=models.get(name))
        elif name == "llama":
            binary = a.llama_server or (LLAMA_SERVER_FILE.read_text().strip() if LLAMA_SERVER_FILE.exists() else "")
            if not binary or not Path(binary).exists():
                raise SystemExit(f"llama-server not found: --llama-server or a path in {LLAMA_SERVER_FILE}")
            gguf = (
                Path(a.gguf)
                if a.gguf
                else newest(list(runs.glob("artifacts/support/gguf_export/*/gguf/*-f16.gguf")), "f16 GGUF export")
            )
            parallel = "{parallel}" if a.llama_parallel == "level" else str(max(a.stream_levels))
            command = (
                f"{shlex.quote(binary)} -m {shlex.quote(str(gguf))} --host {{host}} --port {{port}} "
                f"--parallel {parallel} -c {{ctx}} -cb --no-webui"
            )
            targets[name] = Target(name, command, model=models.get(name))
        elif name == "transformers":
            merged = (
                Path(a.merged_model)
                if a.merged_model
                else newest(
                    [p / "model" for p in runs.glob("artifacts/support/merged_model/*") if (p / "model").is_dir()],
                    "merged model",
                )
            )
            command = a.transformers_cmd.replace("{model}", shlex.quote(str(merged)))
            targets[name] = Target(name, command, model=models.get(name, str(merged)))
        elif name == "ours":
            targets[name] = Target(
                name, a.ours_cmd, model=models.get(name, "support"), env={"DRAGON_RUNS_DIR": str(runs)}
            )
        else:
            raise SystemExit(
                f"unknown target {name!r}: llama, transformers, ours, or define it with --target {name}=..."
            )
    return targets


def versions(targets: dict[str, Target]) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for package in ("openai", "transformers", "torch"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            pass
    if "llama" in targets:
        binary = shlex.split(targets["llama"].command)[0]
        run = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
        out["llama-server"] = "; ".join(line for line in (run.stdout + run.stderr).splitlines() if line.strip())
    return out


def machine() -> dict:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu or platform.processor(), "cores": os.cpu_count(), "platform": platform.platform()}


# --- report ----------------------------------------------------------------------------------------------------


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    values = [v * scale for v in values if v is not None]
    if not values:
        return "-"
    middle = f"{statistics.median(values):.{digits}f}"
    if len(values) == 1:
        return middle
    return f"{middle} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def table(cells: list[dict], names: list[str], levels: list[int]) -> str:
    lines = [
        "| streams | target | output tokens/s | x its 1 stream | TTFT p50, s | TTFT p99, s | ITL p50, ms | ITL p99, ms "
        "| failed / requests |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    by = {}
    for cell in (c for c in cells if "summary" in c):
        by.setdefault((cell["target"], cell["streams"]), []).append(cell["summary"])
    for level in levels:
        for name in names:
            runs = by.get((name, level))
            if not runs:
                continue
            tps = [s["tokens_per_s"] for s in runs]
            single = by.get((name, 1))
            ratio = "-"
            if single and level != 1:
                base = statistics.median(s["tokens_per_s"] for s in single)
                ratio = f"{statistics.median(tps) / base:.2f}x" if base else "-"
            failed = sum(s["failed"] for s in runs)
            total = sum(s["requests"] for s in runs)
            lines.append(
                f"| {level} | {name} | {spread(tps, digits=1)} | {ratio} | {spread([s['ttft_p50'] for s in runs])} "
                f"| {spread([s['ttft_p99'] for s in runs])} | {spread([s['itl_p50'] for s in runs], 1000, 1)} "
                f"| {spread([s['itl_p99'] for s in runs], 1000, 1)} | {failed} / {total} |"
            )
    return "\n".join(lines)


def agreement(cells: list[dict], names: list[str]) -> dict:
    """How often greedy replies agree: per target, the tickets whose replies are the same at every level and repeat;
    per pair of targets, the tickets both answered where their (first) replies are equal."""
    replies: dict[str, dict[int, list[str]]] = {}
    for cell in (c for c in cells if "summary" in c):
        for r in cell["requests"]:
            if r["error"] is None:
                replies.setdefault(cell["target"], {}).setdefault(r["ticket"], []).append(r["reply"])
    out = {"batch_invariant": {}, "pairs": {}}
    for name, per in replies.items():
        repeated = {t: rs for t, rs in per.items() if len(rs) > 1}
        same = sum(len(set(rs)) == 1 for rs in repeated.values())
        out["batch_invariant"][name] = {"tickets_seen_more_than_once": len(repeated), "always_same": same}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if a in replies and b in replies:
                common = sorted(set(replies[a]) & set(replies[b]))
                equal = sum(replies[a][t][0] == replies[b][t][0] for t in common)
                out["pairs"][f"{a} vs {b}"] = {"tickets": len(common), "equal": equal}
    return out


def agreement_lines(agree: dict) -> list[str]:
    lines = [
        f"- {name}: the same reply to a ticket at every level and repeat for {v['always_same']} of "
        f"{v['tickets_seen_more_than_once']} tickets"
        for name, v in agree["batch_invariant"].items()
    ]
    lines += [
        f"- {pair}: equal greedy replies on {v['equal']} of {v['tickets']} tickets"
        for pair, v in agree["pairs"].items()
    ]
    return lines


# --- main ------------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 and 4 streams, 1 repeat (explicit options win)")
    p.add_argument("--targets", default="ours,llama,transformers", help="comma-separated, in the order they run")
    p.add_argument("--target", action="append", default=[], metavar="NAME=COMMAND|URL", help="another target")
    p.add_argument("--model-name", action="append", default=[], metavar="NAME=MODEL", help="a target's model name")
    p.add_argument("--streams", help="concurrency levels (default 1,4,16,32)")
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--repeats", type=int, help="rounds over all levels and targets (default 3)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--runs", default=str(Path.cwd() / "runs"), help="where the demo's artifacts are")
    p.add_argument("--gguf", help="llama: the GGUF file (default: the newest support f16 export under --runs)")
    p.add_argument("--merged-model", help="transformers: the model dir (default: the newest support merged model)")
    p.add_argument("--llama-server", help=f"the binary (default: the path in {LLAMA_SERVER_FILE})")
    p.add_argument(
        "--llama-parallel",
        choices=["level", "max"],
        default="level",
        help="llama: --parallel = each level's streams (restarted per level) or the largest level's",
    )
    p.add_argument(
        "--transformers-cmd",
        default=".venv/bin/transformers serve {model} --continuous-batching --host {host} --port {port}",
    )
    p.add_argument("--ours-cmd", default=".venv/bin/dragon serve models:/support@champion --port {port}")
    p.add_argument("--start-timeout", type=float, default=600, help="seconds a server may take to be ready")
    p.add_argument("--request-timeout", type=float, default=600)
    p.add_argument("--log-dir", help="the servers' logs (default: a new temporary directory)")
    p.add_argument("--out", help="the JSON record (default: benchmarks/records/serving-<date>.json)")
    a = p.parse_args(argv)
    defaults = dict(streams="1,4,16,32", repeats=3)
    for key, value in (QUICK if a.quick else defaults).items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    a.stream_levels = [int(s) for s in a.streams.split(",")]
    return a


def measure(target: Target, level: int, a: argparse.Namespace, log_dir: Path, tag: str) -> dict:
    """Start the target's server, wait for it, warm it up with one short request, run the level, stop it."""
    server = Server(target, level, log_dir, tag)
    try:
        ready = server.wait_ready(a.start_timeout)
        model = server.model_name()
        t = time.perf_counter()
        asyncio.run(warm_up(server.base_url, model, a.request_timeout))
        warm = time.perf_counter() - t
        requests = asyncio.run(
            run_level(server.base_url, model, level, a.requests_per_client, a.max_tokens, a.request_timeout)
        )
    finally:
        server.stop()
    return {
        "model": model,
        "command": server.command,
        "log": str(server.log_path) if server.log_path else None,
        "ready_s": ready,
        "warm_up_s": warm,
        "summary": summarise(requests),
        "requests": requests,
    }


def interrupt(signum, frame):  # SIGTERM ends the run the way Ctrl-C does: the servers are stopped on the way out
    raise KeyboardInterrupt


def main(argv=None) -> int:
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, interrupt)
    targets = build_targets(a)
    names = list(targets)
    log_dir = Path(a.log_dir) if a.log_dir else Path(tempfile.mkdtemp(prefix="serving-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "records" / f"serving-{time.strftime('%Y-%m-%d')}.json"
    if out.exists() and not a.out:
        out = out.with_name(f"{out.stem}-{time.strftime('%H%M%S')}.json")
    record = {
        "benchmark": "serving",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv,
        "settings": {
            "streams": a.stream_levels,
            "requests_per_client": a.requests_per_client,
            "repeats": a.repeats,
            "max_tokens": a.max_tokens,
            "temperature": 0,
            "system": SYSTEM,
            "prompts": f"{TICKETS.relative_to(ROOT)} bodies, shuffled with seed 0; client c request r = ticket c*R+r",
            "order": "for each repeat, for each level, for each target: fresh start, 1 warm-up request, the load",
        },
        "targets": {n: {"command": t.command, "url": t.url, "model": t.model} for n, t in targets.items()},
        "machine": machine(),
        "versions": versions(targets),
        "log_dir": str(log_dir),
        "cells": [],
    }
    log(f"targets {', '.join(names)}; levels {a.stream_levels}; {a.repeats} repeat(s); logs in {log_dir}")
    started = time.perf_counter()
    try:
        for repeat in range(a.repeats):
            for level in a.stream_levels:
                for name in names:
                    target = targets[name]
                    tag = f"r{repeat}-s{level}-{name}"
                    # the 1-minute load average around the cell: on a shared machine, how much else was running
                    cell = {"repeat": repeat, "streams": level, "target": name, "loadavg_before": os.getloadavg()[0]}
                    try:
                        cell.update(measure(target, level, a, log_dir, tag))
                    except Exception as exc:  # a target that
                        # fails to start or to answer is recorded and skipped; the others go on
                        cell["error"] = f"{type(exc).__name__}: {exc}"
                        log(f"{tag}: failed: {cell['error']}")
                    cell["loadavg_after"] = os.getloadavg()[0]
                    record["cells"].append(cell)
                    if "summary" in cell:
                        summary = cell["summary"]
                        log(
                            f"{tag}: {summary['tokens_per_s']:.1f} tokens/s, TTFT p50 {summary['ttft_p50'] or 0:.2f} s "
                            f"p99 {summary['ttft_p99'] or 0:.2f} s, ITL p50 {1000 * (summary['itl_p50'] or 0):.1f} ms, "
                            f"{summary['failed']} failed (ready in {cell['ready_s']:.1f} s; load average "
                            f"{cell['loadavg_before']:.1f} -> {cell['loadavg_after']:.1f} on {os.cpu_count()} cores)"
                        )
                    record["wall_s"] = time.perf_counter() - started
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps(record, indent=1) + "\n")
    except KeyboardInterrupt:
        log("interrupted: stopping the servers; the record keeps the levels that finished")
        record["interrupted"] = True
    finally:
        for server in list(Server.live):
            server.stop()
    if not any("summary" in c for c in record["cells"]):
        return 1
    record["agreement"] = agreement(record["cells"], names)
    record["table"] = table(record["cells"], names, a.stream_levels)
    record["wall_s"] = time.perf_counter() - started
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    m = record["machine"]
    print(
        f"Serving benchmark, {record['started']}, {m['cpu']} ({m['cores']} cores); {a.requests_per_client} streaming "
        f"requests per client, {a.max_tokens} greedy tokens at most; median over {a.repeats} repeat(s) (min-max).\n"
    )
    print(record["table"])
    failed = [f"{c['target']} at {c['streams']} streams: {c['error']}" for c in record["cells"] if "error" in c]
    if failed:
        print("\nNot measured:\n" + "\n".join(f"- {line.splitlines()[0]}" for line in failed))
    print("\nGreedy replies:\n" + "\n".join(agreement_lines(record["agreement"])))
    print(f"\nrecord: {out}")
    return 130 if record.get("interrupted") else 0


if __name__ == "__main__":
    raise SystemExit(main())
