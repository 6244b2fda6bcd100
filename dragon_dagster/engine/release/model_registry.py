"""The MLflow Model Registry as the source of truth for which model is live.

Every merged model is logged as an MLflow model (a pyfunc that holds the model directory and replies to
prompts) on the run that trained it, and registered as a new version of a registered model named after the
pipeline. Aliases say what each version is for: `challenger` is the newest candidate, `champion` the one people
chat with (set by a promotion gate, never by training). `models:/<name>@champion`, `models:/<name>@challenger`
and `models:/<name>/<version>` name a model wherever a model directory is accepted.

With the default sqlite store the model files sit under the runs directory and are read in place; with a
remote tracking server (`MLFLOW_TRACKING_URI=http://...`) they are uploaded to its artifact store and
downloaded once into a local cache when used.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import mlflow.pyfunc

from ..text.uris import without_password

CHAMPION, CHALLENGER = "champion", "challenger"
MODEL_SUBDIR = "model"  # where the transformers directory sits inside the MLflow model's artifacts
_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[\w-]+)|/(?P<version>\d+))$")


class RegistryError(RuntimeError):
    """A registry that cannot be reached or read, or a models:/ URI that names nothing."""


class NotRegistered(RegistryError):
    """The registered model, version or alias does not exist (as opposed to a registry that failed)."""


def _not_found(exc) -> bool:
    """MLflow's way of saying 'no such model/version/alias': RESOURCE_DOES_NOT_EXIST, or for a missing alias
    INVALID_PARAMETER_VALUE with 'not found'. Anything else (refused connection, 401, 500) is a real failure."""
    code = getattr(exc, "error_code", "")
    return code == "RESOURCE_DOES_NOT_EXIST" or (code == "INVALID_PARAMETER_VALUE" and "not found" in str(exc))


class ChatModel(mlflow.pyfunc.PythonModel):
    """Replies to prompts with the transformers model in the artifacts (greedy, 128 new tokens): what
    `mlflow.pyfunc.load_model(...).predict(["Hello"])` gives. Chat and serving load the directory directly."""

    def load_context(self, context):
        from transformers import AutoModelForCausalLM

        from ..models import load_tokenizer

        self.tokenizer = load_tokenizer(context.artifacts[MODEL_SUBDIR])
        self.model = AutoModelForCausalLM.from_pretrained(context.artifacts[MODEL_SUBDIR])

    def predict(self, context, model_input: list[str], params: dict | None = None) -> list[str]:
        from ..infer.generation import generate

        return generate(
            self.model,
            self.tokenizer,
            [[{"role": "user", "content": str(p)}] for p in model_input],
            max_new_tokens=int((params or {}).get("max_new_tokens", 128)),
        )


@dataclass(frozen=True)
class ModelRef:
    name: str
    alias: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        return f"models:/{self.name}@{self.alias}" if self.alias else f"models:/{self.name}/{self.version}"


def local_path(uri: str) -> Path | None:
    """The local path of a file: URI or a plain path; None for anything remote (s3:, mlflow-artifacts:...)."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and uri:
        return Path(uri)
    return None


def parse_uri(uri: str) -> ModelRef | None:
    """A models:/ URI as a ModelRef; None for anything else (a path, a preset, a hub id)."""
    match = _URI.match(uri.strip())
    if not match:
        if uri.startswith("models:/"):
            raise RegistryError(
                f"{uri!r} is not a model URI this tool reads: use models:/<name>@<alias> or models:/<name>/<version>"
            )
        return None
    return ModelRef(match["name"], match["alias"], match["version"])


def save_chat_model(model_dir: Path, dest: Path) -> None:
    """An MLflow pyfunc model at dest holding a copy of model_dir. Requirements are given, not inferred:
    inferring them loads the model in a subprocess, which costs more than the copy."""
    from importlib.metadata import version

    requirements = [f"{package}=={version(package)}" for package in ("torch", "transformers", "peft")]
    with _without(logging.getLogger("mlflow.pyfunc"), "serialized using CloudPickle"):
        mlflow.pyfunc.save_model(
            str(dest), python_model=ChatModel(), artifacts={MODEL_SUBDIR: str(model_dir)}, pip_requirements=requirements
        )  # the signature comes from predict's type hints


@contextmanager
def _without(log: logging.Logger, text: str) -> Iterator[None]:
    """log without its records that contain text. MLflow warns that a python_model object is pickled with
    CloudPickle and may run code when loaded: ChatModel is a class of this installed package, which cloudpickle
    stores by reference, so loading it imports this package and runs nothing else."""

    def keep(record: logging.LogRecord) -> bool:
        return text not in record.getMessage()

    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


def log_and_register(
    client,
    experiment_id: str,
    name: str,
    model_dir: Path,
    run_id: str | None,
    tags: dict[str, str],
    scratch: Path,
    description: str = "",
) -> str:
    """Log model_dir as an MLflow model on run_id, register it as a new version of `name` with tags, make it
    the challenger; returns the version. scratch: where the model is staged (the same disk as the store, so the
    copy is written once)."""
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.exceptions import MlflowException

    logged = client.create_logged_model(
        experiment_id, name=name, source_run_id=run_id, tags=tags, model_type="chat-model"
    )
    scratch.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=".mlflow-model-", dir=scratch))
    try:
        save_chat_model(model_dir, staged / "mlflow_model")
        client.log_model_artifacts(logged.model_id, str(staged / "mlflow_model"))
    except BaseException:
        client.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
        raise
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    if run_id:  # the run's page lists it under "Logged models"
        client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
    try:
        client.create_registered_model(name, description=description or None)
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc):
            raise
    # registered from the logged model (models:/<model_id>), so the version's page links to it and the logged
    # model lists the version. MLflow's sqlite registry resolves that URI through the process-wide tracking URI,
    # not this client's: the caller sets it to the client's (resources/tracking.py's register_model)
    version = client.create_model_version(
        name,
        source=f"models:/{logged.model_id}",
        run_id=run_id,
        tags=tags,
        model_id=logged.model_id,
        description=description or None,
    )
    link_logged_model(client, logged.model_id, name, version.version)
    client.set_registered_model_alias(name, CHALLENGER, version.version)
    return str(version.version)


def link_logged_model(client, model_id: str, name: str, version: int | str) -> None:
    """Record a registered version on the logged model it was made from (the `mlflow.modelVersions` tag that
    `mlflow.register_model` and a tracking server write, the version as the registry returned it): the
    experiment's Models tab shows it as Registered."""
    import json

    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    versions = json.loads(client.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS) or "[]")
    if {"name": name, "version": version} not in versions:
        versions.append({"name": name, "version": version})
        client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(versions)})


def version_of(client, ref: ModelRef):
    """The ModelVersion a ref names; NotRegistered when it names nothing, RegistryError when the registry
    could not answer (a server down must not look like "no champion yet")."""
    from mlflow.exceptions import MlflowException

    try:
        if ref.alias:
            return client.get_model_version_by_alias(ref.name, ref.alias)
        return client.get_model_version(ref.name, ref.version)
    except MlflowException as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        where = without_password(client.tracking_uri)
        if _not_found(exc):
            raise NotRegistered(
                f"{ref}: no such registered model version in the MLflow registry at {where} ({first})"
            ) from exc
        raise RegistryError(f"{ref}: the MLflow registry at {where} did not answer: {first}") from exc


def alias_version(client, name: str, alias: str) -> str | None:
    """The version an alias points at, None when the model or the alias does not exist."""
    try:
        return str(version_of(client, ModelRef(name, alias=alias)).version)
    except NotRegistered:
        return None


def version_for(client, name: str, artifact_dir: str | Path) -> str | None:
    """The version registered from a merged-model artifact directory (its artifact_dir tag), None if that
    directory was not registered in this registry: versions are small numbers that mean nothing elsewhere."""
    found = client.search_model_versions(f"name = '{name}' and tags.artifact_dir = '{artifact_dir}'")
    return str(max(int(v.version) for v in found)) if found else None


def model_dir(client, ref: ModelRef, cache: Path) -> Path:
    """A local transformers directory for ref: read in place from a local artifact store, else downloaded
    once into cache/<name>/<version>."""
    version = version_of(client, ref)
    registered_from = Path(version.tags.get("model_dir", ""))
    if version.tags.get("model_dir") and (registered_from / "config.json").exists():
        return registered_from  # the artifact it was registered from, on this machine: the same files
    uri = client.get_model_version_download_uri(ref.name, version.version)
    local = local_path(uri)
    if local is not None and logged_model_dir(local) is not None:
        return logged_model_dir(local)
    # keyed by the logged model, not only name/version: another server's (or a reset one's) version 3 differs
    key = version.model_id or hashlib.sha256(f"{client.tracking_uri}|{uri}".encode()).hexdigest()[:16]
    target = cache / ref.name / f"{version.version}-{key}"
    if logged_model_dir(target) is None:  # target: the logged model's root
        import mlflow.artifacts

        cache.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
        try:
            got = mlflow.artifacts.download_artifacts(
                artifact_uri=uri, dst_path=str(partial), tracking_uri=client.tracking_uri
            )
            target.parent.mkdir(parents=True, exist_ok=True)
            try:  # whole or not at all: a killed download leaves only a .download-* dir
                Path(got).rename(target)
            except OSError:  # another process finished the same download first: use theirs, never delete it
                if logged_model_dir(target) is None:
                    raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    found = logged_model_dir(target)
    if found is None:
        raise RegistryError(f"{ref}: the logged model at {uri} holds no transformers model directory")
    return found


def logged_model_dir(root: Path) -> Path | None:
    """The transformers directory inside a logged chat model (root: the MLflow model's directory): MLflow keeps
    an artifact directory under its own name, `artifacts/model` for a merged model's `model/`, so any other name
    is found by its config.json; None when there is none."""
    artifacts = Path(root) / "artifacts"
    if (artifacts / MODEL_SUBDIR / "config.json").exists():
        return artifacts / MODEL_SUBDIR
    found = sorted(p.parent for p in artifacts.glob("*/config.json")) if artifacts.is_dir() else []
    return found[0] if len(found) == 1 else None
