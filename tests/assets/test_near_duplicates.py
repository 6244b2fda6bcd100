"""A dataset stage's near-duplicate prompts (issue 63) as Dagster shows them: the clusters in its manifest and in
its materialization's metadata, and the leak check's near-copy figure beside the word-for-word one."""

import textwrap

from dagster import AssetKey, DagsterInstance

from dragon_dagster.assets.launch import materialize_pipeline
from dragon_dagster.engine.artifacts.manifest import DatasetManifest, read_manifest
from dragon_dagster.engine.pipeline import load
from tests.engine.data.test_near_dups import tickets
from tests.support import component_yaml


def test_a_dataset_stage_shows_its_near_duplicate_clusters(tiny_model, tmp_path, resources_for):
    folder = tmp_path / "defs" / "tickets"
    folder.mkdir(parents=True)
    tickets().to_csv(folder / "tickets.csv", index=False)
    (folder / "defs.yaml").write_text(
        component_yaml(
            textwrap.dedent(f"""\
            name: tickets
            model: {tiny_model}
            stages:
              - {{name: rows, kind: chat_dataset, path: tickets.csv, prompt: ticket, response: reply, eval_frac: 0.2}}
            """)
        )
    )
    instance = DagsterInstance.ephemeral()
    outcome = materialize_pipeline(
        load(folder / "defs.yaml"), resources=resources_for(tmp_path / "runs"), instance=instance
    )
    assert outcome["success"], outcome["stages"]
    manifest = read_manifest(outcome["artifacts"]["rows"], DatasetManifest)
    near = manifest.near_duplicates
    assert (near.clusters, near.rows_in_clusters, near.threshold) == (30, 90, 0.8) and len(near.examples) == 3
    assert manifest.near_prompt_overlap == manifest.prompt_overlap == 0.0  # each cluster on one side

    metadata = instance.get_latest_materialization_event(AssetKey(["tickets", "rows"])).asset_materialization.metadata
    assert metadata["near_duplicate_clusters"].value == 30 and metadata["near_duplicate_rows"].value == 90
    assert metadata["near_duplicate_seconds"].value == near.seconds
    assert metadata["near_duplicate_examples"].value.splitlines()[0] == "| cluster | prompt |"
    assert metadata["near_prompt_overlap"].value == 0.0 and "identifying_answer_overlap" in metadata
    leak = next(c for c in outcome["checks"] if c["name"] == "held_out_not_leaking")
    assert leak["passed"], leak
