"""The sft kind's TRL subclasses: SFTTrainer whose token count survives a resume, and the one whose training loss
comes from the chunked head (train/lm_head.py)."""

from __future__ import annotations

import functools


@functools.cache
def resumable_trainer():
    """The class, built on first use so that importing this module does not import TRL or torch."""
    from trl import SFTTrainer

    class ResumableSFTTrainer(SFTTrainer):
        """SFTTrainer whose cumulative num_tokens continues after a resume from a checkpoint.

        TRL keeps the count in an attribute that starts at 0 in every process, so a resumed run logged it from 0
        again. Here the attribute is the trainer state's num_input_tokens_seen, as GRPOTrainer counts it: the
        checkpoint's trainer_state.json carries it and Trainer.train restores it. Trainer itself adds to that
        field only with include_num_input_tokens_seen, which this project leaves off ("no").
        """

        @property
        def _total_train_tokens(self) -> int:
            return self.state.num_input_tokens_seen

        @_total_train_tokens.setter
        def _total_train_tokens(self, value: int) -> None:
            self.state.num_input_tokens_seen = value

    return ResumableSFTTrainer


@functools.cache
def chunked_loss_trainer():
    """The class, built on first use so that importing this module does not import TRL or torch."""
    from ...train import lm_head

    class ChunkedLossSFTTrainer(resumable_trainer()):
        """SFTTrainer whose training loss comes from lm_head: the same loss, a fraction of the head's cost.

        It logs what TRL logs (num_tokens, mean_token_accuracy) except entropy, which would cost another pass
        over the vocabulary. With unpad the backbone runs over the real tokens only.
        """

        unpad = False

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            plain_nll = (
                self.args.loss_type == "nll"
                and self.compute_loss_func is None
                and self.label_smoother is None
                and not self.aux_loss_enabled
            )
            if return_outputs or not model.training or not plain_nll:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            labels = inputs["labels"]
            # through the DDP wrapper's forward when there is one: that is what makes its backward all-reduce
            loss, counts = lm_head.through_wrapper(
                model, lm_head.causal_lm_loss, inputs, labels, num_items_in_batch, self.unpad
            )
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes
            seen = inputs["attention_mask"].sum() if "attention_mask" in inputs else inputs["position_ids"].size(1)
            correct, tokens, seen = self.count_all_ranks(
                counts["correct"], counts["tokens"], int(seen), device=loss.device
            )
            self._metrics["train"]["mean_token_accuracy"].append(correct / max(tokens, 1))
            self._total_train_tokens += seen
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
            return loss

        def count_all_ranks(self, *counts: int, device) -> list[int]:
            """The counts summed over the data-parallel ranks, as TRL's figures are (one small all-reduce)."""
            if self.accelerator.num_processes == 1:
                return list(counts)
            import torch

            return [int(v) for v in self.accelerator.reduce(torch.tensor(counts, device=device), "sum").tolist()]

    return ChunkedLossSFTTrainer
