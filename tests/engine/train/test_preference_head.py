"""The chunked preference head (train/preference_head.py): what DPO, ORPO and KTO read from TRL's fused head,
the same values and gradients, with a pair's or a rated prompt's common prompt run once."""

import pytest
import torch

from tests.engine.train.fast_paths import assert_same_grads, dpo_batch, lora_grads, ragged_batch
from tests.support import small_lora_model


@pytest.mark.parametrize("unpad", [False, True])
def test_chunked_preference_head_gives_trl_fused_head_values_and_gradients(unpad):
    """What DPO and KTO read from TRL's fused head (add_fused_lm_head), from the chunked one."""
    from trl.trainer.utils import add_fused_lm_head

    from dragon_dagster.engine.train import unpadded
    from dragon_dagster.engine.train.preference_head import use_chunked_head

    model = small_lora_model()
    ids, mask = ragged_batch()
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :6] = -100  # the prompt is not scored
    fields = ("log_probs", "entropy", "mean_logits", "is_top1", "log_sum_sq_probs")
    add_fused_lm_head(model.get_base_model(), outputs=fields)
    weights = torch.randn(4, 11)

    def run():
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        ((out.log_probs * weights).sum() + out.loss).backward()
        return out, lora_grads(model)

    expected, expected_grads = run()
    if unpad:
        unpadded.use(model)
    use_chunked_head(model.get_base_model(), unpad=unpad, weighting=True)
    ours, grads = run()
    for field in fields:
        assert torch.allclose(getattr(ours, field).float(), getattr(expected, field).float(), atol=1e-4), field
    assert torch.equal(ours.label_mask, expected.label_mask)
    assert ours.loss.item() == pytest.approx(expected.loss.item(), rel=1e-5)
    assert_same_grads(grads, expected_grads)
    # generation goes through TRL's forward, unchanged
    assert model.generate(ids[:1, :4], max_new_tokens=3, do_sample=False).shape == (1, 7)


def test_chunked_orpo_forward_gives_trl_values_and_gradients():
    from types import SimpleNamespace

    from trl.experimental.orpo import ORPOTrainer

    from dragon_dagster.engine.train import unpadded
    from dragon_dagster.engine.train.preference_head import orpo_forward

    model = small_lora_model()
    ids, mask = ragged_batch(rows=4, length=10)
    ids, mask = ids[[0, 2, 1, 3]], mask[[0, 2, 1, 3]]  # right padding only, as ORPO's collator pads
    mask[2:] = 1
    mask[2, -3:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :4] = -100
    batch = {
        "chosen_input_ids": ids[:2],
        "chosen_attention_mask": mask[:2],
        "chosen_labels": labels[:2],
        "rejected_input_ids": ids[2:],
        "rejected_attention_mask": mask[2:],
        "rejected_labels": labels[2:],
    }
    trainer = SimpleNamespace(
        concatenated_inputs=ORPOTrainer.concatenated_inputs,
        is_encoder_decoder=False,
        get_batch_logps=ORPOTrainer.get_batch_logps,
        padding_value=0,
        aux_loss_enabled=False,
        accelerator=SimpleNamespace(device=torch.device("cpu")),
    )

    def loss(out):  # every output that carries a gradient, weighted apart
        return out[0].sum() * 0.3 - out[1].sum() * 0.7 + out[4]

    expected = ORPOTrainer.concatenated_forward(trainer, model, batch)
    loss(expected).backward()
    expected_grads = lora_grads(model)
    unpadded.use(model)
    concatenated = ORPOTrainer.concatenated_inputs(batch)
    for unpad in (False, True):
        ours = orpo_forward(model, concatenated, 2, unpad)
        for i in (0, 1, 4):
            assert torch.allclose(ours[i], expected[i], atol=1e-5), i
        # logits/* metrics: the mean logit over the scored positions, not over every position
        assert ours[2].shape[0] == int(mask[:2, 1:].sum()) and ours[2].mean().abs() < 1
        loss(ours).backward()
        assert_same_grads(lora_grads(model), expected_grads)


def test_dpo_pairs_run_their_common_prompt_once_and_give_trl_values_and_gradients():
    from trl.trainer.utils import add_fused_lm_head

    from dragon_dagster.engine.train import unpadded
    from dragon_dagster.engine.train.preference_head import use_chunked_head

    model = small_lora_model()
    ids, mask, labels = dpo_batch()
    starts = (labels[:, 1:] != -100).int().argmax(dim=1) + 1
    flat = unpadded.layout(ids, mask, reply_starts=starts)
    assert len(flat.tokens) == int(mask.sum()) - 5 - 3  # pairs 0 and 1 lay their prompt down once, pair 2 twice
    assert flat.prefixes.count(None) == 4 and flat.prefixes[3] == (0, 5)  # rejected reply 0 attends to prompt 0
    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    weights = torch.randn(ids.shape[0], ids.shape[1] - 1)

    def run():
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        (out.log_probs * weights).sum().backward()
        return out, lora_grads(model)

    expected, expected_grads = run()
    unpadded.use(model)
    use_chunked_head(model.get_base_model(), unpad=True, paired=True)
    ours, grads = run()
    for field in ("log_probs", "entropy", "mean_logits", "is_top1"):
        assert torch.allclose(getattr(ours, field).float(), getattr(expected, field).float(), atol=1e-4), field
    assert_same_grads(grads, expected_grads)


def kto_batch(vocab=300, seed=9):
    """TRL's KTO batch of four rated replies (rows 0 and 2 answer one prompt, as unpaired pairs do) and the
    mismatched rows its KL term pairs them with (each prompt with the previous row's reply), as its collator pads."""
    from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (5, 3, 5, 4)]
    prompts[2] = prompts[0]
    replies = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (4, 1, 6, 3)]
    rows = [
        {"prompt_ids": p, "completion_ids": r, "KL_completion_ids": replies[i - 1], "label": i % 2 == 0}
        for i, (p, r) in enumerate(zip(prompts, replies))
    ]
    return DataCollatorForUnpairedPreference(pad_token_id=0)(rows), prompts, replies


def test_kto_mismatched_replies_continue_the_rated_prompts_and_the_reference_runs_once(monkeypatch):
    from types import SimpleNamespace

    from trl.trainer.utils import add_fused_lm_head

    from dragon_dagster.engine.stages.kto.trainer import same_prompts, shared_prompt_trainer
    from dragon_dagster.engine.train import unpadded
    from dragon_dagster.engine.train.preference_head import Continuations, use_chunked_head

    model = small_lora_model()
    batch, prompts, replies = kto_batch()
    assert same_prompts(batch)
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    kl_labels = batch["KL_input_ids"].masked_fill(batch["KL_completion_mask"] == 0, -100)
    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    weights = torch.randn(labels.shape[0], labels.shape[1] - 1)

    def trl_pass(ids, mask, scored):
        return model(input_ids=ids, attention_mask=mask, labels=scored, fused_lm_head=True).log_probs.sum(-1)

    with torch.no_grad():  # TRL's four passes: policy and reference, over the mismatched and the rated rows
        kl = trl_pass(batch["KL_input_ids"], batch["KL_attention_mask"], kl_labels)
        with model.disable_adapter():
            ref = trl_pass(batch["input_ids"], batch["attention_mask"], labels)
            ref_kl = trl_pass(batch["KL_input_ids"], batch["KL_attention_mask"], kl_labels)
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels, fused_lm_head=True)
    (out.log_probs * weights).sum().backward()
    expected_grads = lora_grads(model)

    unpadded.use(model)
    use_chunked_head(model.get_base_model(), unpad=True, paired=True)
    ran = []  # tokens of each padding-free pass
    flat = unpadded.flat_hidden_states
    monkeypatch.setattr(
        unpadded, "flat_hidden_states", lambda b, tokens, *a, **k: ran.append(len(tokens)) or flat(b, tokens, *a, **k)
    )
    rows = Continuations(batch["KL_input_ids"], batch["KL_attention_mask"], batch["KL_completion_mask"], torch.zeros(4))
    ours = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        labels=labels,
        fused_lm_head=True,
        continuations=rows,
    )
    assert torch.allclose(rows.logps, kl, atol=1e-4) and not rows.logps.requires_grad
    assert torch.allclose(ours.log_probs, out.log_probs, atol=1e-5)
    (ours.log_probs * weights).sum().backward()
    assert_same_grads(lora_grads(model), expected_grads)
    trainer = SimpleNamespace(accelerator=SimpleNamespace(unwrap_model=lambda m: m), model=model)
    ours_ref, ours_ref_kl = shared_prompt_trainer()._reference_logps(trainer, batch)
    assert torch.allclose(ours_ref, ref, atol=1e-4) and torch.allclose(ours_ref_kl, ref_kl, atol=1e-4)
    # the rated pass lays prompt 0 down once for rows 0 and 2; the mismatched replies run without their prompts
    # or their last token; the reference runs each distinct prompt once for all four rows and both replies
    tokens = sum(map(len, prompts)) + sum(map(len, replies))
    assert ran == [tokens - 5, sum(len(r) - 1 for r in replies), tokens - 5 + sum(map(len, replies))]
