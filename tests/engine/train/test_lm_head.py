"""The chunked head (train/lm_head.py) gives transformers' loss and TRL's log-probabilities, values and
gradients, a batch at a time and over whole SFT and GRPO runs."""

import pytest
import torch

from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.stages.sft.worker import train_sft
from dragon_dagster.engine.train import lm_head
from tests.engine.train.fast_paths import (
    assert_same_grads,
    collate,
    examples,
    grpo_rows_logged,
    lora_grads,
    progress_rows,
)
from tests.support import sft_job as job
from tests.support import small_lora_model, ticket_files


def test_chunked_loss_equals_transformers_loss_and_gradients():
    model = small_lora_model()
    padded = collate(examples(), padding_free=False)
    plain = model(**padded).loss  # transformers' ForCausalLMLoss on the same labels
    plain.backward()
    expected = lora_grads(model)
    for chunk in (3, 1024):  # several chunks, and one
        lm_head.CHUNK_TOKENS = chunk
        try:
            loss, counts = lm_head.causal_lm_loss(model, padded, padded["labels"])
        finally:
            lm_head.CHUNK_TOKENS = 1024
        assert loss.item() == pytest.approx(plain.item(), rel=1e-5)
        loss.backward()
        assert_same_grads(lora_grads(model), expected)
    assert counts["tokens"] == int((padded["labels"][:, 1:] != -100).sum()) > 0
    # under gradient accumulation the trainer divides by the tokens of all micro-batches
    halved, _ = lm_head.causal_lm_loss(model, padded, padded["labels"], num_items_in_batch=2 * counts["tokens"])
    assert halved.item() == pytest.approx(plain.item() / 2, rel=1e-5)


def test_completion_logprobs_match_trl_fused_head_values_and_gradients():
    from trl.trainer.utils import add_fused_lm_head

    model = small_lora_model()
    ids = torch.randint(0, 300, (3, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded prompt
    mask[2, -2:] = 0  # a completion that ended early
    n, temperature = 5, 0.7
    weights = torch.randn(3, n)
    logps, entropy = lm_head.completion_logprobs(model, ids, mask, n, temperature, chunk=4)
    (logps * weights).sum().backward()
    ours = lora_grads(model)
    add_fused_lm_head(model.get_base_model(), temperature=temperature, outputs=("log_probs", "entropy"))
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-n] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    trl_logps, trl_entropy = out.log_probs[:, -n:], out.entropy[:, -n:]
    assert torch.allclose(logps, trl_logps, atol=1e-5)
    assert torch.allclose(entropy, trl_entropy, atol=1e-4)
    (trl_logps * weights).sum().backward()
    assert_same_grads(ours, lora_grads(model))


@pytest.mark.parametrize("head_trains", [False, True])
def test_chunked_log_probs_give_autograd_values_stats_and_gradients(head_trains):
    """A frozen head (LoRA) forms the hidden states' gradient in forward; a trainable one recomputes the logits
    in backward for its own gradient. Both give what plain autograd over the full logits gives."""
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(11, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(40, 16, generator=g, dtype=torch.float64, requires_grad=head_trains)
    targets = torch.randint(0, 40, (11,), generator=g)
    upstream, temperature = torch.randn(11, generator=g, dtype=torch.float64), 0.7
    out = lm_head.logprobs(hidden, weight, targets, temperature, chunk=4, stats=lm_head.STATS)
    (out["log_probs"] * upstream).sum().backward()
    ours = hidden.grad.clone(), None if weight.grad is None else weight.grad.clone()
    hidden.grad = weight.grad = None
    log_probs = torch.log_softmax(hidden @ weight.t() / temperature, dim=1)
    expected = log_probs.gather(1, targets[:, None]).squeeze(1)
    assert torch.allclose(out["log_probs"].double(), expected, atol=1e-5)
    assert torch.allclose(out["entropy"].double(), -(log_probs.exp() * log_probs).sum(1), atol=1e-5)
    assert torch.allclose(out["mean_logits"].double(), (hidden @ weight.t() / temperature).mean(1), atol=1e-5)
    assert torch.equal(out["is_top1"], targets == log_probs.argmax(1))
    assert torch.allclose(out["log_sum_sq_probs"].double(), torch.logsumexp(2 * log_probs, 1), atol=1e-5)
    (expected * upstream).sum().backward()
    assert torch.allclose(ours[0], hidden.grad, atol=1e-5)  # the logits are float32 inside
    assert (ours[1] is None) == (not head_trains)
    if head_trains:
        assert torch.allclose(ours[1], weight.grad, atol=1e-5)
    with torch.no_grad():  # the reference pass: values only
        assert torch.allclose(
            lm_head.logprobs(hidden, weight, targets, temperature, chunk=4)["log_probs"].double(), expected, atol=1e-5
        )


def sft_losses(tmp_path, tiny_model, train, held, kernel: str) -> list[float]:
    (tmp_path / kernel).mkdir()
    speed = {"loss_kernel": kernel, "packing": "off"}
    run = job(tmp_path / kernel, tiny_model, train, held, speed, max_steps=4, grad_accum=2, learning_rate=5e-2)
    # no LoRA dropout: the chunked path drops over the unpadded tokens, so its masks differ from the padded run's
    run.settings.lora.dropout = 0.0
    assert train_sft(run, Reporter()).speed["loss_kernel"] == kernel  # the path asked for is the one taken
    return [r["loss"] for r in progress_rows(tmp_path / kernel / "out") if r.get("loss") is not None]


def test_sft_with_the_chunked_head_trains_exactly_like_trl(tiny_model, tmp_path):
    train, held = ticket_files(tmp_path, n=40)
    trl_losses = sft_losses(tmp_path, tiny_model, train, held, "trl")
    chunked_losses = sft_losses(tmp_path, tiny_model, train, held, "chunked")
    assert len(trl_losses) >= 3
    assert chunked_losses == pytest.approx(trl_losses, rel=1e-4)  # same loss, same updates, step after step


def test_grpo_with_chunked_log_probs_trains_exactly_like_trl(tiny_model, tmp_path):
    trl_rows = grpo_rows_logged(tmp_path, tiny_model, "trl")
    chunked_rows = grpo_rows_logged(tmp_path, tiny_model, "chunked")
    assert [r["step"] for r in trl_rows] == [1, 2]
    assert trl_rows[0]["reward_std"] > 0 and trl_rows[0]["grad_norm"] > 0  # the rewards disagree: a real gradient
    assert trl_rows[1]["kl"] > 0 and trl_rows[1]["loss"] != 0  # step 2 is off its sampling policy
    assert chunked_rows[0]["reward"] == trl_rows[0]["reward"]  # the same samples
    for key in ("grad_norm", "loss", "kl", "entropy"):
        assert [r.get(key) for r in chunked_rows] == pytest.approx(
            [r.get(key) for r in trl_rows], rel=1e-3, abs=1e-6
        ), key
