"""pairs_dataset: preference pairs for DPO and ORPO, or KTO (dragon_map_pairs)."""

from ...config.kind import StageKind
from .settings import PairsDataset

KIND = StageKind(PairsDataset, "dataset", checks=PairsDataset.checks, summary="Chosen and rejected replies.")
