"""A stage kind added from outside the package (tests/toy_kind: one folder, one `catalog.register`) runs through
Dagster like a built-in one: the pipeline YAML names it, its asset is built by its role, its worker runs in a
child process that finds it through the job's kind module, its result comes back typed, its check runs, and the
merge and the report after it treat its adapter as any other."""

import json
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance

from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.assets.launch import materialize_pipeline
from dragon_dagster.engine import catalog
from dragon_dagster.engine.artifacts.manifest import AdapterManifest, read_manifest
from dragon_dagster.engine.pipeline import load
from tests.support import component_yaml, failed_message


@pytest.fixture()
def toy_kind():
    import tests.toy_kind as toy

    catalog.register(toy.KIND)  # importing registered it; registering the same kind again is a no-op
    yield toy
    catalog.unregister("toy_adapter")


def test_a_kind_from_outside_the_package_runs_through_dagster(toy_kind, tiny_model, tmp_path, resources_for):
    defs = tmp_path / "defs" / "toy"
    defs.mkdir(parents=True)
    (defs / "defs.yaml").write_text(
        component_yaml(
            f"""\
name: toy
model: {tiny_model}
stages:
  - {{name: rows, kind: chat_dataset, path: "example:tickets.csv", prompt: "{{subject}}", response: reply,
      group_by: subject}}
  - {{name: lessons, kind: chat_dataset, path: "example:tickets.csv", prompt: "{{body}}", response: reply,
      group_by: subject}}
  - {{name: toy_adapter, kind: toy_adapter, dataset: rows, note: from the yaml, lora: {{r: 4, alpha: 8}},
      teacher: lessons}}
  - {{name: merged_model, kind: merge}}
  - {{name: evaluation_report, kind: evaluate, dataset: rows, max_eval_rows: 4, n_samples: 1, n_judge: 0,
      max_new_tokens: 4}}
"""
        )
    )
    pipeline = load(defs / "defs.yaml")
    instance = DagsterInstance.ephemeral()
    outcome = materialize_pipeline(pipeline, resources=resources_for(tmp_path / "runs"), instance=instance)
    assert outcome["success"], failed_message(instance, outcome["run_id"])

    adapter = Path(outcome["artifacts"]["toy_adapter"])
    job = json.loads((adapter / "job.json").read_text())
    assert job["kind_module"] == "tests.toy_kind" and job["settings"]["note"] == "from the yaml"
    result = read_manifest(adapter, AdapterManifest[toy_kind.ToyResult]).result  # the kind's own result model
    assert result.note == "from the yaml" and result.lora_parameters > 0
    # the declared teacher: an input of the asset (a lineage edge nothing else draws), its artifact in the job
    assert result.teacher_artifact == outcome["artifacts"]["lessons"]
    assert job["inputs"]["declared"] == [{"role": "teacher", "stage": "lessons", "path": result.teacher_artifact}]
    graph = build_pipeline_defs(pipeline)["assets"]
    [toy_asset] = [a for a in graph if AssetKey(["toy", "toy_adapter"]) in a.keys]
    assert AssetKey(["toy", "lessons"]) in toy_asset.asset_deps[AssetKey(["toy", "toy_adapter"])]
    assert result.figures == {"lora_parameters": float(result.lora_parameters)}
    checks = {c["name"]: c["passed"] for c in outcome["checks"] if c["asset"] == "toy/toy_adapter"}
    assert checks == {"toy_adapter_saved": True}

    report = json.loads((Path(outcome["report"]) / "report.json").read_text())
    assert report["stages"] == [
        {"stage": "toy_adapter", "method": "toy_adapter", "lora_parameters": float(result.lora_parameters)}
    ]
    # an untrained LoRA update is zero: the merged model is its base, on the same held-out rows
    assert report["merged"]["eval_loss"] == pytest.approx(report["base"]["eval_loss"], rel=1e-4)


def test_an_unknown_kind_is_named_with_the_known_ones(tmp_path):
    from dragon_dagster.engine.pipeline import PipelineError, parse

    with pytest.raises(PipelineError, match=r"stages\[0\].*toy_adapter.*does not match.*chat_dataset"):
        parse({"name": "p", "stages": [{"name": "a", "kind": "toy_adapter", "dataset": "d"}]})
