"""Dataset mixtures (issue 62): a dataset stage reads several sources with weights through datasets'
interleave_datasets; duplicates, the held-out split and the leak check run on the whole mixture."""

import textwrap

import datasets
import pandas as pd
import pytest

from dragon_dagster.engine.data import errors
from dragon_dagster.engine.data.prepare import prepare
from dragon_dagster.engine.pipeline import PipelineError, load
from dragon_dagster.engine.pipeline.preflight import problems
from dragon_dagster.engine.stages.chat_dataset.settings import ChatDataset
from dragon_dagster.engine.stages.prompt_dataset.settings import PromptDataset


def table(name: str, n: int, prompt: str = "{name} question {i}") -> pd.DataFrame:
    return pd.DataFrame(
        {"q": [prompt.format(name=name, i=i) for i in range(n)], "r": [f"{name} answer {i}" for i in range(n)]}
    )


def mixed(**settings) -> ChatDataset:
    return ChatDataset(name="mixed", kind="chat_dataset", prompt="q", response="r", **settings)


def test_ten_thousand_rows_from_three_sources_match_their_weights():
    stage = mixed(
        sources=[{"source": "a", "weight": 5}, {"source": "b", "weight": 3}, {"source": "c", "weight": 2}],
        mix_rows=10_000,
    )
    prepared = prepare(stage, {name: table(name, 6000) for name in "abc"})
    assert len(prepared.rows) == 10_000 and prepared.duplicates == 0
    shares = {m["source"]: m for m in prepared.mixture}
    for name, weight in zip("abc", (0.5, 0.3, 0.2), strict=True):
        assert shares[name]["weight"] == weight and shares[name]["rows"] == shares[name]["drawn"]
        assert abs(shares[name]["share"] - weight) < 0.02, shares
    # every row came from the source its label names, as many as the proportions say
    from_a = sum(row["prompt"][-1]["content"].startswith("a ") for row in prepared.rows)
    assert from_a == shares["a"]["rows"]


def test_the_settings_reach_interleave_datasets(monkeypatch):
    calls = []
    real = datasets.interleave_datasets

    def spy(parts, **kwargs):  # the library's own draw, its arguments recorded
        calls.append(({len(p) for p in parts}, kwargs))
        return real(parts, **kwargs)

    monkeypatch.setattr(datasets, "interleave_datasets", spy)
    sources = [{"source": "a", "weight": 3}, {"source": "b", "weight": 1}]
    frames = {"a": table("a", 40), "b": table("b", 100)}
    first = prepare(mixed(sources=sources, seed=7), frames)
    assert calls[-1] == ({40, 100}, {"probabilities": [0.75, 0.25], "seed": 7, "stopping_strategy": "first_exhausted"})
    # first_exhausted stops when a runs out: no row twice, b's rows left over
    assert {m["source"]: m["drawn"] for m in first.mixture}["a"] == 40 and len(first.rows) < 140
    every = prepare(mixed(sources=sources, seed=7, stopping_strategy="all_exhausted_without_replacement"), frames)
    assert calls[-1][1]["stopping_strategy"] == "all_exhausted_without_replacement" and len(every.rows) == 140
    again = prepare(mixed(sources=sources, seed=8), frames)
    assert calls[-1][1]["seed"] == 8 and again.rows != first.rows  # the seed decides the draw
    assert prepare(mixed(sources=sources, seed=7), frames).rows == first.rows


def test_all_exhausted_repeats_rows_that_dedupe_then_drops():
    sources = [{"source": "a", "weight": 1}, {"source": "b", "weight": 1}]
    frames = {"a": table("a", 10), "b": table("b", 30)}
    prepared = prepare(mixed(sources=sources, stopping_strategy="all_exhausted"), frames)
    share = {m["source"]: m for m in prepared.mixture}
    assert share["a"]["drawn"] > 10 and share["a"]["rows"] == 10 and share["b"]["rows"] == 30
    assert prepared.duplicates == share["a"]["drawn"] + share["b"]["drawn"] - 40
    with pytest.raises(errors.DataError, match="mix_rows 100 is more than the .* first_exhausted .* all_exhausted"):
        prepare(mixed(sources=sources, mix_rows=100), frames)


def test_the_held_out_split_and_the_leak_check_see_every_source():
    """A prompt that two sources both ask lands on one side: the split groups the whole mixture by prompt."""
    shared = "shared question {i}"
    frames = {"a": table("a", 60, shared), "b": table("b", 60, shared)}  # the same prompts, other replies
    stage = mixed(sources=[{"source": "a", "weight": 1}, {"source": "b", "weight": 1}], eval_frac=0.25)
    prepared = prepare(stage, frames)
    held = {row["prompt"][-1]["content"] for row in prepared.held}
    train = {row["prompt"][-1]["content"] for row in prepared.train}
    assert held and train and not held & train
    assert prepared.leakage["prompt_overlap"] == 0.0
    assert {m["source"]: m["rows"] > 0 for m in prepared.mixture} == {"a": True, "b": True}
    # the same rows in two sources are one row: dedupe runs across the mixture too
    twice = prepare(stage, {"a": table("x", 30), "b": table("x", 30)})
    assert twice.duplicates > 0 and len(twice.rows) == len({r["prompt"][-1]["content"] for r in twice.rows})


def test_every_dataset_kind_mixes_and_a_source_s_error_names_it():
    prompts = PromptDataset(
        name="prompts",
        kind="prompt_dataset",
        prompt="q",
        reference="r",
        sources=[{"source": "a", "weight": 1}, {"path": "b.csv", "weight": 1}],
    )
    prepared = prepare(prompts, {"a": table("a", 20), "b.csv": table("b", 20)})
    assert {m["source"] for m in prepared.mixture} == {"a", "b.csv"} and prepared.rows[0]["reference"]
    with pytest.raises(errors.DataError, match="source 'b.csv': .*'r'"):
        prepare(prompts, {"a": table("a", 20), "b.csv": table("b", 20).drop(columns="r")})


def pipeline_with(tmp_path, stage: str):
    for name in ("a", "b"):
        table(name, 30).to_csv(tmp_path / f"{name}.csv", index=False)
    table("c", 30).rename(columns={"r": "reply"}).to_csv(tmp_path / "c.csv", index=False)
    path = tmp_path / "defs.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: mix
        datasets: {{a: {{path: a.csv}}, b: {{path: b.csv}}, c: {{path: c.csv}}}}
        stages:
          - {{name: mixed, kind: chat_dataset, prompt: q, response: r, {stage}}}
        """)
    )
    return load(path)


@pytest.mark.parametrize(
    "stage, error",
    [
        ("sources: [{source: a, weight: 0}, {source: b, weight: 1}]", r"sources\[0\].weight.*0.0 is not above 0"),
        ("sources: [{source: a, weight: 1}, {source: b, weight: -2}]", r"sources\[1\].weight.*-2.0 is not above 0"),
        (
            "source: a, sources: [{source: a, weight: 1}, {source: b, weight: 1}]",
            "exactly one of source .*, path .* or sources .*, not source and sources",
        ),
        ("sources: [{source: a, weight: 1}, {source: nope, weight: 1}]", "'nope', which is not an earlier dataset"),
        ("sources: [{source: a, weight: 1}, {source: a, weight: 2}]", r"sources lists \['a'\] twice"),
        ("sources: [{source: a, weight: 1}]", "a mixture needs two sources at least"),
        ("sources: [{source: a, path: a.csv, weight: 1}, {source: b, weight: 1}]", "exactly one of source .* or path"),
        ("source: a, mix_rows: 10", "mix_rows goes with sources"),
    ],
)
def test_a_bad_mixture_is_refused_with_its_reason(tmp_path, stage, error):
    with pytest.raises(PipelineError, match=error):
        pipeline_with(tmp_path, stage)


def test_preflight_names_the_source_missing_a_column(tmp_path):
    pipeline = pipeline_with(tmp_path, "sources: [{source: a, weight: 1}, {source: c, weight: 1}], mix_rows: 20")
    [found] = problems(pipeline)
    assert found.startswith("mixed: source 'c': response 'r' names missing column(s) ['r']; ") and "c.csv" in found
    assert pipeline.stage("mixed").reads() == ["a", "c"]
    files = pipeline.stage("mixed").source_files(pipeline)
    assert [(label, str(path)) for label, path, _ in files] == [(n, str(tmp_path / f"{n}.csv")) for n in "ac"]
    located = pipeline_with(tmp_path, "sources: [{source: a, weight: 1}, {path: b.csv, weight: 2}]")
    assert located.stage("mixed").sources[1].path == str(tmp_path / "b.csv") and problems(located) == []
