"""The suite's dataset loader (`custom_dataset: !function rows.load` in each task file): the task's JSONL files
beside this one as a DatasetDict, read from disk. A path in `dataset_kwargs.data_files` would be resolved against
the working directory, not the task file, and `datasets`' json builder would also write a cache; this does
neither."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent


def load(skill: str, **_metadata):
    """{"train": the few-shot examples, "test": the scored items} of one skill (lm-eval also passes the task's
    metadata, unused here)."""
    from datasets import Dataset, DatasetDict

    splits = {}
    for split in ("train", "test"):
        path = HERE / f"{skill}.{split}.jsonl"
        splits[split] = Dataset.from_list([json.loads(line) for line in path.read_text().splitlines() if line])
    return DatasetDict(splits)
