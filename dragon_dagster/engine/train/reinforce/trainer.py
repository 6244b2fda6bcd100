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
        chunked = unpad = grouped_sampling = False
        sampled = None  # (completions, tokens): the last round's sampled tokens' log-probabilities

        def _generate_single_turn(self, *args, **kwargs):
            if not self.grouped_sampling or self.use_vllm or self.use_transformers_continuous_batching:
                return super()._generate_single_turn(*args, **kwargs)
            record = []
            with rollout.sampling(self.accelerator.unwrap_model(self.model_wrapped), record):
                result = super()._generate_single_turn(*args, **kwargs)
            self.sampled = torch.stack(record, dim=1) if record else None
            return result

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
