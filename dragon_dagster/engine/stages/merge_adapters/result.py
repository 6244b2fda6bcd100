"""What a merge_adapters stage reports: how its adapters were combined and the combined adapter's shape."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ...config.results import TrainingResult


class MergeAdaptersResult(TrainingResult):
    """A training result with no training (no steps, no losses), so every reader of the chain (the merge's model
    card, the report's stage table, the registry) takes the combined adapter as any other."""

    objective: str = "merge_adapters"
    loss_label: str = "no training: adapters combined"
    inputs: list[str] = Field(description="The combined adapters, as the settings name them.")
    combination: str = Field(description="PEFT's combination_type.")
    weights: list[float] = Field(description="Each input's weight, in order.")
    density: float | None = None
    rank: int = Field(description="The combined adapter's rank (lora r).")
    input_ranks: list[int] = Field(default_factory=list, description="Each input's rank, in order.")
    trainable_parameters: int = Field(0, description="The combined adapter's parameters.")

    def metadata(self) -> dict[str, Any]:
        return {
            "combined": ", ".join(f"{name} x{w:g}" for name, w in zip(self.inputs, self.weights)),
            "combination": self.combination,
            **({"density": self.density} if self.density is not None else {}),
            "rank": self.rank,
            "adapter_parameters": self.trainable_parameters,
        }
