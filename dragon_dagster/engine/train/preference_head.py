"""DPO, KTO and ORPO scored through the chunked head: only the reply tokens are projected onto the vocabulary.

TRL's DPO and KTO trainers patch the model with a fused LM head (trl.trainer.utils.add_fused_lm_head) and call
it as model(..., labels=..., fused_lm_head=True). On a GPU that head is a Triton kernel over the labelled
positions; elsewhere it projects every position, prompt and padding included, and recomputes the tiles in
backward. use_chunked_head puts lm_head.ChunkedLogProbs in its place: the same FusedCausalLMOutput fields,
from the labelled positions only, optionally over the real tokens only (unpadded.py). ORPO
(trl.experimental.orpo) builds the full logits instead; chunked_orpo_trainer scores it the same way.
"""

from __future__ import annotations

import functools
import types

import torch

from . import lm_head


def use_chunked_head(causal_lm, unpad: bool = False, weighting: bool = False, paired: bool = False) -> None:
    """Replace the fused forward that TRL's add_fused_lm_head put on causal_lm (the model under the PEFT wrapper).

    paired (DPO: the batch is [chosen; rejected]): with unpad, a pair's common prompt runs once for both replies.

    Calls without fused_lm_head (generation) and the cases it does not cover (pre-shifted labels, MoE router
    logits, positional arguments) go to TRL's forward unchanged.
    """
    trl_forward = causal_lm.forward
    stats = ("entropy", "mean_logits", "is_top1") + (("log_sum_sq_probs",) if weighting else ())

    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        if not fused_lm_head or args or shift_labels is not None or kwargs.get("output_router_logits"):
            return trl_forward(
                *args,
                fused_lm_head=fused_lm_head,
                labels=labels,
                shift_labels=shift_labels,
                num_items_in_batch=num_items_in_batch,
                **kwargs,
            )
        from trl.trainer.utils import FusedCausalLMOutput

        kwargs.pop("use_cache", None)
        targets = labels[:, 1:]
        score = targets != -100
        hidden = lm_head.scored_hidden(self, score, unpad, score if paired else None, **kwargs)
        out = lm_head.logprobs(hidden, self.get_output_embeddings().weight, targets[score], stats=stats)
        per_token = {name: value.new_zeros(score.shape).masked_scatter(score, value) for name, value in out.items()}
        count = score.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        return FusedCausalLMOutput(loss=-per_token["log_probs"].sum() / count, label_mask=score, **per_token)

    causal_lm.forward = types.MethodType(forward, causal_lm)


@functools.cache
def chunked_orpo_trainer():
    """ORPOTrainer whose concatenated_forward scores with the chunked head (built on first use)."""
    from trl.experimental.orpo import ORPOTrainer

    class ChunkedORPOTrainer(ORPOTrainer):
        unpad = False

        def concatenated_forward(self, model, batch):
            if self.is_encoder_decoder or self.aux_loss_enabled:
                return super().concatenated_forward(model, batch)
            inputs = self.concatenated_inputs(
                batch, is_encoder_decoder=False, padding_value=self.padding_value, device=self.accelerator.device
            )
            # through DDP's forward when there is one, so that its backward all-reduces
            return lm_head.through_wrapper(model, orpo_forward, inputs, batch["chosen_labels"].shape[0], self.unpad)

    return ChunkedORPOTrainer


def orpo_forward(model, batch: dict, n_chosen: int, unpad: bool):
    """What ORPOTrainer.concatenated_forward returns, from the chunked head: the mean log-probability of each
    reply, the chosen rows' NLL over all their real tokens (ORPO's SFT term: prompt included, as TRL has it), and
    in place of the logits the mean logit of each scored position (TRL's logits/* metrics take their mean)."""
    ids, mask = batch["concatenated_input_ids"], batch["concatenated_attention_mask"]
    reply = batch["concatenated_labels"][:, 1:] != -100
    nll = torch.zeros_like(reply)
    nll[:n_chosen] = mask[:n_chosen, 1:] != 0
    score = reply | nll
    hidden = lm_head.scored_hidden(model, score, unpad, reply, input_ids=ids, attention_mask=mask)
    _, head = lm_head.backbone_and_head(model)
    out = lm_head.logprobs(hidden, head.weight, ids[:, 1:][score], stats=("mean_logits",))
    per_token = out["log_probs"].new_zeros(score.shape).masked_scatter(score, out["log_probs"])
    mean_logps = (per_token * reply).sum(-1) / reply.sum(-1)
    chosen_nll = -(per_token * nll).sum() / nll.sum().clamp(min=1)
    mean_logits = out["mean_logits"]
    in_chosen = torch.arange(score.shape[0], device=score.device)[:, None].expand_as(score)[score] < n_chosen
    return (mean_logps[:n_chosen], mean_logps[n_chosen:], mean_logits[in_chosen], mean_logits[~in_chosen], chosen_nll)
