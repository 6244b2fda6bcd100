"""The models a server answers for, by registry name, and their hot swap.

A request's `model` is a name from the MLflow Model Registry: `support` is `models:/support@champion`,
`support@challenger` an alias, `support/3` one version (`models:/...` spelled out works too). A served name
loads its champion at start; aliases and pinned versions load on first use (503 with Retry-After while they
load). Each version is one engine; the response names the version that answered (`support/4`).

A watcher asks the registry every `watch_s` where each served alias points. When one moves (a retraining
promoted a new champion), the new version loads beside the old one and the alias switches in one assignment:
requests already running hold their engine and finish on the version they started on; the next request gets
the new one; the old engine is closed once its last request ends. A version that fails to load keeps the old
one serving, said in the log and in /metrics, and is not tried again until the alias moves on.

A directory (a merged model, an adapter chain, a model) can be served too, under a name of its own, with no
registry and no swap.

Champion and challenger on live traffic: with `challenger_share` > 0, that share of the callers of a bare name
(hashed from the caller's user id, so one user always meets the same version) is answered by the challenger.
The challenger loads at start, or when the watcher sees one registered later or the alias move; until it has
loaded (or when it cannot load) its share is answered by the champion. Each reply names its version, so ratings
count per version (the live gate: assets/live_gate.py).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.release.model_registry import CHAMPION, ModelRef, alias_version, model_dir
from ..engine.serve.engine import Engine, EngineError
from .metrics import Metrics
from .protocol import ServeError

log = logging.getLogger("dragon_dagster.serve")

CHALLENGER = "challenger"
NAME = re.compile(r"^(?:models:/)?(?P<name>[^@/]+)(?:@(?P<alias>[\w-]+)|/(?P<version>\d+))?$")
EngineFactory = Callable[[Path, str], Engine]  # (model directory, label) -> a loaded engine


@dataclass(frozen=True)
class Asked:
    """What a request's `model` names: a registered name and an alias or a version."""

    name: str
    alias: str | None = CHAMPION
    version: str | None = None

    @classmethod
    def parse(cls, model: str) -> Asked:
        found = NAME.match(model.strip())
        if not found:
            raise ServeError(
                404, f"model {model!r} is not NAME, NAME@ALIAS or NAME/VERSION", "model", "model_not_found"
            )
        if found["version"]:
            return cls(found["name"], None, found["version"])
        return cls(found["name"], found["alias"] or CHAMPION)

    @property
    def bare(self) -> bool:
        return self.alias == CHAMPION and self.version is None


@dataclass
class Served:
    """One loaded version: its engine and how many requests hold it."""

    name: str
    version: str
    engine: Engine
    holders: int = 0
    retired: bool = False

    @property
    def label(self) -> str:
        return f"{self.name}/{self.version}"


@dataclass
class Lease:
    """A request's hold on one version: released when the request ends, whatever the swaps meanwhile."""

    served: Served
    models: Models

    def release(self) -> None:
        self.models._release(self.served)


@dataclass
class Models:
    """The served names (registered models) and directories, their loaded versions, and the watcher."""

    client: object | None  # an MlflowClient of the registry; None when only directories are served
    cache: Path  # where registered versions are downloaded
    make_engine: EngineFactory
    metrics: Metrics
    names: list[str] = field(default_factory=list)
    challenger_share: float = 0.0
    watch_s: float = 10.0
    _versions: dict[tuple[str, str], Served] = field(default_factory=dict)  # (name, version) -> loaded
    _aliases: dict[tuple[str, str], str] = field(default_factory=dict)  # (name, alias) -> version
    _loading: set[tuple[str, str]] = field(default_factory=set)
    _failed: dict[tuple[str, str], str] = field(default_factory=dict)  # versions that would not load: why
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _watcher: threading.Thread | None = None

    # ----------------------------------------------------------------------------------------- loading

    def add_directory(self, name: str, directory: Path, version: str = "local") -> None:
        """Serve the model at `directory` as `name` (its champion, with no registry behind it)."""
        self._versions[(name, version)] = Served(name, version, self.make_engine(directory, f"{name}/{version}"))
        self._aliases[(name, CHAMPION)] = version
        self.names.append(name)
        self.metrics.served.labels(name, CHAMPION).set(0)

    def add_registered(self, name: str) -> None:
        """Serve the registered model `name`: its champion now (an error naming the fix when it has none)."""
        version = self._alias_now(name, CHAMPION)
        if version is None:
            raise EngineError(
                f"registered model {name!r} has no champion: promote a version first "
                f"(`dragon models {name} --promote VERSION`)"
            )
        self.names.append(name)
        self._load(name, version)
        with self._lock:
            self._aliases[(name, CHAMPION)] = version
        self.metrics.served.labels(name, CHAMPION).set(float(version))
        log.info("serving %s/%s as %s", name, version, name)
        challenger = self._alias_now(name, CHALLENGER) if self.challenger_share > 0 else None
        if challenger is not None:  # its share of the users is answered by the champion until it has loaded
            with self._lock:
                self._aliases[(name, CHALLENGER)] = challenger
            self.metrics.served.labels(name, CHALLENGER).set(float(challenger))
            self._load_later(name, challenger)
            log.info("%s@challenger is %s/%s: %g of the users once it has loaded", name, name, challenger,
                     self.challenger_share)  # fmt: skip

    def _alias_now(self, name: str, alias: str) -> str | None:
        if self.client is None:
            return self._aliases.get((name, alias))
        found = alias_version(self.client, name, alias)
        return None if found is None else str(found)

    def _load(self, name: str, version: str) -> Served:
        """Load (name, version) now, in the caller's thread; the loaded one when it is loaded already."""
        key = (name, version)
        with self._lock:
            if key in self._versions:
                return self._versions[key]
            self._loading.add(key)
        try:
            directory = model_dir(self.client, ModelRef(name=name, version=str(version)), self.cache)
            engine = self.make_engine(directory, f"{name}/{version}")
        except Exception as exc:
            self._failed[key] = f"{type(exc).__name__}: {exc}"
            self.metrics.load_failures.labels(name, version).inc()
            raise
        finally:
            with self._lock:
                self._loading.discard(key)
        served = Served(name, version, engine)
        with self._lock:
            self._versions[key] = served
        return served

    def _load_later(self, name: str, version: str) -> None:
        key = (name, version)
        with self._lock:
            if key in self._loading or key in self._versions:
                return
            self._loading.add(key)

        def run() -> None:
            with self._lock:
                self._loading.discard(key)
            try:
                self._load(name, version)
            except Exception as exc:  # noqa: BLE001 - said, and the request that asked got its 503
                log.error("cannot load %s/%s: %s", name, version, exc)

        threading.Thread(target=run, name=f"dragon-load-{name}-{version}", daemon=True).start()

    # ----------------------------------------------------------------------------------------- requests

    def lease(self, model: str, user: str) -> Lease:
        """The version that answers this request, held until the lease is released."""
        asked = Asked.parse(model)
        if asked.name not in self.names:
            raise ServeError(
                404,
                f"the model {asked.name!r} does not exist here; served: {', '.join(self.names) or 'none'}",
                "model",
                "model_not_found",
            )
        alias = asked.alias
        if asked.bare and self.challenger_share > 0 and self._in_challenger_share(user):
            alias = CHALLENGER if self._challenger_ready(asked.name) else CHAMPION
        version = asked.version or self._aliases.get((asked.name, alias))
        if version is None and alias is not None:
            version = self._alias_now(asked.name, alias)
            if version is None:
                raise ServeError(404, f"{asked.name}@{alias} is not set in the registry", "model", "model_not_found")
            with self._lock:
                self._aliases[(asked.name, alias)] = version
        key = (asked.name, str(version))
        with self._lock:
            served = self._versions.get(key)
            if served is not None:
                served.holders += 1
                return Lease(served, self)
        if key in self._failed:
            raise ServeError(
                503, f"{asked.name}/{version} cannot be loaded: {self._failed[key]}", "model", "model_unavailable"
            )
        if self.client is None:
            raise ServeError(404, f"{asked.name}/{version} is not served here", "model", "model_not_found")
        if asked.version is not None and not self._registered(asked.name, str(version)):
            raise ServeError(404, f"{asked.name} has no version {version} in the registry", "model", "model_not_found")
        self._load_later(asked.name, str(version))
        raise ServeError(
            503, f"{asked.name}/{version} is loading; try again shortly", "model", "model_loading", {"Retry-After": "5"}
        )

    def _challenger_ready(self, name: str) -> bool:
        """Whether name@challenger is set and loaded (until then, or when it cannot load, the champion answers)."""
        with self._lock:
            version = self._aliases.get((name, CHALLENGER))
            return version is not None and (name, version) in self._versions

    def _registered(self, name: str, version: str) -> bool:
        from ..engine.release.model_registry import NotRegistered, version_of

        try:
            version_of(self.client, ModelRef(name=name, version=version))
        except NotRegistered:
            return False
        return True

    def _in_challenger_share(self, user: str) -> bool:
        bucket = int(hashlib.sha256(user.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        return bucket < self.challenger_share

    def _release(self, served: Served) -> None:
        with self._lock:
            served.holders -= 1
            close = served.retired and served.holders == 0
        if close:
            self._close(served)

    def _close(self, served: Served) -> None:
        log.info("%s no longer served: closed", served.label)
        served.engine.close()

    # ----------------------------------------------------------------------------------------- swaps

    def engines(self) -> list[Engine]:
        with self._lock:
            return [served.engine for served in self._versions.values()]

    def ready(self) -> bool:
        with self._lock:
            return all((name, CHAMPION) in self._aliases for name in self.names) and bool(self.names)

    def listing(self) -> list[dict]:
        with self._lock:
            return [
                {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "dragon-dagster",
                    "version": self._aliases.get((name, CHAMPION)),
                }
                for name in self.names
            ]

    def start_watching(self) -> None:
        if self.client is None or self.watch_s <= 0:
            return
        self._watcher = threading.Thread(target=self._watch, name="dragon-registry-watch", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.watch_s):
            try:
                self.check_aliases()
            except Exception as exc:  # noqa: BLE001 - the registry may be away a while: the old versions serve on
                log.warning("cannot read the model registry: %s", exc)

    def check_aliases(self) -> list[str]:
        """Move every watched alias to where the registry points now (loading first); what moved."""
        moved = []
        with self._lock:
            watched = dict(self._aliases)
        if self.challenger_share > 0:  # a challenger registered after the start gets its share too
            watched.update({(n, CHALLENGER): None for n in self.names if (n, CHALLENGER) not in watched})
        for (name, alias), current in watched.items():
            now = self._alias_now(name, alias)
            if now is None or now == current or (name, now) in self._failed:
                continue
            try:
                self._load(name, now)
            except Exception as exc:  # noqa: BLE001 - any load failure: the old version keeps serving
                log.error(
                    "%s@%s moved to version %s, which cannot be loaded (%s); %s/%s keeps serving",
                    name,
                    alias,
                    now,
                    exc,
                    name,
                    current,
                )
                continue
            self._switch(name, alias, current, now)
            moved.append(f"{name}@{alias}: {current} -> {now}")
        return moved

    def _switch(self, name: str, alias: str, old: str, new: str) -> None:
        with self._lock:
            self._aliases[(name, alias)] = new
            still_used = any(v == old and n == name for (n, _), v in self._aliases.items())
            previous = self._versions.get((name, old))
            close = False
            if previous is not None and not still_used:
                del self._versions[(name, old)]
                previous.retired = True
                close = previous.holders == 0
        self.metrics.served.labels(name, alias).set(float(new))
        log.info(
            "%s@%s is now version %s (was %s)%s",
            name,
            alias,
            new,
            old,
            "" if previous is None or still_used else f"; {name}/{old} closes after its last request",
        )
        if close:
            self._close(previous)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            versions, self._versions = list(self._versions.values()), {}
        for served in versions:
            served.engine.close()


def wait_loaded(models: Models, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not models.ready() and time.monotonic() < deadline:
        time.sleep(0.1)
