"""An engine that is another OpenAI-compatible server: llama.cpp's `llama-server` on a version's GGUF, vLLM on a
GPU, or any server given by URL. The front keeps what such servers leave to a proxy (keys, limits, traces,
feedback, hot swap); the upstream only decodes.

Either the server is given (`base_url`, `model`: one fixed model, no swap) or `LlamaServer` starts one per version
on a GGUF written once from the version's model directory (the project's own GGUF export, f16) into a cache, with
`--parallel` slots and continuous batching, and stops it when the version is retired.

Prompt tokens are counted with the version's own tokenizer and chat template when it is on this machine (so a
prompt over the context is a 413 before it is sent); otherwise the upstream's answer decides.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

from .engine import Chunk, EngineBusy, EngineError, PromptTooLong, Sampling

log = logging.getLogger("dragon_dagster")


class UpstreamEngine:
    """Requests relayed to an OpenAI-compatible server, streamed back chunk by chunk."""

    def __init__(
        self,
        base_url: str,
        model: str,
        label: str,
        tokenizer_dir: str | Path | None = None,
        context_length: int | None = None,
        api_key: str | None = None,
        process: subprocess.Popen | None = None,
        timeout_s: float = 600.0,
    ):
        from openai import AsyncOpenAI

        self.base_url, self.model, self.label = base_url.rstrip("/"), model, label
        self.process = process
        self.client = AsyncOpenAI(base_url=self.base_url, api_key=api_key or "unused", max_retries=0, timeout=timeout_s)
        self.tokenizer = None
        if tokenizer_dir is not None and (Path(tokenizer_dir) / "tokenizer_config.json").exists():
            from ..models import load_tokenizer
            from ..tools.template import prepare

            self.tokenizer = load_tokenizer(str(tokenizer_dir))
            prepare(self.tokenizer)
        self.context_length = int(context_length or getattr(self.tokenizer, "model_max_length", 0) or 1 << 20)
        if self.context_length > 1 << 20:  # transformers' "no limit" placeholder
            self.context_length = 1 << 20
        self._waiting = 0
        self._in_flight = 0

    def prompt_tokens(self, messages: list[dict], tools: list[dict] | None) -> int:
        if self.tokenizer is None:
            return sum(len(str(m.get("content") or "")) for m in messages) // 4  # a guess; the upstream decides
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # noqa: BLE001 - a template's own error, named for the client
            raise EngineError(f"the chat template of {self.label} cannot render these messages: {exc}") from exc
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def queue_depth(self) -> int:
        return self._waiting

    def in_flight(self) -> int:
        return self._in_flight

    async def stream(self, messages: list[dict], tools: list[dict] | None, sampling: Sampling) -> AsyncIterator[Chunk]:
        import openai

        prompt = self.prompt_tokens(messages, tools)
        if self.tokenizer is not None and prompt + sampling.max_tokens > self.context_length:
            raise PromptTooLong(prompt, sampling.max_tokens, self.context_length)
        extra = {"seed": sampling.seed} if sampling.seed is not None else {}
        if tools:
            extra["tools"] = tools
        self._in_flight += 1
        self._waiting += 1
        waiting = True
        calls: dict[int, dict] = {}
        reason, usage = "stop", None
        try:
            try:
                stream = await self.client.chat.completions.create(
                    model=self.model,
                    messages=messages,
                    max_tokens=sampling.max_tokens,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    stop=list(sampling.stop) or None,
                    stream=True,
                    stream_options={"include_usage": True},
                    **extra,
                )
            except openai.RateLimitError as exc:
                raise EngineBusy(f"the upstream of {self.label} is busy: {exc}") from exc
            except openai.APIError as exc:
                raise EngineError(f"the upstream of {self.label} at {self.base_url} refused: {exc}") from exc
            async for part in stream:
                if waiting:
                    self._waiting -= 1
                    waiting = False
                if part.usage is not None:
                    usage = part.usage
                for choice in part.choices:
                    if choice.finish_reason:
                        reason = "stop" if choice.finish_reason == "tool_calls" else choice.finish_reason
                    for call in choice.delta.tool_calls or []:
                        entry = calls.setdefault(
                            call.index, {"type": "function", "function": {"name": "", "arguments": ""}}
                        )
                        if call.id:
                            entry["id"] = call.id
                        if call.function and call.function.name:
                            entry["function"]["name"] += call.function.name
                        if call.function and call.function.arguments:
                            entry["function"]["arguments"] += call.function.arguments
                    if choice.delta.content:
                        yield Chunk(choice.delta.content)
            yield Chunk(
                "",
                reason,
                usage.prompt_tokens if usage else prompt,
                usage.completion_tokens if usage else 0,
                [calls[i] for i in sorted(calls)],
            )
        finally:
            self._in_flight -= 1
            if waiting:
                self._waiting -= 1

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            log.info("stopping the upstream of %s (pid %s)", self.label, self.process.pid)
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()


class LlamaServer:
    """Starts llama.cpp's `llama-server` for a version: its GGUF (written once, f16) served with `parallel` slots."""

    def __init__(self, binary: str | Path, cache: Path, parallel: int = 16, context_per_slot: int = 2048):
        self.binary, self.cache = Path(binary), Path(cache)
        self.parallel, self.context_per_slot = parallel, context_per_slot
        if not self.binary.exists():
            raise EngineError(
                f"no llama-server at {self.binary}: build it from llama.cpp's source (docs/guides/serving.md says how)"
            )

    def gguf(self, model_dir: Path, label: str) -> Path:
        from ..release.export.gguf_file import write_gguf

        key = hashlib.sha256(str(Path(model_dir).resolve()).encode()).hexdigest()[:16]
        path = self.cache / "gguf" / f"{key}-f16.gguf"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.partial")
            write_gguf(model_dir, partial, "f16", {"name": label})
            partial.rename(path)
        return path

    def __call__(self, model_dir: Path, label: str) -> UpstreamEngine:
        import socket

        import requests

        gguf = self.gguf(Path(model_dir), label)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        log_path = self.cache / f"llama-server-{label.replace('/', '-')}.log"
        with log_path.open("w") as out:
            process = subprocess.Popen(
                [
                    str(self.binary),
                    "-m",
                    str(gguf),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--parallel",
                    str(self.parallel),
                    "-c",
                    str(self.parallel * self.context_per_slot),
                    "--jinja",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise EngineError(f"llama-server for {label} exited with {process.returncode}: see {log_path}")
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                process.kill()
                raise EngineError(f"llama-server for {label} did not answer within 120 s: see {log_path}")
            time.sleep(0.25)
        return UpstreamEngine(
            f"http://127.0.0.1:{port}/v1",
            "model",
            label,
            tokenizer_dir=model_dir,
            context_length=self.context_per_slot,
            process=process,
        )
