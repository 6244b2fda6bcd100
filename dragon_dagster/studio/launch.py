"""How the studio starts a saved pipeline's job and follows it, one of two ways with one face (`Launched`):

- through the Dagster webserver that serves the project, when one answers (GraphQL, as any client of Dagster
  would): its code locations are reloaded so they list the new pipeline, the run is submitted to its queue and
  terminated there, and its state and steps are read back from it;
- else in a child process of the studio, on the project's Dagster instance (the run is in the Dagster UI all the
  same), cancelled the way Dagster's own run launcher does it: the run marked canceling, then its process
  interrupted, so the training step stops its worker and keeps its checkpoint.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

import requests
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus
from dagster._core.storage.dagster_run import RunsFilter

from ..engine.pipeline import load

STUDIO_TAG = "dragon/studio"  # on every run the studio starts: its launch's token
ENDED = {"SUCCESS", "FAILURE", "CANCELED"}
# what a stage that reused an earlier artifact records on its materialization (assets/reuse.py: reusable)
REUSED, REUSED_FROM = "reused", "reused_from_run"


@dataclass
class StepState:
    stage: str  # the pipeline's asset, pipeline/stage
    status: str  # Dagster's step status, RUNNING while it has started and not ended, NOT RUN before
    seconds: float
    reused_from: str | None = None  # the Dagster run that made the artifact this step handed on, when it reused one


class Launched(Protocol):
    run_id: str | None
    where: str  # for people: where the run runs
    log: Path | None  # the run's output, where it is not in the Dagster UI
    dagster_url: str | None  # the Dagster webserver that serves the run's page, None where none was asked

    def status(self) -> str: ...  # Dagster's run status (QUEUED ... SUCCESS), STARTING before the run exists

    def steps(self) -> list[StepState]: ...

    def cancel(self) -> None: ...


def _step_state(
    pipeline: str, key: str, status: str | None, start: float | None, end: float | None, reused: dict[str, str]
) -> StepState:
    stage = key.removeprefix(f"{pipeline}__")
    shown = status if end else ("RUNNING" if start else "NOT RUN")
    seconds = round((end or time.time()) - start, 1) if start else 0.0
    return StepState(f"{pipeline}/{stage}", shown or "NOT RUN", seconds, reused.get(key))


# ---------------------------------------------------------------------------------------------------- webserver


def webserver_answers(url: str) -> bool:
    """Whether a Dagster webserver answers at url (its /server_info)."""
    try:
        found = requests.get(f"{url.rstrip('/')}/server_info", timeout=2)
        return found.ok and "dagster_webserver_version" in found.json()
    except (requests.RequestException, ValueError):
        return False


LOCATIONS = "query { workspaceOrError { ... on Workspace { locationEntries { name } } } }"
REPOSITORIES = """query { repositoriesOrError { ... on RepositoryConnection {
  nodes { name location { name } jobs { name } } } } }"""
RUN = """query Run($runId: ID!) { runOrError(runId: $runId) { __typename ... on Run {
  status stepStats { stepKey status startTime endTime }
  assetMaterializations { stepKey metadataEntries { label
    ... on BoolMetadataEntry { boolValue } ... on TextMetadataEntry { text } } } } } }"""


class WebserverRun:
    """A run submitted through the webserver at url (the code locations reloaded first, so the job is there)."""

    log = None  # its output is in the webserver's run page

    def __init__(self, url: str, pipeline: str, tags: dict[str, str] | None = None):
        from dagster_graphql import DagsterGraphQLClient

        parsed = urlparse(url)
        self.url, self.pipeline = url.rstrip("/"), pipeline
        self.dagster_url = self.url
        self.where = f"the Dagster webserver at {self.url}"
        self.client = DagsterGraphQLClient(parsed.hostname, port_number=parsed.port, timeout=60)
        job = f"{pipeline}_pipeline"
        for entry in self._query(LOCATIONS)["workspaceOrError"]["locationEntries"]:
            self.client.reload_repository_location(entry["name"])
        repositories = self._query(REPOSITORIES)["repositoriesOrError"]["nodes"]
        found = [r for r in repositories if any(j["name"] == job for j in r["jobs"])]
        if not found:
            names = sorted({r["location"]["name"] for r in repositories})
            raise ValueError(
                f"the Dagster webserver at {self.url} has no job {job!r} after reloading its code locations "
                f"({', '.join(names)}): is it serving this project (its defs folder)?"
            )
        self.run_id = self.client.submit_job_execution(
            job, repository_location_name=found[0]["location"]["name"], repository_name=found[0]["name"], tags=tags
        )

    def _query(self, query: str, **variables) -> dict:
        return self.client._execute(query, variables or None)  # the client's transport, for what it has no method

    def _run(self) -> dict:
        return self._query(RUN, runId=self.run_id)["runOrError"]

    def status(self) -> str:
        return self._run().get("status", "STARTING")

    def steps(self) -> list[StepState]:
        run = self._run()
        reused = {}
        for event in run.get("assetMaterializations", []):
            entries = {e["label"]: e.get("boolValue", e.get("text")) for e in event["metadataEntries"]}
            if entries.get(REUSED) is True:
                reused[event["stepKey"]] = entries.get(REUSED_FROM)
        return [
            _step_state(self.pipeline, s["stepKey"], s["status"], s["startTime"], s["endTime"], reused)
            for s in run.get("stepStats", [])
        ]

    def cancel(self) -> None:
        self.client.terminate_run(self.run_id)


# ------------------------------------------------------------------------------------------------------ local


def _materialize(path: str, resources: dict | None, instance_ref, tags: dict[str, str], log: str) -> None:
    """The child process: the pipeline's job, in-process, as `dragon demo` runs it, its output in the log file (the
    studio's terminal stays quiet; the page names the file when a run fails). resources: (class, the settings
    given), since Dagster's resource objects do not cross a pickle."""
    with open(log, "ab", buffering=0) as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    from ..assets.launch import materialize_pipeline

    if resources is not None:
        resources = {key: cls(**settings) for key, (cls, settings) in resources.items()}
    with DagsterInstance.from_ref(instance_ref) if instance_ref else DagsterInstance.get() as instance:
        materialize_pipeline(load(path), profile=None, resources=resources, instance=instance, tags=tags)


class LocalRun:
    """A run in a child process of the studio (spawned: the studio's threads are not forked along)."""

    dagster_url = None  # no webserver answered: the run is in the instance, with no page served for it

    def __init__(self, path: Path, pipeline: str, instance: DagsterInstance, logs: Path, resources: dict | None = None):
        self.pipeline, self.instance, self.run_id = pipeline, instance, None
        self.token = uuid.uuid4().hex
        logs.mkdir(parents=True, exist_ok=True)
        self.log = logs / f"{pipeline}-{time.strftime('%Y%m%d-%H%M%S')}-{self.token[:8]}.log"
        self.where = f"this machine (a process of the studio, its output in {self.log})"
        ref = None if instance.is_ephemeral else instance.get_ref()
        if ref is None:
            raise ValueError("the studio runs a pipeline on a Dagster instance on disk ($DAGSTER_HOME), not ephemeral")
        portable = {k: (type(r), r.model_dump(exclude_unset=True)) for k, r in resources.items()} if resources else None
        context = multiprocessing.get_context("spawn")
        self.process = context.Process(
            target=_materialize,
            args=(str(path), portable, ref, {STUDIO_TAG: self.token}, str(self.log)),
            name=f"studio-{pipeline}",
            daemon=False,
        )
        self.process.start()

    def _find(self):
        if self.run_id is None:
            found = self.instance.get_runs(RunsFilter(tags={STUDIO_TAG: self.token}), limit=1)
            self.run_id = found[0].run_id if found else None
        return self.instance.get_run_by_id(self.run_id) if self.run_id else None

    def status(self) -> str:
        run = self._find()
        if run is None:
            return "STARTING" if self.process.is_alive() else "FAILURE"  # died before Dagster had a run
        if run.status.value not in ENDED and not self.process.is_alive():
            return "FAILURE"  # killed without Dagster ending the run
        return run.status.value

    def steps(self) -> list[StepState]:
        if self._find() is None:
            return []
        reused = {}
        for event in self.instance.all_logs(self.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
            metadata = event.dagster_event.step_materialization_data.materialization.metadata
            if REUSED in metadata and metadata[REUSED].value is True:
                reused[event.step_key] = metadata[REUSED_FROM].value
        return [
            _step_state(
                self.pipeline, s.step_key, s.status.value if s.status else None, s.start_time, s.end_time, reused
            )
            for s in self.instance.get_run_step_stats(self.run_id)
        ]

    def cancel(self, grace_s: float = 60.0) -> None:
        run = self._find()
        if run is not None and run.status.value not in ENDED:
            self.instance.report_run_canceling(run)
        if self.process.is_alive():
            os.kill(self.process.pid, signal.SIGINT)  # Dagster's interrupt: the step stops its worker, saves
            self.process.join(grace_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        run = self._find()
        if run is not None and run.status in (DagsterRunStatus.CANCELING, DagsterRunStatus.STARTED):
            self.instance.report_run_canceled(run, message="cancelled from the studio; its process was killed")
