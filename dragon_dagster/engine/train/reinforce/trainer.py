"""The reinforcement kinds' TRL subclasses: GRPOTrainer or RLOOTrainer with this project's speed paths (grouped
sampling, the chunked head). Both trainers sample, score and take log-probabilities through the same methods
(`_generate_single_turn`, `_get_per_token_logps_and_entropies`), which is where the paths go in."""

from __future__ import annotations

import functools


@functools.cache
def fast_trainer(base: type):
    """base (TRL's GRPOTrainer or RLOOTrainer) with this project's speed paths, each off until set:

    chunked: completions scored by lm_head.completion_logprobs (text-only models), over the real tokens only with
    unpad; grouped_sampling: rollout.sample (each group's prompt prefilled once, no dropout while sampling), whose
    recorded log-probabilities stand for the old policy's when a round serves several steps.
    """
    import torch

    from .. import lm_head, rollout

    class FastTrainer(base):
        chunked = unpad = grouped_sampling = drop_flat = False
        sampled = None  # (completions, tokens): the last round's sampled tokens' log-probabilities

        def _generate_single_turn(self, *args, **kwargs):
            if not self.grouped_sampling or self.use_vllm or self.use_transformers_continuous_batching:
                return super()._generate_single_turn(*args, **kwargs)
            record = []
            with rollout.sampling(self.accelerator.unwrap_model(self.model_wrapped), record):
                result = super()._generate_single_turn(*args, **kwargs)
            self.sampled = torch.stack(record, dim=1) if record else None
            return result

        def _generate_and_score_completions(self, inputs):
            """TRL's batch, with the rows of groups that all scored the same left out of the loss (drop_flat:
            DAPO's dynamic sampling, without the resampling) and the loss's token count taken without them."""
            out = super()._generate_and_score_completions(inputs)
            if not self.drop_flat or not self.model.training:
                return out
            keep = kept_groups(out["advantages"], self.num_generations)
            self._metrics["train"]["flat_groups_dropped"].append(
                0.0 if keep is None else 1 - keep.float().mean().item()
            )
            if keep is not None:
                drop = keep[:, None].to(out["completion_mask"].dtype)
                out["tool_mask"] = (
                    drop * out["tool_mask"] if "tool_mask" in out else drop.expand_as(out["completion_mask"])
                )
                loss_mask = out["completion_mask"] * out["tool_mask"]
                out["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
            return out

        def sampling_logps(self, model, input_ids, attention_mask, logits_to_keep, compute_entropy):
            """The old policy's log-probabilities as they were sampled, when this call asks for them: the first call
            without gradient after a round that serves several steps (TRL's old_per_token_logps; the reference pass
            comes after it, with the adapter off), with temperature the only change to the distribution."""
            sampled, self.sampled = self.sampled, None
            stale = self.args.gradient_accumulation_steps % (self.args.steps_per_generation * self.num_iterations)
            plain = (
                self.top_k in (None, 0)
                and self.top_p in (None, 1.0)
                and self.min_p is None
                and self.repetition_penalty == 1.0
            )
            if (
                sampled is None
                or not stale
                or not plain
                or compute_entropy
                or torch.is_grad_enabled()
                or sampled.shape[0] != input_ids.shape[0]
                or sampled.shape[1] < logits_to_keep
                or not adapter_on(self.accelerator.unwrap_model(model))
            ):
                return None
            return sampled[:, :logits_to_keep].to(input_ids.device) * attention_mask[:, -logits_to_keep:]

        def _get_per_token_logps_and_entropies(
            self,
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=None,
            compute_entropy=False,
            compute_aux_loss=False,
            **multimodal,
        ):
            old = self.sampling_logps(model, input_ids, attention_mask, logits_to_keep, compute_entropy)
            if old is not None:
                return old, None, None
            if not self.chunked or compute_aux_loss or any(v is not None for v in multimodal.values()):
                return super()._get_per_token_logps_and_entropies(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size,
                    compute_entropy,
                    compute_aux_loss,
                    **multimodal,
                )
            batch_size = batch_size or input_ids.size(0)
            logps, entropies = [], []
            for start in range(0, input_ids.size(0), batch_size):
                rows = slice(start, start + batch_size)
                with self.accelerator.autocast():  # through DDP's forward, so that its backward all-reduces
                    lp, ent = lm_head.through_wrapper(
                        model,
                        lm_head.completion_logprobs,
                        input_ids[rows],
                        attention_mask[rows],
                        logits_to_keep,
                        self.temperature,
                        None,
                        self.unpad,
                        compute_entropy,
                    )
                logps.append(lp)
                entropies.append(ent)
            return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    FastTrainer.__name__ = FastTrainer.__qualname__ = f"Fast{base.__name__}"
    return FastTrainer


def adapter_on(model) -> bool:
    """Whether model's LoRA adapters are active (TRL switches them off for the reference pass)."""
    layer = next((m for m in model.modules() if hasattr(m, "disable_adapters") and hasattr(m, "lora_A")), None)
    return layer is not None and not layer.disable_adapters


def kept_groups(advantages, group_size: int):
    """1 for each row of a group with some reward spread, 0 for the rows of a group whose advantages are all zero
    (every completion scored the same: no signal); None when the rows do not fall in whole groups (a group split
    across processes) or no group has spread (dropping them all would leave nothing, and nothing is learned
    either way)."""
    if advantages.numel() % group_size:
        return None
    flat = (advantages.view(-1, group_size) == 0).all(dim=1)
    if bool(flat.all()):
        return None
    return (~flat).repeat_interleave(group_size)
