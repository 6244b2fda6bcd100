"""The sft kind's settings: supervised fine-tuning on chat rows."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ...config.stage import METRICS_DOC, MetricNames
from ...train.stage import TrainerStage


class SFT(TrainerStage):
    """Supervised fine-tuning with TRL's SFTTrainer; loss on the final assistant turn, or on every one."""

    kind: Literal["sft"]
    metrics: MetricNames = Field(None, description=METRICS_DOC)
    train_on: Literal["final_turn", "all_assistant_turns"] = Field(
        "final_turn",
        description="Which assistant turns the loss is on. final_turn (the default, as dragonfarm's "
        "dragon_conversations): the last assistant turn is what the model learns; earlier turns are context, "
        "often written by an older system the model should not imitate. all_assistant_turns: every assistant "
        "turn, for tool-use traces, where the tool calls are turns before the final answer (TRL's "
        "assistant_only_loss; needs a chat template with generation marks, which ChatML models get).",
    )
    neftune_noise_alpha: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="NEFTune: uniform noise of this scale (divided by the square root of sequence length times "
        "hidden size) added to the input embeddings while training, never at inference (transformers' "
        "neftune_noise_alpha). The paper used 5 to 15; None: off.",
    )
    start: Literal["chain", "base"] = Field(
        "chain",
        description="chain: continue from the training stage before it (earlier adapters folded in); base: a "
        "fresh adapter on the pipeline's model, beside the chain (an adapter a merge_adapters stage combines "
        "with others trained on the same model).",
    )

    def continues_chain(self) -> bool:
        return self.start == "chain"
