"""rated_dataset: replies rated liked or disliked, without a pair, for KTO."""

from ...config.kind import StageKind
from .settings import RatedDataset

KIND = StageKind(RatedDataset, "dataset", checks=RatedDataset.checks, summary="Liked or disliked replies.")
