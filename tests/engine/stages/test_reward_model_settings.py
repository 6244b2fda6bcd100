"""A pipeline with a reward model, checked when it loads: the reward model stays out of the adapter chain, a
reward_model reward must name one, and a stage optimizing a learned reward must watch something it is not trained
on. And the reward-hacking check reads a learned reward rising while the guard falls."""

import textwrap

import pytest
import yaml

from dragon_dagster.engine.pipeline import PipelineError
from dragon_dagster.engine.pipeline.loading import parse
from dragon_dagster.engine.stages.grpo.result import GRPOResult
from dragon_dagster.engine.train.reinforce.checks import over_optimized

HEAD = """\
name: p
datasets:
  prefs: {path: prefs.csv}
  prompts: {path: prompts.csv}
stages:
  - {name: pairs, kind: pairs_dataset, source: prefs, prompt: q, chosen: good, rejected: bad}
  - {name: sft_rows, kind: chat_dataset, source: prefs, prompt: q, response: good}
  - {name: sft_adapter, kind: sft, dataset: sft_rows}
  - {name: rm, kind: reward_model, dataset: pairs}
"""


def pipeline(tail: str):
    return load_text(HEAD + textwrap.indent(textwrap.dedent(tail), "  "))


def load_text(text: str):
    return parse(yaml.safe_load(text))


def test_the_reward_model_is_read_by_grpo_and_left_out_of_the_chain():
    p = pipeline("""\
    - {name: prompts_ds, kind: prompt_dataset, source: prompts, prompt: q, reference: a}
    - {name: grpo_adapter, kind: grpo, dataset: prompts_ds, rewards: [{type: reward_model, stage: rm}]}
    - {name: merged_model, kind: merge}
    """)
    assert p.upstream("rm") == ["pairs"]  # starts from the base model
    assert p.previous("grpo_adapter") == "sft_adapter"  # continues the policy, not the reward model
    assert p.upstream("grpo_adapter") == ["prompts_ds", "rm", "sft_adapter"]
    assert p.upstream("merged_model") == ["grpo_adapter"]
    assert p.stage("grpo_adapter").watched_metrics(has_references=True) == ["token_f1"]


def test_a_reward_model_reward_must_name_a_reward_model_stage():
    with pytest.raises(PipelineError, match="names 'sft_adapter', which is a sft stage"):
        pipeline("""\
        - {name: prompts_ds, kind: prompt_dataset, source: prompts, prompt: q, reference: a}
        - {name: g, kind: grpo, dataset: prompts_ds, rewards: [{type: reward_model, stage: sft_adapter}]}
        """)
    with pytest.raises(PipelineError, match="not an earlier dataset or stage"):
        pipeline("""\
        - {name: prompts_ds, kind: prompt_dataset, source: prompts, prompt: q, reference: a}
        - {name: g, kind: grpo, dataset: prompts_ds, rewards: [{type: reward_model, stage: later_rm}]}
        """)


def test_a_learned_reward_needs_a_guard_or_references():
    with pytest.raises(PipelineError, match="watches nothing it is not trained on"):
        pipeline("""\
        - {name: prompts_ds, kind: prompt_dataset, source: prompts, prompt: q}
        - {name: g, kind: grpo, dataset: prompts_ds, rewards: [{type: reward_model, stage: rm}]}
        """)
    p = pipeline("""\
    - {name: prompts_ds, kind: prompt_dataset, source: prompts, prompt: q}
    - {name: g, kind: grpo, dataset: prompts_ds, rewards: [{type: reward_model, stage: rm}],
       guard: [{type: length, max_chars: 200}]}
    """)
    assert p.stage("g").rewards_used()[-1].type == "length"  # the guard's custom files travel like rewards


def test_a_reward_model_trains_on_pairs():
    with pytest.raises(PipelineError, match=r"reward_model\) trains on pairs"):
        load_text(
            textwrap.dedent("""\
            name: p
            datasets: {prefs: {path: prefs.csv}}
            stages:
              - {name: rows, kind: chat_dataset, source: prefs, prompt: q, response: good}
              - {name: rm, kind: reward_model, dataset: rows}
            """)
        )


def result(**fields) -> GRPOResult:
    return GRPOResult(objective="grpo", group_size=4, beta=0.04, temperature=1.0, max_new_tokens=32, **fields)


def test_over_optimization_is_a_learned_reward_up_while_the_guard_goes_down():
    kinds = {"taste": "reward_model", "numeric": "numeric"}
    hacked = result(
        reward_kinds=kinds,
        per_reward_before={"taste": 0.1, "numeric": 0.5},
        per_reward_after={"taste": 2.0, "numeric": 0.5},
        guard_before={"token_f1": 0.4},
        guard_after={"token_f1": 0.2},
    )
    assert over_optimized(hacked) == (["taste"], ["token_f1"])
    honest = hacked.model_copy(update={"guard_after": {"token_f1": 0.45}})
    assert over_optimized(honest) == (["taste"], [])
