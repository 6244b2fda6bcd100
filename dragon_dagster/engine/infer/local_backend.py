"""`LocalBackend`: transformers in this process, with the models it loaded kept in a module-level cache.

The last `keep_loaded` models (across all LocalBackends, keyed by model, device and dtype) stay loaded, so repeated
calls pay the model load once (dragonfarm's dragon_backend_local); `cache_stats` says how often it loaded, found
or evicted one. Replies come from generation.generate, streamed ones from local_stream.stream_generate (the same
decoding). Framework-free: nothing here imports Dagster.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from ..config.hardware import DEVICES, DTYPES, Hardware
from .backend import Backend, BackendError
from .conversation import as_conversation
from .local_stream import stream_generate

_LOADED: OrderedDict[tuple[str, str, str], dict] = OrderedDict()  # key -> {"model", "tokenizer", "lock", ...}
_CACHE_LOCK = threading.Lock()
_STATS = {"loads": 0, "hits": 0, "evictions": 0}


def cache_stats() -> dict:
    """How often LocalBackend loaded a model, found it already loaded, or evicted one; what is loaded now."""
    with _CACHE_LOCK:
        return {**_STATS, "loaded": [list(key) for key in _LOADED]}


def clear_cache() -> None:
    """Unload every model LocalBackend keeps and reset the counters."""
    with _CACHE_LOCK:
        _LOADED.clear()
        _STATS.update(loads=0, hits=0, evictions=0)


def _is_artifact(path: Path) -> bool:
    from ..artifacts.manifest import manifest_kind

    return manifest_kind(path) in ("adapter", "merged_model")


class LocalBackend(Backend):
    """transformers in this process. `model` is a preset name, a hub id, a model directory, or an adapter or
    merged-model artifact directory. The last `keep_loaded` models (across all LocalBackends, keyed by
    model, device and dtype) stay loaded; keep_loaded=0 loads for every call and keeps nothing. Tools are
    rendered by the model's chat template, readied once per loaded model by tools/template.prepare (a merged
    model of a pipeline with tools saved it readied already)."""

    supports_tools = True

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: str = "auto",
        keep_loaded: int = 2,
        batch_size: int = 8,
        seed: int = 42,
    ):
        if not model or not isinstance(model, (str, Path)):
            raise BackendError(f"LocalBackend needs a model (preset, hub id or directory), got {model!r}")
        if device not in DEVICES or dtype not in DTYPES:
            raise BackendError(
                f"LocalBackend: device must be one of {DEVICES} and dtype one of {DTYPES}, got {device!r}, {dtype!r}"
            )
        if not isinstance(keep_loaded, int) or keep_loaded < 0:
            raise BackendError(f"keep_loaded must be an integer >= 0, got {keep_loaded!r}")
        path = Path(str(model)).expanduser()
        self.model = str(path.resolve()) if path.exists() else str(model)
        self.device, self.dtype = device, dtype
        self.keep_loaded, self.batch_size, self.seed = keep_loaded, batch_size, seed

    @property
    def identity(self) -> str:
        return f"local:{self.model}"

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.model, self.device, self.dtype)

    def _load(self) -> dict:
        from .. import models

        hardware = Hardware(device=self.device, dtype=self.dtype)
        path = Path(self.model)
        try:
            if path.is_dir() and _is_artifact(path):
                model, tokenizer, description = models.load_artifact_model(path, hardware=hardware)
            else:
                resolved = models.resolve(self.model)
                model, tokenizer = models.load_model(resolved, hardware), models.load_tokenizer(resolved)
                description = f"model {resolved}"
        except (models.ModelError, OSError, ValueError, KeyError) as exc:
            raise BackendError(f"LocalBackend cannot load {self.model!r}: {exc}") from exc
        return {"model": model, "tokenizer": tokenizer, "description": description, "lock": threading.Lock()}

    def loaded(self) -> dict:
        """The loaded model entry, from the cache when it is there (loading once under a lock otherwise)."""
        with _CACHE_LOCK:
            entry = _LOADED.get(self.key)
            if entry is not None:
                _LOADED.move_to_end(self.key)
                _STATS["hits"] += 1
                return entry
            entry = self._load()
            _STATS["loads"] += 1
            if self.keep_loaded > 0:
                _LOADED[self.key] = entry
                while len(_LOADED) > self.keep_loaded:
                    _LOADED.popitem(last=False)
                    _STATS["evictions"] += 1
            return entry

    def rendering(self, entry: dict) -> str:
        """Ready the loaded model's tokenizer to render tools (once), and say how: "native" or "fallback"."""
        from ..tools.template import TemplateError, prepare

        with entry["lock"]:
            if "rendering" not in entry:
                try:
                    entry["rendering"] = prepare(entry["tokenizer"])
                except TemplateError as exc:
                    raise BackendError(f"{self.model}: {exc}") from exc
            return entry["rendering"]

    def usage(self, conversation: list[dict], reply: str, tools: list[dict] | None = None) -> dict | None:
        """Counted with the model's own tokenizer and chat template (the prompt as generation rendered it)."""
        try:
            tokenizer = self.loaded()["tokenizer"]
            text = tokenizer.apply_chat_template(
                as_conversation(conversation), tools=tools or None, add_generation_prompt=True, tokenize=False
            )
            prompt = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            answer = len(tokenizer(reply, add_special_tokens=False)["input_ids"])
        except Exception:  # noqa: BLE001 - counts are for the trace; a template that fails here gives none
            return None
        return {"input_tokens": prompt, "output_tokens": answer, "total_tokens": prompt + answer}

    def _chat(self, conversations, *, max_new_tokens, temperature, top_p, tools=None):
        from .generation import generate

        entry = self.loaded()
        if tools:
            self.rendering(entry)
        with entry["lock"]:  # generate() sets tokenizer padding; one batch at a time per model
            return generate(
                entry["model"],
                entry["tokenizer"],
                conversations,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                batch_size=self.batch_size,
                seed=self.seed,
                tools=tools,
            )

    def _stream(self, conversation, *, max_new_tokens, temperature, top_p, stop, tools=None):
        entry = self.loaded()
        if tools:
            self.rendering(entry)
        yield from stream_generate(
            entry["model"],
            entry["tokenizer"],
            conversation,
            stop,
            lock=entry["lock"],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=self.seed,
            tools=tools,
        )
