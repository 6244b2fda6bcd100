"""The unpadded forward (train/unpadded.py): the padded batch's log-probabilities and gradients from the
real tokens alone, a GRPO group's prompt run once, generation unchanged."""

import pytest
import torch

from dragon_dagster.engine.train import lm_head
from tests.engine.train.fast_paths import assert_same_grads, collate, examples, lora_grads, ragged_batch
from tests.support import small_lora_model


def test_unpadded_forward_gives_the_padded_log_probs_and_gradients():
    from dragon_dagster.engine.train import unpadded

    model = small_lora_model()
    ids, mask = ragged_batch()
    n, weights = 6, torch.randn(4, 6)
    logps, entropy = lm_head.completion_logprobs(model, ids, mask, n, 0.7, chunk=4)
    (logps * weights).sum().backward()
    expected = lora_grads(model)
    with pytest.raises(RuntimeError, match="unpadded.use"):  # plain SDPA would let the rows attend to each other
        lm_head.completion_logprobs(model, ids, mask, n, 0.7, unpad=True)
    unpadded.use(model)
    fast, fast_entropy = lm_head.completion_logprobs(model, ids, mask, n, 0.7, chunk=4, unpad=True)
    assert torch.allclose(fast, logps, atol=1e-5) and torch.allclose(fast_entropy, entropy, atol=1e-4)
    assert (fast[2, -2:] == 0).all() and (fast[3, -1] == 0)  # padding after a completion scores zero
    (fast * weights).sum().backward()
    assert_same_grads(lora_grads(model), expected)
    # the padded path (generation, evaluation) goes on through transformers' SDPA and its mask
    again, _ = lm_head.completion_logprobs(model, ids, mask, n, 0.7)
    assert torch.allclose(again, logps, atol=1e-6)


def test_unpadded_sft_loss_equals_the_padded_loss_and_generation_is_unchanged():
    from dragon_dagster.engine.train import unpadded

    model = small_lora_model()
    padded = collate(examples(), padding_free=False)
    prompt = torch.tensor([[5, 6, 7, 8]])
    before = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=5, do_sample=False)
    plain, counts = lm_head.causal_lm_loss(model, padded, padded["labels"])
    plain.backward()
    expected = lora_grads(model)
    unpadded.use(model)
    fast, fast_counts = lm_head.causal_lm_loss(model, padded, padded["labels"], unpad=True)
    assert fast.item() == pytest.approx(plain.item(), rel=1e-5) and fast_counts == counts
    fast.backward()
    assert_same_grads(lora_grads(model), expected)
    after = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=5, do_sample=False)
    assert torch.equal(before, after)


def test_a_grpo_group_runs_its_prompt_once_and_scores_as_the_padded_batch():
    from dragon_dagster.engine.train import unpadded

    model = small_lora_model()
    g = torch.Generator().manual_seed(7)
    n = 5
    prompts = [torch.randint(0, 300, (k,), generator=g) for k in (6, 4)]  # two prompts, three completions each
    ids = torch.zeros(6, 6 + n, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row in range(6):
        prompt = prompts[row // 3]
        ids[row, 6 - len(prompt) : 6] = prompt  # left-padded to one width, as TRL pads prompts
        ids[row, 6:] = torch.randint(0, 300, (n,), generator=g)
        mask[row, 6 - len(prompt) :] = 1
    mask[4, -2:] = 0  # a completion that ended early
    replies = torch.zeros(6, ids.shape[1] - 1, dtype=torch.bool)
    replies[:, -n:] = True
    flat = unpadded.layout(ids, mask, reply_starts=replies.int().argmax(dim=1) + 1)
    assert len(flat.tokens) == int(mask.sum()) - 2 * 6 - 2 * 4  # each prompt once, not three times
    weights = torch.randn(6, n)
    logps, _ = lm_head.completion_logprobs(model, ids, mask, n, 0.9)
    (logps * weights).sum().backward()
    expected = lora_grads(model)
    unpadded.use(model)
    fast, _ = lm_head.completion_logprobs(model, ids, mask, n, 0.9, unpad=True)
    assert torch.allclose(fast, logps, atol=1e-5)
    (fast * weights).sum().backward()
    assert_same_grads(lora_grads(model), expected)
