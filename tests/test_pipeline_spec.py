import pytest

from dragon_dagster.engine import pipeline_spec
from dragon_dagster.engine.pipeline_spec import PipelineError

from .conftest import write_pipeline


def test_bundled_support_pipeline_has_the_documented_chain():
    support = {p.name: p for p in pipeline_spec.discover()}["support"]
    assert list(support.datasets) == ["tickets"]
    assert [s.name for s in support.stages] == ["sft_dataset", "sft_adapter", "preference_pairs", "dpo_adapter",
                                                "arithmetic_prompts", "grpo_adapter", "merged_model",
                                                "evaluation_report"]
    upstream = {s.name: s.upstream for s in support.stages}
    assert upstream == {"sft_dataset": ["tickets"], "sft_adapter": ["sft_dataset"],
                        "preference_pairs": ["sft_dataset", "sft_adapter"],
                        "dpo_adapter": ["preference_pairs", "sft_adapter"], "arithmetic_prompts": [],
                        "grpo_adapter": ["arithmetic_prompts", "dpo_adapter"], "merged_model": ["grpo_adapter"],
                        "evaluation_report": ["merged_model", "sft_dataset"]}
    rewards = support.stage("grpo_adapter").settings["rewards"]
    assert [r["type"] for r in rewards] == ["numeric", "length"]
    assert support.model == "smollm2-135m"
    assert support.datasets["tickets"]["path"].endswith("example_data/tickets.csv")
    assert "sft_adapter" in support.profile("quick")


def test_definitions_hold_the_support_assets_with_lineage():
    from dagster import AssetKey

    from dragon_dagster.definitions import defs

    graph = defs.resolve_asset_graph()
    key = lambda name: AssetKey(["support", name])  # noqa: E731
    assert {key(n) for n in ("tickets", "sft_dataset", "sft_adapter", "merged_model", "evaluation_report")} <= set(
        graph.get_all_asset_keys())
    assert graph.get(key("sft_adapter")).parent_keys == {key("sft_dataset")}
    assert graph.get(key("preference_pairs")).parent_keys == {key("sft_dataset"), key("sft_adapter")}
    assert graph.get(key("dpo_adapter")).parent_keys == {key("preference_pairs"), key("sft_adapter")}
    assert graph.get(key("grpo_adapter")).parent_keys == {key("arithmetic_prompts"), key("dpo_adapter")}
    assert graph.get(key("merged_model")).parent_keys == {key("grpo_adapter")}
    assert graph.get(key("evaluation_report")).parent_keys == {key("merged_model"), key("sft_dataset")}
    # training-like assets share one concurrency pool so two never fight over a GPU
    pools = {k.path[-1]: graph.get(k).pools for k in graph.get_all_asset_keys() if k.path[0] == "support"}
    for name in ("sft_adapter", "preference_pairs", "dpo_adapter", "grpo_adapter", "merged_model", "evaluation_report"):
        assert pools[name] == {"training"}, name
    assert defs.resolve_job_def("support_pipeline") is not None


def test_a_yaml_file_in_a_pipelines_dir_adds_a_pipeline(tmp_path, monkeypatch):
    write_pipeline(tmp_path, tmp_path / "some-model", name="mine")
    monkeypatch.setenv("DRAGON_PIPELINES_DIR", str(tmp_path))
    from dragon_dagster.definitions import build_definitions

    keys = {k.to_user_string() for k in build_definitions().resolve_asset_graph().get_all_asset_keys()}
    assert {"mine/tickets", "mine/sft_adapter", "mine/evaluation_report", "support/sft_adapter"} <= keys


@pytest.mark.parametrize("yaml_text,message", [
    ("name: Bad Name\nstages: []", "name must be"),
    ("name: x\nstages:\n  - {name: a, kind: teleport}", "unknown kind 'teleport'"),
    ("name: x\nstages:\n  - {name: a, kind: sft, dataset: nowhere}", "needs dataset"),
    ("name: x\ndatasets: {d: {path: a.csv}}\nstages:\n  - {name: m, kind: merge}", "no training stage before"),
    ("name: x\nstages: []", "no stages"),
    ("name: x\ndatasets: {d: {path: a.csv}}\nstages:\n  - {name: p, kind: pairs_dataset, source: d, prompt: q, "
     "chosen: c, rejected: r}\n  - {name: o, kind: preference, method: orpo, dataset: p}", "no training stage before it"),
    ("name: x\nstages: [\n", "not valid YAML"),
])
def test_malformed_pipelines_are_named(tmp_path, yaml_text, message):
    path = tmp_path / "p.yaml"
    path.write_text(yaml_text)
    with pytest.raises(PipelineError, match=message):
        pipeline_spec.load(path)
