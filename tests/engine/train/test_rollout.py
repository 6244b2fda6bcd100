"""GRPO's sampling (train/rollout.py): each prompt prefilled once, inverse-CDF draws of the distribution asked,
the log-probabilities recorded while sampling, and a round of samples serving several steps."""

import pytest
import torch

from dragon_dagster.engine import catalog
from dragon_dagster.engine.config.hardware import Speed
from dragon_dagster.engine.config.job import TrainingInputs
from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.stages.grpo.settings import GRPO
from dragon_dagster.engine.train import lm_head
from tests.engine.train.fast_paths import grpo_rows_logged
from tests.support import small_lora_model


@pytest.mark.parametrize("loop", ["ours", "generate's"])
def test_grouped_sampling_prefills_each_prompt_once_and_decodes_the_same_tokens(loop, monkeypatch):
    from dragon_dagster.engine.infer import decode_loop
    from dragon_dagster.engine.train import rollout

    if loop != "ours":  # a model the decoding loop does not run: generate's loop on a cache prefilled by rollout
        monkeypatch.setattr(decode_loop, "unsupported_model", lambda model: "switched off by the test")
    model = small_lora_model()
    prompts = torch.tensor([[0, 0, 11, 12, 13], [21, 22, 23, 24, 25]])  # one left-padded
    ids = prompts.repeat_interleave(3, dim=0)  # each prompt three times, as TRL's rows repeat it
    mask = (ids != 0).long()
    assert rollout.groups_of(ids, mask) == 3
    assert rollout.groups_of(ids[[0, 3, 1, 4, 2, 5]], mask[[0, 3, 1, 4, 2, 5]]) == 1  # interleaved: no groups
    assert rollout.groups_of(ids[:4], mask[:4]) == 1  # a group cut short
    model.eval()
    plain = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    model.train()
    calls = []  # (the tokens a forward pass embeds, train mode): once a forward in either loop
    embeddings = model.get_base_model().model.embed_tokens
    handle = embeddings.register_forward_pre_hook(lambda module, args: calls.append((args[0].shape, model.training)))
    with rollout.sampling(model):
        grouped = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    handle.remove()
    assert torch.equal(grouped, plain)  # same tokens (greedy)
    # the prefill: one row per prompt (generate's loop: all but its last token, which its first step runs)
    assert calls[0][0] == ((2, 5) if loop == "ours" else (2, 4))
    assert all(shape[0] == 6 for shape, _ in calls[1:])  # then every row decodes
    assert not any(training for _, training in calls)  # sampled in eval mode: no LoRA dropout
    assert model.training and "generate" not in model.__dict__  # train mode and the method are restored


def test_inverse_cdf_sampling_draws_the_same_distribution_as_multinomial():
    from dragon_dagster.engine.train import rollout

    torch.manual_seed(0)
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2], [0.0, 0.0, 0.0, 1.0]]) * 3  # unnormalized, as multinomial accepts
    draws = rollout.inverse_cdf(probs.repeat(50_000, 1), num_samples=1)
    assert draws.shape == (100_000, 1)
    first = torch.bincount(draws[0::2, 0], minlength=4).float() / 50_000
    assert torch.allclose(first, torch.tensor([0.5, 0.0, 0.3, 0.2]), atol=0.01)  # sd about 0.002
    assert first[1] == 0 and (draws[1::2] == 3).all()  # a word of probability 0 is never drawn
    assert rollout.inverse_cdf(probs, num_samples=2).shape == (2, 2)  # other uses go to torch.multinomial
    model = small_lora_model()
    ids = torch.tensor([[5, 6, 7]])
    with rollout.sampling(model):
        model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=True, pad_token_id=0
        )
    assert torch.multinomial is rollout._multinomial  # restored after sampling


def test_inverse_cdf_sums_in_float32_where_the_device_has_no_float64():
    """MPS has no float64: the running sum is float32 there, and still draws the distribution asked for."""
    from dragon_dagster.engine.train import rollout

    assert rollout.running_dtype("mps") == torch.float32
    assert rollout.running_dtype("cpu") == rollout.running_dtype("cuda") == torch.float64
    torch.manual_seed(0)
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2]]) * 3
    record = []
    draws = rollout.inverse_cdf(probs.repeat(50_000, 1), num_samples=1, record=record, dtype=torch.float32)
    shares = torch.bincount(draws[:, 0], minlength=4).float() / 50_000
    assert torch.allclose(shares, torch.tensor([0.5, 0.0, 0.3, 0.2]), atol=0.01) and shares[1] == 0
    assert record[0].dtype == torch.float32
    assert torch.allclose(record[0], torch.tensor([0.5, 0.0, 0.3, 0.2]).log()[draws[:, 0]])


def test_sampling_records_the_log_probabilities_a_forward_pass_gives():
    """What a round serving several GRPO steps keeps as the old policy's log-probabilities."""
    from dragon_dagster.engine.train import rollout

    model = small_lora_model()
    ids = torch.tensor([[0, 0, 11, 12, 13], [21, 22, 23, 24, 25]]).repeat_interleave(2, dim=0)
    mask = (ids != 0).long()
    record = []
    torch.manual_seed(0)
    with rollout.sampling(model, record):
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=6,
            do_sample=True,
            temperature=0.7,
            top_k=0,
            pad_token_id=0,
            eos_token_id=None,
        )
    recorded = torch.stack(record, dim=1)
    assert recorded.shape == (4, 6) and (recorded < 0).all()
    model.eval()
    with torch.no_grad():
        logps, _ = lm_head.completion_logprobs(
            model, out, torch.cat([mask, torch.ones(4, 6, dtype=torch.long)], 1), 6, 0.7
        )
    assert torch.allclose(recorded, logps, atol=1e-4)


def test_a_round_serving_two_steps_takes_the_old_policy_from_sampling_not_another_pass(
    tiny_model, tmp_path, monkeypatch
):
    calls = []
    scored = lm_head.completion_logprobs

    def counted(model, input_ids, *args, **kwargs):
        calls.append((input_ids.shape[0], torch.is_grad_enabled()))
        return scored(model, input_ids, *args, **kwargs)

    monkeypatch.setattr(lm_head, "completion_logprobs", counted)
    rows = grpo_rows_logged(tmp_path, tiny_model, "chunked")  # 2 steps from one round of 32 completions, beta 0.04
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["kl"] > 0
    without_grad = [n for n, grad in calls if not grad]
    # the reference pass over the round's 32 completions (in chunks of a step's 16), and no old-policy pass
    assert sum(without_grad) == 32 and sum(n for n, grad in calls if grad) == 32


def test_grpo_generation_batch_must_hold_whole_steps(tiny_model, tmp_path):
    from dragon_dagster.engine.stages.grpo.worker import train_grpo

    settings = GRPO(
        name="grpo_adapter",
        kind="grpo",
        dataset="prompts",
        args={"batch_size": 2},
        group_size=4,
        rewards=[{"type": "length", "max_chars": 5}],
    )
    run = catalog.get("grpo").job_model()(
        settings=settings,
        inputs=TrainingInputs(
            model=str(tiny_model), train_file=str(tmp_path / "none.jsonl"), checkpoint_dir=str(tmp_path / "ckpt")
        ),
        output_dir=str(tmp_path),
        speed=Speed(generation_batch_size=12),
    )
    with pytest.raises(ValueError, match=r"generation_batch_size \(12\) must be a multiple .* = 8"):
        train_grpo(run, Reporter())
