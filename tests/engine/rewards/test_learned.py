"""The reward_model reward without a model: a scorer bound by hand stands for the loaded reward model (a real one
is trained and loaded in tests/assets/test_reward_model.py). Normalization within TRL's groups, the scales, the
errors that name the stage, and the TRL adapter handing it whole batches."""

import math

import pytest

from dragon_dagster.engine.rewards import LEARNED_TYPES, RewardError, RewardSet, parse_reward, trl_reward_funcs
from dragon_dagster.engine.rewards.learned import within_groups


def length_scorer(calls: list):
    def score(prompts, replies):
        calls.append(len(replies))
        return [float(len(r)) for r in replies]

    return score


def test_within_groups_ranks_each_prompts_completions_against_each_other():
    scores = within_groups([1.0, 3.0, 5.0, 5.0, 7.0], ["a", "a", "b", "b", "c"])
    assert scores[:2] == [-1.0, 1.0]  # (x - mean) / std within "a"
    assert scores[2:] == [0.0, 0.0, 0.0]  # a group that all scored the same, and a lone reply, teach nothing


def test_a_spec_names_its_stage_and_a_known_scale():
    reward = parse_reward({"type": "reward_model", "stage": "taste_model"})
    assert reward.name == "reward_model" and reward.normalize == "group" and reward.type in LEARNED_TYPES
    with pytest.raises(RewardError, match="needs stage"):
        parse_reward({"type": "reward_model"})
    with pytest.raises(RewardError, match="normalize = 'zscore': Input should be 'group', 'sigmoid' or 'none'"):
        parse_reward({"type": "reward_model", "stage": "rm", "normalize": "zscore"})


def test_scoring_without_the_model_names_the_stage():
    rewards = RewardSet([{"type": "reward_model", "stage": "taste_model"}])
    with pytest.raises(RewardError, match="taste_model"):
        rewards.score(["hi"], [{"prompt": [{"role": "user", "content": "q"}]}])


def test_trl_functions_score_a_batch_at_once_and_normalize_per_group():
    calls = []
    rewards = RewardSet([{"type": "reward_model", "stage": "rm", "name": "taste"}, {"type": "length", "max_chars": 99}])
    rewards.bind_scorers({"rm": length_scorer(calls)})
    prompts = [[{"role": "user", "content": p}] for p in ("x", "x", "y", "y")]
    completions = [[{"role": "assistant", "content": c}] for c in ("a", "aaa", "bb", "bb")]
    taste = trl_reward_funcs(rewards)[0]
    assert taste.__name__ == "taste"
    assert taste(prompts, completions) == [-1.0, 1.0, 0.0, 0.0]
    assert calls == [4]  # one call for the whole batch: a forward pass, not one per reply


def test_held_out_scoring_reads_raw_scores_and_sigmoid_reads_zero_to_one():
    rows = [{"prompt": [{"role": "user", "content": "x"}]}] * 2
    raw = RewardSet([{"type": "reward_model", "stage": "rm"}]).bind_scorers({"rm": length_scorer([])})
    assert raw.score(["a", "aaa"], rows).scores["reward_model"] == [1.0, 3.0]  # a lone reply per prompt: raw
    squashed = RewardSet([{"type": "reward_model", "stage": "rm", "normalize": "sigmoid"}])
    squashed.bind_scorers({"rm": length_scorer([])})
    assert squashed.score(["a"], rows[:1]).scores["reward_model"] == [pytest.approx(1 / (1 + math.exp(-1)))]


def test_a_non_finite_score_is_an_error_or_a_counted_zero():
    rewards = RewardSet([{"type": "reward_model", "stage": "rm"}])
    rewards.bind_scorers({"rm": lambda prompts, replies: [float("nan")] * len(replies)})
    rows = [{"prompt": "q"}] * 3
    with pytest.raises(RewardError, match="non-finite"):
        rewards.score(["a", "b", "c"], rows)
    scores = rewards.score(["a", "b", "c"], rows, on_error="zero")
    assert scores.scores["reward_model"] == [0.0, 0.0, 0.0] and scores.errors["reward_model"] == 3
