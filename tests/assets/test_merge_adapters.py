"""merge_adapters through Dagster on the tiny model: two SFT adapters trained on the same base (the second with
`start: base`), combined by TIES into one adapter whose asset reads both (lineage edges), then folded into the
base by a merge stage as any adapter is."""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path

import pytest

ROWS = "".join(f"What is {a} + {b}?,{a} plus {b} makes {a + b}.\n" for a in range(1, 9) for b in (2, 3))
ARGS = "{max_steps: 2, batch_size: 2, grad_accum: 1, logging_steps: 1, save_steps: 50, max_seq_len: 64}"


@pytest.fixture(autouse=True)
def signal_handlers_kept():
    """The in-process Dagster run leaves SIGTERM mapped to KeyboardInterrupt; later tests signal this process."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in handlers.items():
        signal.signal(number, handler)


def write_pipeline(folder: Path, model: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sums.csv").write_text("q,a\n" + ROWS)
    (folder / "defs.yaml").write_text(
        textwrap.dedent(f"""\
        type: dragon_dagster.PostTrainingPipeline
        attributes:
          name: combine_tiny
          model: {model}
          datasets:
            sums: {{path: sums.csv}}
          stages:
            - {{name: chat, kind: chat_dataset, source: sums, prompt: q, response: a, eval_frac: 0.25}}
            - {{name: sft_a, kind: sft, dataset: chat, n_samples: 0, lora: {{r: 4}}, args: {ARGS}}}
            - {{name: sft_b, kind: sft, dataset: chat, start: base, n_samples: 0, lora: {{r: 4}}, args: {ARGS}}}
            - {{name: combined, kind: merge_adapters, adapters: [sft_a, sft_b], weights: [0.6, 0.4],
                combination: ties, density: 0.5}}
            - {{name: merged_model, kind: merge, sample_prompt: "What is 2 + 3?"}}
        """)
    )
    return folder / "defs.yaml"


def test_combined_adapters_materialize_with_lineage_and_merge(tiny_model, tmp_path, resources_for):
    from dagster import AssetKey, DagsterInstance, Definitions

    from dragon_dagster.assets.factory import build_pipeline_defs
    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.engine.pipeline import load

    resources = resources_for(tmp_path / "runs")
    pipeline = load(write_pipeline(tmp_path / "defs" / "combine_tiny", tiny_model))
    graph = Definitions(assets=build_pipeline_defs(pipeline)["assets"], resources=resources).resolve_asset_graph()
    key = lambda name: AssetKey(["combine_tiny", name])  # noqa: E731
    assert graph.get(key("combined")).parent_keys == {key("sft_a"), key("sft_b")}  # lineage to every input
    assert graph.get(key("merged_model")).parent_keys == {key("combined")}  # the chain continues from it
    assert pipeline.previous("sft_b") is None  # start: base: beside the chain, not on sft_a

    outcome = materialize_pipeline(pipeline, resources=resources, instance=DagsterInstance.ephemeral())
    assert outcome["success"], outcome["stages"]
    artifacts = {name: Path(outcome["artifacts"][name]) for name in ("sft_a", "sft_b", "combined", "merged_model")}

    sft_b = json.loads((artifacts["sft_b"] / "manifest.json").read_text())
    assert sft_b["chain"] == [str(artifacts["sft_b"] / "adapter")]  # trained on the base, sft_a not folded in
    manifest = json.loads((artifacts["combined"] / "manifest.json").read_text())
    assert manifest["kind"] == "adapter" and manifest["method"] == "merge_adapters"
    assert manifest["chain"] == [str(artifacts["combined"] / "adapter")]  # both inputs sit on the base alone
    assert manifest["result"]["inputs"] == ["sft_a", "sft_b"] and manifest["result"]["weights"] == [0.6, 0.4]
    assert manifest["result"]["combination"] == "ties" and manifest["result"]["rank"] == 4
    job = json.loads((artifacts["combined"] / "job.json").read_text())
    assert job["inputs"]["adapters"] == [str(artifacts[n] / "adapter") for n in ("sft_a", "sft_b")]
    config = json.loads((artifacts["combined"] / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and not config.get("use_dora")
    run = resources["tracking"].client().get_run(manifest["mlflow_run_id"])
    assert run.data.tags["method"] == "merge_adapters" and run.data.params["combination"] == "ties"

    merged = json.loads((artifacts["merged_model"] / "manifest.json").read_text())
    assert merged["adapters"] == manifest["chain"]  # the merge folded the combined adapter
    assert [s["name"] for s in merged["info"]["card"]["stages"]] == ["combined"]
    assert merged["info"]["card"]["datasets"] == []  # it trained on none; its inputs' manifests name theirs
    assert (artifacts["merged_model"] / "model" / "config.json").exists()
    [version] = resources["tracking"].client().search_model_versions("name='combine_tiny'")  # registered as any
    assert version.tags["upstream_mlflow_run_ids"] == manifest["mlflow_run_id"]


def test_an_artifact_from_elsewhere_is_found_beside_the_pipeline(tiny_model, tmp_path):
    """`{artifact: PATH}` names another pipeline's adapter artifact, relative to the pipeline's folder; a stage's
    artifact comes from the asset's input of that stage."""
    from dragon_dagster.assets.combine import input_artifacts, input_name
    from dragon_dagster.engine.pipeline import load

    path = write_pipeline(tmp_path / "defs" / "combine_tiny", tiny_model)
    path.write_text(path.read_text().replace("[sft_a, sft_b]", "[sft_a, {artifact: ../other/sft-1}]"))
    pipeline = load(path)
    stage = pipeline.stage("combined")
    assert stage.reads() == ["sft_a"]
    found = input_artifacts(pipeline, stage, {input_name("sft_a"): "/runs/artifacts/combine_tiny/sft_a-1"})
    assert found == ["/runs/artifacts/combine_tiny/sft_a-1", str(path.parent / "../other/sft-1")]
