"""A pipeline drafted from a data file and a few choices, as the studio page makes one: the columns (or `{column}`
templates) mapped into prompt, response and system, a recipe with the settings people change, checked the way a
run checks them, previewed, and written as a normal component (`defs/<name>/defs.yaml` with its data file beside
it). Nothing in it is special: the same YAML could be written by hand, and `dg check yaml` passes on it.

Every problem is a DraftError in the words the stage models and the dataset checks use (a missing column, an empty
response, a template naming an unknown column, held-out rows that repeat train), raised before anything is written.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from .. import catalog
from ..config.settings import NAME_PATTERN, Settings
from ..data import tables
from ..data.checks import leak_problem, quality_reason
from ..data.prepare import prepare
from .loading import load

COMPONENT_TYPE = "dragon_dagster.PostTrainingPipeline"  # the component a defs.yaml declares (assets/component.py)
MAX_BYTES = 50 * 1024 * 1024  # the largest data file the studio takes in
FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".json": "json", ".parquet": "parquet"}
PREVIEW_ROWS = 5


class DraftError(ValueError):
    """A draft that cannot be written, with what is wrong and where."""


RECIPES = Path(__file__).parent / "recipes"  # one YAML file of stages per recipe, named by it


class Recipe(Settings):
    """The stages a draft trains and the settings people change; the rest are each kind's defaults."""

    stages: Literal["supervised"] = Field(
        "supervised", description="A recipe of recipes/: supervised is SFT on the mapped rows, merged and evaluated."
    )
    max_steps: int = Field(60, ge=1, le=100_000, description="Optimizer steps of the SFT stage.")
    learning_rate: float = Field(2.0e-4, gt=0, lt=1, description="Its learning rate.")
    lora_rank: int = Field(16, ge=1, le=1024, description="The LoRA rank (alpha is twice it).")
    eval_frac: float = Field(0.1, ge=0, lt=1, description="Share of rows held out for the report.")


@dataclass
class Draft:
    name: str
    attributes: dict[str, Any]  # the pipeline's YAML, as data
    data_file: Path
    figures: dict[str, Any]  # train and held-out rows, the leak, the quality
    preview: list[dict] = field(default_factory=list)  # the first training rows: prompt, response, system

    @property
    def yaml(self) -> str:
        """The component's defs.yaml."""
        body = yaml.safe_dump(self.attributes, sort_keys=False, allow_unicode=True, width=100)
        return f"type: {COMPONENT_TYPE}\nattributes:\n" + "".join(f"  {line}\n" for line in body.splitlines())

    def command(self) -> str:
        """What runs it from a terminal, in the project."""
        return f'dg launch --job {self.name}_pipeline    # or: dragon demo --pipeline {self.name} --profile ""'


def data_format(path: Path) -> str:
    found = FORMATS.get(path.suffix.lower())
    if found is None:
        raise DraftError(f"{path.name}: a data file is CSV, JSONL, JSON or Parquet (.csv, .jsonl, .json, .parquet)")
    return found


def read_data(path: str | Path):
    """The table in a data file, refused over MAX_BYTES."""
    path = Path(path)
    size = path.stat().st_size if path.exists() else 0
    if size > MAX_BYTES:
        raise DraftError(f"{path.name} is {size / 1e6:.1f} MB: the studio takes files up to {MAX_BYTES / 1e6:.0f} MB")
    try:
        return tables.read_table(path, data_format(path))
    except tables.DataError as exc:
        raise DraftError(f"{path.name}: {exc}") from None


def _first_error(exc: ValidationError, kind: str) -> str:
    """The first problem pydantic found, named by its field (the union's tag, the kind, left out)."""
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()) if p != kind)
    message = str(error.get("msg", exc)).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def draft(
    name: str,
    model: str,
    data_file: str | Path,
    prompt: str,
    response: str,
    system: str | None = None,
    recipe: Recipe | None = None,
) -> Draft:
    """A checked draft of pipeline `name`: `prompt`, `response` and `system` are columns or `{column}` templates of
    the data file; the rows are mapped, split and measured as the dataset asset will."""
    recipe = recipe or Recipe()
    if not re.fullmatch(NAME_PATTERN, name or ""):
        raise DraftError(f"name {name!r}: lower-case letters, digits and _, starting with a letter")
    data_file = Path(data_file)
    df = read_data(data_file)
    stages = yaml.safe_load((RECIPES / f"{recipe.stages}.yaml").read_text())["stages"]
    role = {stage["name"]: catalog.get(stage["kind"]).role for stage in stages}
    # the recipe's first dataset stage reads the file through the mapping; its training stages take the settings
    dataset = next(stage for stage in stages if role[stage["name"]] == "dataset")
    dataset.update(
        prompt=prompt, response=response, eval_frac=recipe.eval_frac, **({"system": system} if system else {})
    )
    for stage in stages:
        if role[stage["name"]] == "training":
            stage["lora"] = {"r": recipe.lora_rank, "alpha": 2 * recipe.lora_rank}
            # a loss point every twentieth of the run (at least every step): a curve on the page, not a dot
            stage["args"] = {
                "max_steps": recipe.max_steps,
                "learning_rate": recipe.learning_rate,
                "logging_steps": max(1, recipe.max_steps // 20),
            }
    try:
        settings = catalog.parse_stage(dataset)
        prepared = prepare(settings, df)
    except ValidationError as exc:
        raise DraftError(_first_error(exc, dataset["kind"])) from None
    except tables.DataError as exc:
        raise DraftError(str(exc)) from None
    figures = {
        "rows": prepared.quality["rows"],
        "train_rows": len(prepared.train),
        "eval_rows": len(prepared.held),
        "duplicates_dropped": prepared.duplicates,
        **prepared.leakage,
        **{k: v for k, v in prepared.quality.items() if k != "rows"},
    }
    q = prepared.quality
    if q["rows"] == 0 or q["empty_prompts"] or q["empty_replies"]:
        raise DraftError(f"response {response!r} / prompt {prompt!r}: {quality_reason(q)}")
    leak = leak_problem(prepared.leakage["prompt_overlap"], prepared.leakage["answer_overlap"])
    if leak:
        raise DraftError(leak)
    attributes = {"name": name, "model": model, "datasets": {"data": {"path": data_file.name}}, "stages": stages}
    preview = [
        {
            "system": next((m["content"] for m in r["prompt"] if m["role"] == "system"), ""),
            "prompt": tables.user_text(r),
            "response": r["completion"][-1]["content"],
        }
        for r in prepared.train[:PREVIEW_ROWS]
    ]
    out = Draft(name, attributes, data_file, figures, preview)
    _validate(out)
    return out


def _validate(out: Draft) -> None:
    """Load the draft as a run would (the pipeline model, every stage's own), from a scratch folder."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / out.name
        folder.mkdir()
        (folder / "defs.yaml").write_text(yaml.safe_dump(out.attributes, sort_keys=False))
        os.symlink(out.data_file.resolve(), folder / out.data_file.name)
        try:
            load(folder / "defs.yaml")
        except ValueError as exc:
            raise DraftError(str(exc)) from None


def write(out: Draft, defs_dir: str | Path) -> Path:
    """defs/<name>/defs.yaml with the data file beside it, written whole or not at all; never over an existing
    pipeline folder. Returns the defs.yaml's path."""
    target = Path(defs_dir) / out.name
    if target.exists():
        raise DraftError(f"{target} exists already: choose another name, or edit that pipeline's defs.yaml")
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=defs_dir))
    try:
        shutil.copyfile(out.data_file, staging / out.data_file.name)
        (staging / "defs.yaml").write_text(out.yaml)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target / "defs.yaml"
