"""chat_dataset: prompt and reply pairs for SFT (dragon_map)."""

from ...config.kind import StageKind
from .settings import ChatDataset

KIND = StageKind(ChatDataset, "dataset", checks=ChatDataset.checks, summary="Prompt and reply rows for SFT.")
