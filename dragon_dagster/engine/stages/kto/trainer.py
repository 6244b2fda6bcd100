"""The kto kind's TRL subclass: KTOTrainer whose passes run each prompt as few times as its objective needs.

TRL's KTO step runs four passes over the batch's prompts: the policy over the mismatched pairs (each prompt with
another row's reply, for the KL term; no gradient), the policy over the rated replies, and the reference (the
adapter off) over both. With the padding-free chunked head (train/unpadded.py, train/preference_head.py) this
trainer runs three, and each prompt in two of them:

- the reference runs once over the rated and the mismatched rows together, each prompt laid down once for both
  of its replies (and once for all rows that share it);
- the policy's mismatched replies continue from the keys and values its rated pass computed for their prompts
  (preference_head.Continuations), so only the replies run again.

The values are TRL's: the reference's log-probabilities reach TRL's loss as precomputed ones would, and the KL
term's are those of the same model on the same tokens (tests compare both with TRL's own passes, and whole runs).
Batches it does not cover (a reference model beside the policy, precomputed log-probabilities, images, one row,
rows whose mismatched prompt differs from the rated one's) take TRL's passes.
"""

from __future__ import annotations

import functools

TEXT_KEYS = {
    "input_ids",
    "attention_mask",
    "completion_mask",
    "KL_input_ids",
    "KL_attention_mask",
    "KL_completion_mask",
    "label",
}


@functools.cache
def shared_prompt_trainer():
    """The class, built on first use so that importing this module does not import TRL or torch."""
    import torch
    from trl import KTOTrainer
    from trl.trainer.utils import use_adapter

    from ...train import lm_head
    from ...train.preference_head import Continuations

    class SharedPromptKTOTrainer(KTOTrainer):
        shares_prompts = False  # set with the chunked head when the run is padding-free

        def _compute_loss(self, model, inputs, return_outputs):
            if not self._covers(inputs):
                return super()._compute_loss(model, inputs, return_outputs)
            batch = dict(inputs)
            batch["ref_logps"], batch["ref_KL_logps"] = self._reference_logps(batch)
            rows = batch["KL_input_ids"].shape[0]
            batch["continuations"] = Continuations(
                batch["KL_input_ids"],
                batch["KL_attention_mask"],
                batch["KL_completion_mask"],
                torch.zeros(rows, device=batch["KL_input_ids"].device),
            )
            # TRL's loss reads the reference from the batch when it was precomputed, as it now is for this batch
            self.precompute_ref_logps = True
            try:
                return super()._compute_loss(model, batch, return_outputs)
            finally:
                self.precompute_ref_logps = False

        def _compute_kl_logps(self, model, batch):
            if "continuations" in batch:
                # TRL asks for these before the policy's rated pass and reads them only after it: that pass
                # writes them (preference_head.use_chunked_head's forward) from the prompts it runs
                return batch["continuations"].logps
            return super()._compute_kl_logps(model, batch)

        def _covers(self, inputs) -> bool:
            if not (self.shares_prompts and self.calculate_KL) or self.precompute_ref_logps or self.aux_loss_enabled:
                return False
            if self.ref_model is not None or not set(inputs) <= TEXT_KEYS or inputs["input_ids"].shape[0] < 2:
                return False
            return same_prompts(inputs)

        def _reference_logps(self, batch):
            """Each rated and each mismatched reply's summed log-probability under the reference, in one pass."""
            n = batch["input_ids"].shape[0]
            names = ("input_ids", "attention_mask", "completion_mask")
            ids, mask, replies = (stack_rows(batch[name], batch[f"KL_{name}"]) for name in names)
            score = replies[:, 1:].bool() & mask[:, 1:].bool()
            policy = self.accelerator.unwrap_model(self.model)
            with torch.no_grad(), use_adapter(policy, adapter_name="ref" if "ref" in policy.peft_config else None):
                hidden = lm_head.scored_hidden(policy, score, True, score, input_ids=ids, attention_mask=mask)
                _, head = lm_head.backbone_and_head(policy)
                logps = lm_head.logprobs(hidden, head.weight, ids[:, 1:][score], stats=())["log_probs"]
            rows = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(score)[score]
            sums = torch.zeros(ids.shape[0], device=ids.device).index_add_(0, rows, logps)
            return sums[:n], sums[n:]

    return SharedPromptKTOTrainer


def stack_rows(a, b):
    """Two right-padded batches as one, padded to the wider (with zeros: masked out)."""
    import torch

    width = max(a.shape[1], b.shape[1])
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in (a, b)])


def same_prompts(inputs) -> bool:
    """Whether each mismatched row starts with its rated row's prompt: the same real tokens at the same columns."""
    for row in range(inputs["input_ids"].shape[0]):
        rated, mismatched = inputs["completion_mask"][row], inputs["KL_completion_mask"][row]
        if not bool(rated.any()) or not bool(mismatched.any()):
            return False
        start = int(rated.int().argmax())
        if start == 0 or start != int(mismatched.int().argmax()):
            return False
        real = inputs["attention_mask"][row, :start].all() & inputs["KL_attention_mask"][row, :start].all()
        if not bool(real):
            return False
        if not bool((inputs["input_ids"][row, :start] == inputs["KL_input_ids"][row, :start]).all()):
            return False
    return True
