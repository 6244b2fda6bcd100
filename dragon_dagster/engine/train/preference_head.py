"""DPO, KTO and ORPO scored through the chunked head: only the reply tokens are projected onto the vocabulary.

TRL's DPO and KTO trainers patch the model with a fused LM head (trl.trainer.utils.add_fused_lm_head) and call
it as model(..., labels=..., fused_lm_head=True). On a GPU that head is a Triton kernel over the labelled
positions; elsewhere it projects every position, prompt and padding included, and recomputes the tiles in
backward. use_chunked_head puts lm_head.ChunkedLogProbs in its place: the same FusedCausalLMOutput fields,
from the labelled positions only, optionally over the real tokens only (unpadded.py). ORPO
(trl.experimental.orpo) builds the full logits instead; chunked_orpo_trainer scores it the same way.

A forward can also score Continuations: other replies to its rows' prompts (KTO's mismatched pairs), without
gradient, from the prompts' keys and values of the forward itself, so those prompts do not run again.
"""

from __future__ import annotations

import contextlib
import functools
import types
from dataclasses import dataclass

import torch

from . import lm_head, unpadded


@dataclass
class Continuations:
    """Other replies to the prompts of the rows a forward scores: row i here is row i's prompt (the same tokens at
    the same columns) followed by another reply, right-padded, as TRL's KTO collator gives its KL rows. The
    forward writes each row's summed reply log-probability into logps (no gradient), before it returns."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    logps: torch.Tensor  # (rows,): filled by the forward


def score_continuations(causal_lm, recorded: unpadded.Recorded, rows: Continuations) -> torch.Tensor:
    """Each continuation row's summed reply log-probability, from a recorded padding-free pass over its prompt.

    A reply's first token is predicted by its prompt's last hidden state, which the recorded pass has; the rest
    by the reply's own tokens, run attending to the prompt's recorded keys and values. A reply's last token is
    not run: what it predicts is not scored.
    """
    backbone, head = lm_head.backbone_and_head(causal_lm)
    reply = rows.completion_mask.bool() & rows.attention_mask.bool()
    last_prompt, first_targets, run_columns, run_rows, prefixes, bounds = [], [], [], [], [], [0]
    for row in range(reply.shape[0]):
        columns = reply[row].nonzero().flatten()
        if not len(columns):
            continue
        start = int(columns[0])
        prompt = recorded.index[row, :start][rows.attention_mask[row, :start].bool()]
        if len(prompt) == 0 or bool((prompt < 0).any()) or bool((prompt.diff() != 1).any()):
            raise ValueError(f"continuation row {row}: its prompt is not a run of the recorded pass's tokens")
        last_prompt.append(int(prompt[-1]))
        first_targets.append(int(rows.input_ids[row, start]))
        if len(columns) > 1:
            run_columns.append(columns[:-1])
            run_rows.append(row)
            prefixes.append((int(prompt[0]), int(prompt[-1]) + 1))
            bounds.append(bounds[-1] + len(columns) - 1)
    device = rows.input_ids.device
    hidden = [recorded.hidden[torch.tensor(last_prompt, dtype=torch.long, device=device)]]
    targets = [torch.tensor(first_targets, dtype=torch.long, device=device)]
    owners = [reply.any(dim=1).nonzero().flatten()]
    if run_columns:
        tokens = torch.cat([rows.input_ids[r, c] for r, c in zip(run_rows, run_columns)])
        positions = torch.cat(run_columns)
        hidden.append(unpadded.continue_pass(backbone, recorded, tokens, positions, bounds, prefixes))
        targets.append(torch.cat([rows.input_ids[r, c + 1] for r, c in zip(run_rows, run_columns)]))
        owners.append(torch.cat([torch.full_like(c, r) for r, c in zip(run_rows, run_columns)]))
    logps = lm_head.logprobs(torch.cat(hidden), head.weight, torch.cat(targets), stats=())["log_probs"]
    return torch.zeros(reply.shape[0], device=device).index_add_(0, torch.cat(owners), logps)


def use_chunked_head(causal_lm, unpad: bool = False, weighting: bool = False, paired: bool = False) -> None:
    """Replace the fused forward that TRL's add_fused_lm_head put on causal_lm (the model under the PEFT wrapper).

    paired (DPO: the batch is [chosen; rejected]): with unpad, a pair's common prompt runs once for both replies.
    A scoring call may pass continuations (with unpad): other replies to its rows' prompts, scored without
    gradient; a call without fused_lm_head (TRL's logits for compute_metrics, after the scoring one) ignores them.

    Calls without fused_lm_head (generation) and the cases it does not cover (pre-shifted labels, MoE router
    logits, positional arguments) go to TRL's forward unchanged.
    """
    trl_forward = causal_lm.forward
    stats = ("entropy", "mean_logits", "is_top1") + (("log_sum_sq_probs",) if weighting else ())

    def forward(
        self,
        *args,
        fused_lm_head=False,
        labels=None,
        shift_labels=None,
        num_items_in_batch=None,
        continuations: Continuations | None = None,
        **kwargs,
    ):
        trls = not fused_lm_head or args or shift_labels is not None or kwargs.get("output_router_logits")
        if continuations is not None and fused_lm_head and (trls or not unpad):
            raise ValueError("continuations are scored by the padding-free chunked head only (unpad, keywords)")
        if trls:
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
        with unpadded.recording() if continuations is not None else contextlib.nullcontext() as recorded:
            hidden = lm_head.scored_hidden(self, score, unpad, score if paired else None, **kwargs)
        if continuations is not None:
            with torch.no_grad():
                continuations.logps.copy_(score_continuations(self, recorded, continuations))
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
