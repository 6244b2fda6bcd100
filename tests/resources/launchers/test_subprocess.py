"""The subprocess launcher's Pipes files (issue 25): in a folder of the run's under the store's runs directory,
not the system temp directory, and gone when the step ends."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from dagster import DagsterInstance, Output, asset, materialize

from dragon_dagster.resources import ArtifactStore, TrainingResource
from dragon_dagster.resources.launchers import PipesTap
from dragon_dagster.resources.launchers.subprocess import SubprocessLauncher

pytestmark = pytest.mark.timeout(60)

# The worker: says where its Pipes files are, and speaks Pipes as a real one does.
WORKER = textwrap.dedent("""\
    import json, os, sys
    from dagster_pipes import (
        DAGSTER_PIPES_CONTEXT_ENV_VAR, DAGSTER_PIPES_MESSAGES_ENV_VAR, decode_env_var, open_dagster_pipes,
    )
    paths = {
        "context": decode_env_var(os.environ[DAGSTER_PIPES_CONTEXT_ENV_VAR])["path"],
        "messages": decode_env_var(os.environ[DAGSTER_PIPES_MESSAGES_ENV_VAR])["path"],
    }
    paths["existed"] = all(os.path.isfile(p) for p in paths.values())
    open(sys.argv[1], "w").write(json.dumps(paths))
    with open_dagster_pipes() as pipes:
        pipes.report_custom_message({"kind": "metrics", "step": 1, "values": {"loss": 0.5}})
    """)


def test_the_pipes_files_are_in_the_run_s_folder_and_gone_after_the_step(tmp_path):
    runs, seen, metrics = tmp_path / "runs", tmp_path / "seen.json", []

    @asset
    def worker_step(context, store: ArtifactStore, training: TrainingResource):
        command = [sys.executable, "-c", WORKER, str(seen)]
        tap = PipesTap(lambda step, values: metrics.append((step, values)))
        code = SubprocessLauncher().launch(context, training, command, {}, tap, parallel=False)
        return Output(code)  # as the stages do: with a Pipes session, Dagster wants an explicit output

    outcome = materialize(
        [worker_step],
        resources={"store": ArtifactStore(runs_dir=str(runs)), "training": TrainingResource(device="cpu")},
        instance=DagsterInstance.ephemeral(),
    )
    assert outcome.success and outcome.output_for_node("worker_step") == 0
    paths = json.loads(seen.read_text())
    assert paths["existed"]
    folder = (runs / ".pipes" / outcome.run_id).resolve()
    for name in ("context", "messages"):
        path = (tmp_path / paths[name]).resolve()
        assert path.parent.parent == folder and path.parent.name.startswith("worker_step-"), path
    assert not (runs / ".pipes" / outcome.run_id).exists()  # removed with the step's folder: nothing left
    assert metrics == [(1, {"loss": 0.5})]  # the worker's messages came through the file there
