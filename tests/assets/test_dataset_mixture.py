"""A mixed dataset as a Dagster asset (issue 62): it depends on every source it mixes, and its manifest and its
materialization show the proportions the mixture ended up with."""

import textwrap
from pathlib import Path

import pandas as pd
from dagster import AssetKey, DagsterInstance, Definitions

from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.assets.launch import materialize_pipeline
from dragon_dagster.engine.artifacts.manifest import DatasetManifest, read_manifest
from dragon_dagster.engine.data import tables
from dragon_dagster.engine.pipeline import load
from tests.support import component_yaml


def test_a_mixture_depends_on_its_sources_and_shows_its_proportions(tiny_model, tmp_path, resources_for):
    folder = tmp_path / "defs" / "mix"
    folder.mkdir(parents=True)
    for name, n in (("faq", 200), ("tickets", 200), ("notes", 100)):
        pd.DataFrame({"q": [f"{name} question {i}" for i in range(n)], "r": [f"{name} {i}" for i in range(n)]}).to_csv(
            folder / f"{name}.csv", index=False
        )
    (folder / "defs.yaml").write_text(
        component_yaml(
            textwrap.dedent(f"""\
            name: mix
            model: {tiny_model}
            datasets: {{faq: {{path: faq.csv}}, tickets: {{path: tickets.csv}}}}
            stages:
              - {{name: mixed, kind: chat_dataset, prompt: q, response: r, mix_rows: 200, eval_frac: 0.1,
                  sources: [{{source: faq, weight: 2}}, {{source: tickets, weight: 1}},
                            {{path: notes.csv, weight: 1}}]}}
            """)
        )
    )
    pipeline = load(folder / "defs.yaml")
    resources = resources_for(tmp_path / "runs")
    graph = Definitions(assets=build_pipeline_defs(pipeline)["assets"], resources=resources).resolve_asset_graph()
    assert graph.get(AssetKey(["mix", "mixed"])).parent_keys == {AssetKey(["mix", "faq"]), AssetKey(["mix", "tickets"])}

    instance = DagsterInstance.ephemeral()
    outcome = materialize_pipeline(pipeline, resources=resources, instance=instance)
    assert outcome["success"], outcome["stages"]
    artifact = outcome["artifacts"]["mixed"]
    manifest = read_manifest(artifact, DatasetManifest)
    shares = {m.source: m for m in manifest.mixture}
    assert list(shares) == ["faq", "tickets", "notes.csv"]
    assert [shares[s].weight for s in shares] == [0.5, 0.25, 0.25]
    assert sum(m.rows for m in manifest.mixture) == manifest.train_rows + manifest.eval_rows == 200
    rows = tables.read_jsonl(f"{artifact}/train.jsonl") + tables.read_jsonl(f"{artifact}/eval.jsonl")
    for name, share in shares.items():  # what the manifest says is what the files hold
        counted = sum(r["prompt"][-1]["content"].startswith(name.removesuffix(".csv") + " ") for r in rows)
        assert counted == share.rows and share.share == round(counted / 200, 4)
    assert shares["faq"].read_from == outcome["artifacts"]["faq"]  # the source asset's snapshot
    assert shares["notes.csv"].read_from == str(folder / "notes.csv")
    assert (Path(artifact) / "source_1.csv").read_text() == (folder / "notes.csv").read_text()  # kept with it

    metadata = instance.get_latest_materialization_event(AssetKey(["mix", "mixed"])).asset_materialization.metadata
    table = metadata["mixture"].value
    assert table.splitlines()[0] == "| source | weight | drawn | rows | share |"
    assert f"| faq | 0.5 | {shares['faq'].drawn} | {shares['faq'].rows} | {shares['faq'].share} |" in table
    assert metadata["share_tickets"].value == shares["tickets"].share
