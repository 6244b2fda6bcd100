"""`dragon runs --prune`: artifact directories nothing refers to go, after being shown; what a current
materialization, a registered model version or a running job refers to stays, with its whole chain."""

import uuid

from click.testing import CliRunner
from dagster import AssetKey, AssetMaterialization, DagsterInstance, DagsterRun, DagsterRunStatus, MetadataValue

from dragon_dagster import cli
from dragon_dagster.engine.artifacts.directories import make_read_only
from dragon_dagster.engine.artifacts.manifest import Manifest, write_manifest
from dragon_dagster.resources import MLflowTracking

KINDS = {
    "sft_dataset": "chat_dataset",
    "sft_adapter": "adapter",
    "merged_model": "merged_model",
    "evaluation_report": "evaluation_report",
}


def artifact(runs, stage, name, created, **manifest):
    directory = runs / "artifacts" / "p" / stage / name
    directory.mkdir(parents=True)
    (directory / "data.bin").write_bytes(b"x" * 1000)
    write_manifest(directory, Manifest(kind=KINDS[stage], created=created, **manifest))
    make_read_only(directory)  # as finished artifacts are
    return directory


def test_prune_shows_then_removes_only_what_nothing_refers_to(tmp_path, monkeypatch, tiny_model):
    runs, home = tmp_path / "runs", tmp_path / "home"
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(runs))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    a1 = artifact(runs, "sft_dataset", "a1", "2026-01-01")
    a2 = artifact(runs, "sft_dataset", "a2", "2026-01-02")
    b0 = artifact(runs, "sft_adapter", "b0", "2026-01-01", dataset=str(a1))
    b1 = artifact(runs, "sft_adapter", "b1", "2026-01-02", dataset=str(a1))
    b2 = artifact(runs, "sft_adapter", "b2", "2026-01-03", dataset=str(a2))
    m0 = artifact(runs, "merged_model", "m0", "2026-01-01", adapters=[str(b0 / "adapter")])
    m1 = artifact(runs, "merged_model", "m1", "2026-01-02", adapters=[str(b1 / "adapter")])
    m2 = artifact(runs, "merged_model", "m2", "2026-01-03", adapters=[str(b2 / "adapter")])
    r0 = artifact(runs, "evaluation_report", "r0", "2026-01-01", merged=str(m2))
    r1 = artifact(runs, "evaluation_report", "r1", "2026-01-02", merged=str(m2))
    r2 = artifact(runs, "evaluation_report", "r2", "2026-01-03", merged=str(m2))
    going = artifact(runs, "evaluation_report", "l1", "2025-12-31", dagster_run_id="live-run")

    # m1 is a registered version (and so b1, a1 in its chain); r1 is the latest materialization Dagster knows
    MLflowTracking(runs_dir=str(runs)).register_model("p", tiny_model, None, {"artifact_dir": str(m1)})
    home.mkdir()
    with DagsterInstance.get() as instance:
        instance.report_runless_asset_event(
            AssetMaterialization(
                AssetKey(["p", "evaluation_report"]), metadata={"artifact_dir": MetadataValue.path(str(r1))}
            )
        )
        instance.add_run(DagsterRun(job_name="p_pipeline", run_id="live-run", status=DagsterRunStatus.STARTED))
        instance.add_run(DagsterRun(job_name="p_pipeline", run_id=str(uuid.uuid4()), status=DagsterRunStatus.SUCCESS))

    shown = CliRunner().invoke(cli.main, ["runs", "--prune"])
    assert shown.exit_code == 0, shown.output
    listed = {line.split()[-1] for line in shown.output.splitlines() if line.strip().endswith(("0", "1", "2"))}
    assert listed == {str(b0.resolve()), str(m0.resolve()), str(r0.resolve())}
    assert "3 artifact directories" in shown.output and "--yes" in shown.output
    assert all(d.exists() for d in (b0, m0, r0)), "showing removes nothing"

    removed = CliRunner().invoke(cli.main, ["runs", "--prune", "--yes"])
    assert removed.exit_code == 0 and "removed 3 artifact directories" in removed.output, removed.output
    assert not any(d.exists() for d in (b0, m0, r0))
    assert all(d.exists() for d in (a1, a2, b1, b2, m1, m2, r1, r2, going))
    again = CliRunner().invoke(cli.main, ["runs", "--prune"])
    assert "nothing to prune" in again.output
