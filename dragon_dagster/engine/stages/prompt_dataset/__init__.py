"""prompt_dataset: prompts (and checkable answers) for GRPO (dragon_map_prompts)."""

from ...config.kind import StageKind
from .settings import PromptDataset

KIND = StageKind(PromptDataset, "dataset", checks=PromptDataset.checks, summary="Prompts to practise on.")
