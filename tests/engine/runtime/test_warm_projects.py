"""One warm worker serves every project of its user, interpreter and checkout: a job takes its stores, working
directory, umask and CPUs from its own launch, and nothing of the project whose job started the warm worker
(engine/runtime/warm/server.py's docstring says which is which)."""

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from dagster import DagsterInstance
from mlflow import MlflowClient

from dragon_dagster.assets.launch import materialize_pipeline
from dragon_dagster.engine import catalog
from dragon_dagster.engine.artifacts.manifest import AdapterManifest, read_manifest
from dragon_dagster.engine.pipeline import load
from dragon_dagster.engine.runtime.warm import client
from dragon_dagster.engine.runtime.warm.protocol import difference, import_environment
from dragon_dagster.engine.runtime.worker import PARENT_PID
from tests.support import component_yaml, failed_message

CHECKOUT = Path(__file__).parents[3]
FORKED = re.compile(r"worker (\d+): warm start \(forked by warm worker (\d+)\)")


@pytest.fixture()
def probe_kind():
    import tests.probe_kind as probe

    catalog.register(probe.KIND)  # importing registered it; registering the same kind again is a no-op
    yield probe
    catalog.unregister("environment_probe")


@pytest.fixture(scope="session")
def empty_stores(tmp_path_factory) -> Path:
    """A Dagster home and an MLflow sqlite store, created once and copied for each project: creating MLflow's
    tables takes 2-4 s of CPU and 12-15 s on a busy machine (its migrations commit one by one), a copy 0.2 s."""
    from mlflow import MlflowClient

    folder = tmp_path_factory.mktemp("empty_stores")
    (folder / "dagster_home").mkdir()
    (folder / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    DagsterInstance.local_temp(str(folder / "dagster_home")).get_runs()  # its sqlite storage created
    MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").search_experiments(max_results=1)  # its tables created
    return folder


@pytest.fixture()
def own_warm_worker(monkeypatch):
    """A warm worker of this test's own (its folder: short, as a socket's path must be), stopped after it: the one
    the first project's job starts, not the suite's."""
    folder = tempfile.mkdtemp(prefix="dw-", dir="/tmp")
    monkeypatch.setenv("DRAGON_WARM_DIR", folder)
    yield folder
    client.stop()
    shutil.rmtree(folder, ignore_errors=True)


def project(root: Path, name: str, model: Path, stores: Path) -> dict[str, str]:
    """A project of its own: a pipeline (a dataset and the probe) and its stores (copies of empty ones), named by
    the environment as a deployment names them (the resources read it: default_resources)."""
    defs = root / "defs" / name / "defs.yaml"
    defs.parent.mkdir(parents=True)
    defs.write_text(
        component_yaml(f"""\
name: {name}
model: {model}
stages:
  - {{name: rows, kind: chat_dataset, path: "example:tickets.csv", prompt: "{{subject}}", response: reply,
      group_by: subject}}
  - {{name: probe, kind: environment_probe, dataset: rows}}
""")
    )
    shutil.copytree(stores / "dagster_home", root / "dagster_home")
    shutil.copy(stores / "mlflow.db", root / "mlflow.db")
    return {
        "DAGSTER_HOME": str(root / "dagster_home"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        "DRAGON_RUNS_DIR": str(root / "runs"),
        "DRAGON_FEEDBACK_URL": f"postgresql://{name}@127.0.0.1:9/feedback",  # named, never used: no feedback stage
        "PYTHONPATH": str(CHECKOUT),  # where the worker finds the probe's module (the job's kind_module)
    }


def run(root: Path, name: str, env: dict[str, str], monkeypatch, probe) -> dict:
    """The project's pipeline materialized as its launcher would: its environment, from its own folder, on the
    Dagster instance of its DAGSTER_HOME, with the resources its environment configures."""
    with monkeypatch.context() as m:
        for variable, value in env.items():
            m.setenv(variable, value)
        m.chdir(root)
        if name == "alpha":  # as `dragon demo` does: the warm worker imports while the first stages run
            client.prestart(dict(os.environ))
        instance = DagsterInstance.get()
        outcome = materialize_pipeline(load(root / "defs" / name / "defs.yaml"), instance=instance)
        assert outcome["success"], failed_message(instance, outcome["run_id"])
        forked = [FORKED.search(e.message) for e in instance.all_logs(outcome["run_id"]) if e.message]
        [(worker, warm)] = [match.groups() for match in forked if match]
        result = read_manifest(Path(outcome["artifacts"]["probe"]), AdapterManifest[probe.ProbeResult]).result
        return {**outcome, "worker": int(worker), "warm": int(warm), "result": result, "instance": instance}


def test_two_projects_share_a_warm_worker_and_each_job_keeps_to_its_own_stores(
    probe_kind, own_warm_worker, empty_stores, tiny_model, tmp_path, monkeypatch
):
    roots = {name: tmp_path / name for name in ("alpha", "beta")}
    envs = {name: project(root, name, tiny_model, empty_stores) for name, root in roots.items()}
    alpha = run(roots["alpha"], "alpha", envs["alpha"], monkeypatch, probe_kind)
    umask, cpus = os.umask(0o027), os.sched_getaffinity(0)  # beta's launcher: a umask and CPUs of its own
    try:
        os.sched_setaffinity(0, {min(cpus)})
        beta = run(roots["beta"], "beta", envs["beta"], monkeypatch, probe_kind)
    finally:
        os.umask(umask)
        os.sched_setaffinity(0, cpus)
    outcomes = {"alpha": alpha, "beta": beta}

    # one warm worker forked both jobs: the one alpha's launch started, in this test's own folder
    warm = client.status()
    assert alpha["warm"] == beta["warm"] == warm["pid"]
    assert alpha["result"].warm_parent == beta["result"].warm_parent == warm["pid"]
    # which holds nothing of alpha's launch: its environment is its import environment, PATH and its own settings
    assert not set(warm["variables"]) & {*probe_kind.STORES, "DAGSTER_PIPES_CONTEXT", PARENT_PID}, warm["variables"]

    for name, outcome in outcomes.items():
        env, result = envs[name], outcome["result"]
        # the job saw its own launch: stores, mlflow's URI and experiments, folder
        assert result.stores == {k: env[k] for k in probe_kind.STORES}, name
        assert result.tracking_uri == env["MLFLOW_TRACKING_URI"] and name in result.experiments, name
        assert not {"alpha", "beta"} - {name} & set(result.experiments), name
        assert result.cwd == result.start_folder == str(roots[name])
        # its records are in its own stores: artifacts, MLflow runs, Dagster runs
        assert all(Path(path).is_relative_to(roots[name] / "runs") for path in outcome["artifacts"].values())
        runs = MlflowClient(env["MLFLOW_TRACKING_URI"]).search_runs(
            [e.experiment_id for e in MlflowClient(env["MLFLOW_TRACKING_URI"]).search_experiments()]
        )
        assert runs and all(outcome["run_id"] in r.data.tags.values() for r in runs), name
        assert [r.run_id for r in outcome["instance"].get_runs()] == [outcome["run_id"]]
    # and none of the other's: no file under one project's folder names the other's folder or run
    for name, other in (("alpha", "beta"), ("beta", "alpha")):
        marks = [str(roots[other]).encode(), outcomes[other]["run_id"].encode()]
        found = [p for p in roots[name].rglob("*") if p.is_file() and any(m in p.read_bytes() for m in marks)]
        assert not found, (name, found)

    # beta's job ran with its launcher's umask and CPUs, not the warm worker's (alpha's launcher's)
    assert (alpha["result"].umask, beta["result"].umask) == (umask, 0o027)
    assert beta["result"].cpus == [min(cpus)] and alpha["result"].cpus == sorted(cpus)


def test_a_job_whose_folders_locale_or_time_zone_differ_does_not_fit_the_warm_worker():
    """Libraries turn these into module constants as they import (Hugging Face's caches under HOME, tempfile's
    folder, matplotlib's, the locale): a job that differs there starts cold rather than use the warm worker's."""
    warm = import_environment(os.environ)
    for name, value in {"HOME": "/elsewhere", "TMPDIR": "/elsewhere", "LC_ALL": "C", "TZ": "Asia/Tokyo"}.items():
        assert difference(warm, import_environment({**os.environ, name: value})).startswith(name), name
    for name in ("DAGSTER_HOME", "MLFLOW_TRACKING_URI", "DRAGON_RUNS_DIR", "DRAGON_FEEDBACK_URL", "PYTHONPATH"):
        assert not difference(warm, import_environment({**os.environ, name: "/a/project/of/its/own"})), name
