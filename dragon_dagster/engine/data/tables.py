"""Tables read and rows written: CSV, JSONL, JSON, Parquet or a saved `datasets` directory into a data frame (a
size limit, a named error for each way a file cannot be read), and chat rows to and from JSONL.

What a dataset stage does with the table is elsewhere: row_mapping.py renders rows into chat examples,
holdout.py holds some out, row_parts.py reads a row's turns back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import DataError

if TYPE_CHECKING:  # pandas loads when a table is read: a worker that never reads one starts without it
    import pandas as pd


FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".pq": "parquet"}


# A table is read whole into memory (and again as chat rows): a file past this fails with a named error
# instead of exhausting memory. Raise it with DRAGON_MAX_TABLE_MB on a machine that has the room.
MAX_TABLE_MB = 1024


def max_table_bytes() -> int:
    return int(float(os.environ.get("DRAGON_MAX_TABLE_MB", MAX_TABLE_MB)) * 2**20)


def read_table(source: str | Path | pd.DataFrame, format: str | None = None) -> pd.DataFrame:
    """Read CSV, JSONL, JSON, Parquet, a saved `datasets` directory, or pass a data frame through."""
    import pandas as pd

    if isinstance(source, pd.DataFrame):
        df = source.copy()
    else:
        path = Path(source)
        if not path.exists():
            raise DataError(f"dataset file not found: {path}")
        if path.is_dir():
            df = _read_datasets_dir(path)
        else:
            fmt = format or FORMATS.get(path.suffix.lower())
            if fmt is None:
                raise DataError(f"cannot tell the format of {path}: use one of {sorted(FORMATS)} or set format")
            size, limit = path.stat().st_size, max_table_bytes()
            if size > limit:
                raise DataError(
                    f"{path} is {size / 2**20:,.0f} MB, over the {limit / 2**20:,.0f} MB a table may "
                    "have: split it, sample the rows you train on, or raise DRAGON_MAX_TABLE_MB"
                )
            try:
                df = {
                    "csv": lambda: pd.read_csv(path, dtype=str, keep_default_na=False),
                    "jsonl": lambda: pd.read_json(path, lines=True, dtype=False),
                    "json": lambda: pd.read_json(path, dtype=False),
                    "parquet": lambda: pd.read_parquet(path),
                }[fmt]()
            except (ValueError, OSError, UnicodeDecodeError) as exc:
                raise DataError(f"cannot read {path} as {fmt}: {exc}") from exc
            except MemoryError as exc:  # pyarrow's ArrowMemoryError is one
                raise DataError(
                    f"not enough memory to read {path} ({size / 2**20:,.0f} MB): split it or "
                    "sample the rows you train on"
                ) from exc
    if len(df) == 0:
        raise DataError(
            f"dataset {'data frame' if isinstance(source, pd.DataFrame) else getattr(source, 'name', '') or source} "
            "is empty (no rows)"
        )
    return df.reset_index(drop=True)


def _read_datasets_dir(path: Path) -> pd.DataFrame:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as exc:
        raise DataError(f"{path} is not a saved `datasets` directory: {exc}") from exc
    if isinstance(ds, datasets.DatasetDict):
        split = "train" if "train" in ds else next(iter(ds))
        ds = ds[split]
    return ds.to_pandas()


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with Path(path).open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
