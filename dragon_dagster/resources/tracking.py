"""MLflow tracking: one experiment per pipeline, one run per training materialization."""

from __future__ import annotations

import getpass
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from ..engine.release import model_registry as registry
from ..engine.text.uris import TRAINING_VIEW, tracking_server, without_password
from . import tracking_records as records
from . import tracking_store as store
from .mlflow_scope import mlflow_scope
from .storage import default_runs_dir

logger = logging.getLogger(__name__)
# MLflow says at INFO each time it creates or upgrades a store's tables ("Creating initial MLflow database
# tables..."): a fresh sqlite store is made here on first use, as intended, and there is nothing for a user to do.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)

_CHECKED: set[str] = set()  # stores this process has connected to
_READY: set[str] = set()  # sqlite stores this process has seen created
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "finetuning"
LEVEL_TAG = "level"  # sweep > pipeline (one per Dagster run) > stage: how the runs nest (mlflow.parentRunId)


def ui_url(ui: str, default_port: int, configured: str = "") -> str:
    """A UI's address for links (no trailing slash): configured, else $<UI>_UI_URL, else where `make ui` serves it
    on loopback ($<UI>_PORT, or default_port)."""
    port = os.environ.get(f"{ui}_PORT") or default_port
    return (configured or os.environ.get(f"{ui}_UI_URL") or f"http://127.0.0.1:{port}").rstrip("/")


def mlflow_ui_url(configured: str = "", tracking_uri: str = "") -> str:
    """MLflow's UI for links: configured, else $MLFLOW_UI_URL, else the tracking server when tracking_uri names
    one (a server is its own UI: a loopback port would show another store, or nothing), else where `make ui`
    serves it on loopback."""
    return ui_url("MLFLOW", 5000, configured or os.environ.get("MLFLOW_UI_URL") or tracking_server(tracking_uri) or "")


def dagster_ui_url() -> str:
    return ui_url("DAGSTER", 3000)


ERROR_TAG, CANCELLED_TAG = "error", "cancelled"  # on a run that ended FAILED, KILLED: why


def ended_as(exc: BaseException) -> tuple[str, str, str]:
    """How a run whose work raised exc ends: (MLflow status, the tag that says why, why). A cancel is KILLED:
    Dagster's run termination (DagsterExecutionInterruptedError), Ctrl-C and a worker's own stop are
    BaseExceptions, not Exceptions, and a trainer stopped on request raises Cancelled; anything else FAILED."""
    from ..engine.train.trainer import Cancelled

    what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, Cancelled) or not isinstance(exc, Exception):
        return "KILLED", CANCELLED_TAG, what
    return "FAILED", ERROR_TAG, what


@dataclass(frozen=True)
class LiveModel:
    """The model people chat with: its directory, its name for people, and its registry URI and version when it
    is the champion (None for a merged model not yet promoted)."""

    directory: Path
    name: str
    uri: str | None = None
    version: str | None = None


class MLflowTracking(ConfigurableResource):
    """Logs params, step metrics, eval metrics, lineage tags and artifacts to an MLflow tracking server."""

    tracking_uri: str = Field(
        default="",
        description="MLflow tracking URI: a tracking server (http[s]://host:port) or a database "
        "(postgresql://user:password@host/db); either is connected to once on first use and refused in seconds, "
        "naming this setting, when it does not answer. Empty: $MLFLOW_TRACKING_URI when set, else a sqlite store "
        "in the runs dir.",
    )
    ui_url: str = Field(
        default="",
        description="Where MLflow's UI is served, for links. Empty: $MLFLOW_UI_URL when set, else the tracking "
        "server when the tracking URI names one, else where `make ui` serves it (http://127.0.0.1:$MLFLOW_PORT, "
        "port 5000 by default).",
    )
    runs_dir: str = Field(default="", description="Runs directory for the default sqlite store and artifacts.")

    @property
    def ui(self) -> str:
        """The MLflow UI's address that links start with (ui_url, resolved; no trailing slash)."""
        return mlflow_ui_url(self.ui_url, self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", ""))

    @property
    def root(self) -> Path:
        return Path(self.runs_dir).resolve() if self.runs_dir else default_runs_dir()

    @property
    def uri(self) -> str:
        """MLflow's own convention first: the resource's setting, then $MLFLOW_TRACKING_URI, then our sqlite."""
        if self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"):
            return self.tracking_uri or os.environ["MLFLOW_TRACKING_URI"]
        self.root.mkdir(parents=True, exist_ok=True)
        return self.default_uri()

    def default_uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"

    @property
    def setting(self) -> str:
        """Where uri comes from, as a message names it."""
        if self.tracking_uri:
            return "MLflowTracking.tracking_uri"
        return "$MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "MLflowTracking.runs_dir"

    @property
    def shown_uri(self) -> str:
        """uri as messages, logs and records show it: without its password."""
        return without_password(self.uri)

    def client(self):
        """A client on the store; the first use of a database or a server in this process checks that it takes a
        connection (check_store), so a wrong host, port or password is one clear error within seconds."""
        from mlflow import MlflowClient

        uri = self.uri
        if uri.startswith("sqlite:") and uri not in _READY:
            store.create_store_once(uri, self.root / ".mlflow.db.lock")
            _READY.add(uri)
        elif uri not in _CHECKED:
            store.check_store(uri, self.setting)
            _CHECKED.add(uri)
        return MlflowClient(uri)

    def artifact_location(self, pipeline: str) -> str | None:
        """Where a pipeline's experiment keeps artifacts: beside the default sqlite store in the runs dir, not
        in the current directory; None (MLflow's choice) for a tracking_uri of the user's."""
        if self.uri != self.default_uri():
            return None
        return (self.root / "mlartifacts" / pipeline).as_uri()

    def experiment_id(self, pipeline: str) -> str:
        client = self.client()
        experiment = client.get_experiment_by_name(pipeline)
        if experiment is not None:
            self.check_location(experiment)
            if EXPERIMENT_KIND_TAG not in experiment.tags:  # made before the tag was set
                client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            return experiment.experiment_id
        try:  # the kind tag opens the experiment on MLflow's model-training view, not the GenAI overview
            return client.create_experiment(
                pipeline,
                artifact_location=self.artifact_location(pipeline),
                tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
            )
        except Exception:  # created by a concurrent run in the meantime
            return client.get_experiment_by_name(pipeline).experiment_id

    def check_location(self, experiment) -> None:
        """An experiment of the default store moved along with the runs dir, or refused when its artifacts are
        elsewhere (tracking_store.keep_relocatable)."""
        expected = self.artifact_location(experiment.name)
        store.keep_relocatable(self.client(), experiment, expected, self.root, self.uri)

    def start_run(
        self,
        pipeline: str,
        run_name: str,
        tags: dict[str, str],
        params: dict,
        parent: str | None = None,
        description: str = "",
        source: str = "",
        start_time: float | None = None,
    ) -> str:
        """A run in the pipeline's experiment. parent: the run it nests under; description: the run page's
        note; source: what ran it (the Source column); start_time: when the work began (seconds), if earlier
        than now, so the run's duration is the work's and not the logging's."""
        client = self.client()
        tags = {
            "mlflow.user": getpass.getuser(),
            "mlflow.source.type": "JOB",
            "mlflow.source.name": source or f"dagster: {pipeline}",
            "mlflow.note.content": description or None,
            "mlflow.parentRunId": parent,
            **tags,
        }
        run = client.create_run(
            self.experiment_id(pipeline),
            run_name=run_name,
            tags={k: str(v) for k, v in tags.items() if v is not None},
            start_time=int(start_time * 1000) if start_time else None,
        )
        if logged := records.params(params):
            client.log_batch(run.info.run_id, params=logged)
        return run.info.run_id

    def parent_run(
        self,
        pipeline: str,
        key: dict[str, str],
        run_name: str,
        tags: dict,
        params: dict,
        description: str = "",
        parent: Callable[[], str | None] | None = None,
        artifact: tuple[str, str] | None = None,
    ) -> str:
        """The run that groups others (a Dagster run's stages, a sweep's points): found by its key tags, created
        once. Steps of one Dagster run start in parallel processes, so finding and creating hold a file lock.
        parent: what finds or makes the run this one nests under, called only while this one is not there yet
        (every stage of a Dagster run asks for its run; the first creates it), before the lock is taken: making a
        sweep's run takes that lock itself. artifact: (file name, text) logged when it is created, so no run in
        the experiment is without one (MLflow's compare page fails on a run without artifacts)."""
        client = self.client()
        experiment = self.experiment_id(pipeline)
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in key.items())

        def found() -> str | None:
            runs = client.search_runs([experiment], query, max_results=1)
            if not runs:
                return None
            client.update_run(runs[0].info.run_id, status="RUNNING")
            return runs[0].info.run_id

        run_id = found()
        if run_id:
            return run_id
        parent_id = parent() if parent is not None else None
        with store.file_lock(self.root / ".mlflow-parents.lock"):
            run_id = found()  # made by another step while this one waited
            if run_id:
                return run_id
            run_id = self.start_run(
                pipeline, run_name, {**tags, **key}, params, parent=parent_id, description=description
            )
            if artifact is not None:
                client.log_text(run_id, artifact[1], artifact[0])
            return run_id

    def log_metrics(
        self, run_id: str, values: dict, step: int = 0, finite_only: bool = True, model_id: str | None = None
    ) -> None:
        """finite_only=False keeps NaN and inf: a training step's NaN loss is worth seeing on the chart.
        model_id: an MLflow logged model the figures describe (shown on its page and its registered version)."""
        found = records.metrics(values, step, finite_only, model_id)
        if found:
            self.client().log_batch(run_id, metrics=found)

    def log_datasets(self, run_id: str, dataset_dir: Path, name: str, files: dict[str, Path]) -> None:
        """The run's data as MLflow dataset inputs (its Dataset column and lineage): one per split file, named
        after the dataset asset, with the file's digest and the artifact directory as its source. files: MLflow
        context ("training", "evaluation") -> JSONL file; missing files are left out."""
        inputs = records.dataset_inputs(dataset_dir, name, files)
        if inputs:
            self.client().log_inputs(run_id, datasets=inputs)

    def log_artifacts(self, run_id: str, paths: list[Path], artifact_path: str | None = None) -> None:
        client = self.client()
        for path in paths:
            path = Path(path)
            if path.is_dir():
                client.log_artifacts(run_id, str(path), artifact_path=artifact_path or path.name)
            elif path.exists():
                client.log_artifact(run_id, str(path), artifact_path=artifact_path)

    def log_image(self, run_id: str, path: Path, key: str) -> None:
        """A PNG as an MLflow image under `key`: the chart view shows it as a chart card in the section of the
        key's prefix (sections sort by name), the run page under its images."""
        from PIL import Image

        with Image.open(path) as image:
            self.client().log_image(run_id, image.convert("RGB"), key=key, step=0)

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client().set_terminated(run_id, status=status)

    @contextmanager
    def started(self, pipeline: str, run_name: str, tags: dict[str, str], params: dict, **run) -> Iterator[str]:
        """A run (start_run's arguments) whose life the block owns (owning): yields its id."""
        run_id = self.start_run(pipeline, run_name, tags, params, **run)
        with self.owning(run_id):
            yield run_id

    @contextmanager
    def owning(self, *run_ids: str | None, where: str = "") -> Iterator[None]:
        """The life of the MLflow runs a block of work opened (a stage's run, the pipeline run it set running): they
        end when the block does, FINISHED when it returns, FAILED with the error as their `error` tag when it
        raises, KILLED with what stopped it as their `cancelled` tag when it is cancelled (ended_as). where: what
        the block is (a stage's name), written before the error, since a pipeline run outlives its stages. Ending
        after a failure is best effort: the store may be what failed, and the block's own error is what goes on."""
        try:
            yield
        except BaseException as exc:
            status, tag, why = ended_as(exc)
            why = f"{where}: {why}" if where else why
            for run_id in filter(None, run_ids):
                try:
                    client = self.client()
                    client.set_tag(run_id, tag, why[:5000])
                    client.set_terminated(run_id, status=status)
                except Exception as problem:  # noqa: BLE001 - the block's error is the one to raise
                    logger.warning(f"MLflow run {run_id} could not be ended {status} ({why}): {problem}")
            raise
        for run_id in filter(None, run_ids):
            self.end_run(run_id)

    def run_url(self, pipeline: str, run_id: str) -> str:
        return f"{self.ui}/#/experiments/{self.experiment_id(pipeline)}/runs/{run_id}?{TRAINING_VIEW}"

    def runs_url(self, pipeline: str, charts: bool = False) -> str:
        """The experiment's model-training runs (the pipeline runs, their stages nested under them); charts: the
        chart view, where the pipeline runs' held-out NLL over their stages is one line each."""
        view = "&compareRunsMode=CHART" if charts else ""
        return f"{self.ui}/#/experiments/{self.experiment_id(pipeline)}/runs?{TRAINING_VIEW}{view}"

    def ui_page(self, pipeline: str, page: str) -> str:
        """One of the experiment's pages in the MLflow UI: traces (every chat turn), chat-sessions (the turns by
        conversation), evaluation-runs (base and merged row by row), prompts."""
        return f"{self.ui}/#/experiments/{self.experiment_id(pipeline)}/{page}"

    def prompt_url(self, pipeline: str) -> str:
        """The pipeline's system prompt in the Prompt Registry: its versions, their diff, the live alias."""
        from ..engine.release.prompt_registry import prompt_name

        return f"{self.ui}/#/prompts/{prompt_name(pipeline)}"

    # --- the model registry: which model is live (engine/model_registry.py) ---

    def register_model(
        self, pipeline: str, model_dir: Path, run_id: str | None, tags: dict, description: str = ""
    ) -> str:
        """Log model_dir as an MLflow model on run_id (the run that trained it) and register it as a new
        version of the pipeline's registered model, aliased `challenger`; returns the version."""
        client, experiment = self.client(), self.experiment_id(pipeline)
        with mlflow_scope(self.uri, experiment):  # the registry resolves models:/<model_id> through MLflow's globals
            return registry.log_and_register(
                client,
                experiment,
                pipeline,
                Path(model_dir),
                run_id,
                {k: str(v)[:5000] for k, v in tags.items() if v is not None},
                scratch=self.root / ".staging",
                description=description,
            )

    def promote(self, pipeline: str, version: str, reason: str) -> str | None:
        """Make version the champion; returns the version it replaced (None for the first)."""
        client = self.client()
        before = registry.alias_version(client, pipeline, registry.CHAMPION)
        client.set_registered_model_alias(pipeline, registry.CHAMPION, str(version))
        client.set_model_version_tag(pipeline, str(version), "promoted", reason[:5000])
        return before

    def champion_dir(self, pipeline: str) -> Path | None:
        """The champion's model directory (local or downloaded); None when there is no champion yet."""
        client = self.client()
        if registry.alias_version(client, pipeline, registry.CHAMPION) is None:
            return None
        return registry.model_dir(
            client, registry.ModelRef(pipeline, alias=registry.CHAMPION), self.root / "cache" / "models"
        )

    def live_model(self, pipeline: str, runs_dir: Path, merge_stage: str = "merged_model") -> Path | None:
        """The model people chat with and retraining starts from: the champion, else (no gate has passed yet)
        the latest merged model under runs_dir; None when there is neither."""
        live = self.live_model_named(pipeline, runs_dir, merge_stage)
        return live.directory if live is not None else None

    def live_model_named(self, pipeline: str, runs_dir: Path, merge_stage: str = "merged_model") -> LiveModel | None:
        """live_model's directory and what it is: the registry's champion (named `models:/<pipeline>@champion
        (version N)` for people, as the chat page's header shows it), or the latest merged model when no gate has
        passed yet (`latest merged model (not yet promoted): <artifact dir name>`); None when there is neither."""
        from ..engine.runs import latest_artifact

        client = self.client()
        version = registry.alias_version(client, pipeline, registry.CHAMPION)
        if version is not None:  # the version just read, so the directory and the name agree if the alias moves
            found = registry.model_dir(
                client, registry.ModelRef(pipeline, version=version), self.root / "cache" / "models"
            )
            uri = str(registry.ModelRef(pipeline, alias=registry.CHAMPION))
            return LiveModel(found, f"{uri} (version {version})", uri, str(version))
        found = latest_artifact(runs_dir, f"{pipeline}/{merge_stage}")
        if found is None:
            return None
        return LiveModel(found / "model", f"latest merged model (not yet promoted): {found.name}")

    def resolve(self, uri: str) -> Path:
        """A models:/ URI as a local model directory."""
        return registry.model_dir(self.client(), registry.parse_uri(uri), self.root / "cache" / "models")

    def resolve_version(self, uri: str) -> tuple[Path, str]:
        """A models:/ URI as a local model directory and the version it names now (an alias moves: a job records
        the version it read)."""
        client = self.client()
        ref = registry.parse_uri(uri)
        version = str(registry.version_of(client, ref).version)
        pinned = registry.ModelRef(ref.name, version=version)
        return registry.model_dir(client, pinned, self.root / "cache" / "models"), version

    def env(self) -> dict[str, str]:
        return {
            "MLFLOW_TRACKING_URI": self.uri,
            **({"MLFLOW_ALLOW_FILE_STORE": "true"} if os.environ.get("MLFLOW_ALLOW_FILE_STORE") else {}),
        }
