"""A server made from `dragon serve`'s arguments, and run under uvicorn.

Targets are registered names (`support`, `models:/support@champion`: the champion, swapped when it moves) or
directories and asset names (`support/merged_model`, an artifact directory: served as they are, under the
pipeline's name). Traces go to the tracking URI the pipelines use (MLflowTracking), ratings to each name's
feedback store (ArtifactStore: SQLite under the runs directory, or $DRAGON_FEEDBACK_URL).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.serve.batching import BatchingEngine, BatchingOptions
from .access import Keys, Limits
from .app import Policy, Server, create_app
from .metrics import Metrics
from .models import Asked, Models
from .traces import Traces

log = logging.getLogger("dragon_dagster.serve")


@dataclass
class Options:
    targets: list[str]
    host: str = "127.0.0.1"
    port: int = 8000
    keys_file: str | None = None
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    policy: Policy = field(default_factory=Policy)
    batching: BatchingOptions = field(default_factory=BatchingOptions)
    challenger_share: float = 0.0
    watch_s: float = 10.0
    trace: bool = True
    upstream_url: str | None = None  # an OpenAI-compatible server that decodes (one model: no swap)
    upstream_model: str | None = None
    llama_server: str | None = None  # llama.cpp's llama-server binary, started per version on its GGUF
    parallel: int = 16  # llama-server's slots


def _directory_target(target: str) -> Path | None:
    """A directory or asset name (its latest artifact); None for a registry name."""
    if target.startswith("models:/"):
        return None
    path = Path(target)
    if path.is_dir():
        return path
    if "/" in target and not target.split("/", 1)[1].isdigit():
        from ..chat_target import ChatTargetError, resolve_target

        try:
            return resolve_target(target)
        except ChatTargetError:
            return None
    return None


def build(options: Options) -> tuple[Server, Models]:
    """The server and its models, loaded (a champion that cannot load is an error here, before listening)."""
    from ..engine.models import servable_dir
    from ..resources.storage import ArtifactStore
    from ..resources.tracking import MLflowTracking

    tracking = MLflowTracking()
    store = ArtifactStore()
    metrics = Metrics()

    make_engine = engine_factory(options, store.root / "served")

    directories = {t: _directory_target(t) for t in options.targets}
    registry = any(d is None for d in directories.values())
    models = Models(
        client=tracking.client() if registry else None,
        cache=store.root / "served",
        make_engine=make_engine,
        metrics=metrics,
        challenger_share=options.challenger_share,
        watch_s=options.watch_s,
    )
    for target, directory in directories.items():
        if directory is None:
            asked = Asked.parse(target)
            models.add_registered(asked.name)
        else:
            name = _pipeline_of(directory)
            models.add_directory(name, servable_dir(directory))
    traces = Traces(tracking.uri if options.trace else None, functools.cache(tracking.experiment_id))
    stores = functools.cache(lambda name: store.feedback_store(name))
    keys = Keys.load(options.keys_file)
    limits = Limits(options.requests_per_minute, options.tokens_per_minute)
    server = Server(models, keys, limits, traces, stores, options.policy, metrics)
    return server, models


def engine_factory(options: Options, cache: Path):
    """What decodes each version: the built-in batcher, a llama-server started for it, or a given upstream."""
    if options.upstream_url:
        from ..engine.serve.upstream import UpstreamEngine

        def upstream(directory: Path, label: str) -> UpstreamEngine:
            return UpstreamEngine(
                options.upstream_url,
                options.upstream_model or label.split("/")[0],
                label,
                tokenizer_dir=directory,
                api_key=os.environ.get("DRAGON_UPSTREAM_KEY"),
            )

        return upstream
    if options.llama_server:
        from ..engine.serve.upstream import LlamaServer

        return LlamaServer(options.llama_server, cache, parallel=options.parallel)

    def builtin(directory: Path, label: str) -> BatchingEngine:
        return BatchingEngine(directory, label, options.batching)

    return builtin


def _pipeline_of(directory: Path) -> str:
    """The pipeline an artifact belongs to (runs/artifacts/<pipeline>/<stage>/<id>), else the directory's name."""
    parts = Path(directory).resolve().parts
    if "artifacts" in parts and len(parts) > parts.index("artifacts") + 1:
        return parts[parts.index("artifacts") + 1]
    return Path(directory).name


def serve(options: Options) -> None:
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per upstream call: our own request line says it
    keys = Keys.load(options.keys_file)  # a bad keys file stops here, before any model loads
    if keys.open:
        log.warning(
            "OPEN: no API key is configured, so anyone who reaches %s:%s may call this server "
            "(set $DRAGON_SERVE_KEYS or --keys-file; `dragon serve-key NAME` makes one)",
            options.host,
            options.port,
        )
    else:
        log.info(
            "%d API key(s) configured: %s", len(keys.hashes), ", ".join(sorted(k.name for k in keys.hashes.values()))
        )
    if options.upstream_url and options.watch_s:
        log.info("decoding upstream at %s: one fixed model, so no hot swap (--watch is off)", options.upstream_url)
        options.watch_s = 0
    server, models = build(options)
    models.start_watching()
    app = create_app(server)
    base = f"http://{options.host}:{options.port}/v1"
    for entry in models.listing():
        log.info("serving %s (version %s) at %s", entry["id"], entry["version"], base)
    try:
        uvicorn.run(app, host=options.host, port=options.port, log_level="warning", access_log=False)
    finally:
        log.info("stopping: closing the served versions")
        models.close()
