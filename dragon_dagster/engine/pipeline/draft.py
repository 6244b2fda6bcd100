"""A pipeline drafted from a data file and a few choices, as the studio page makes one: the columns (or `{column}`
templates) mapped into prompt, response and system, a recipe with the settings people change, checked the way a
run checks them, previewed, and written as a normal component (`defs/<name>/defs.yaml` with its data file beside
it). Nothing in it is special: the same YAML could be written by hand, and `dg check yaml` passes on it.

Every problem is a DraftError in the words the stage models and the dataset checks use (a missing column, an empty
response, a template naming an unknown column, held-out rows that repeat train), raised before anything is written.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from .. import catalog, models
from ..config.settings import NAME_PATTERN, Settings
from ..data import errors, row_parts, tables
from ..data.checks import blocking_overlap, leak_problem, quality_reason
from ..data.prepare import prepare
from ..rewards import REWARD_TYPES
from .loading import load

COMPONENT_TYPE = "dragon_dagster.PostTrainingPipeline"  # the component a defs.yaml declares (assets/component.py)
MAX_BYTES = 50 * 1024 * 1024  # the largest data file the studio takes in
FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".json": "json", ".parquet": "parquet"}
PREVIEW_ROWS = 5
DATA = "data"  # the name of the data file under the pipeline's datasets


class DraftError(ValueError):
    """A draft that cannot be written, with what is wrong and where."""


class LeakError(DraftError):
    """Held-out rows that repeat train: the split's figures come along, so the page can show them beside it."""

    def __init__(self, message: str, figures: dict[str, Any]):
        super().__init__(message)
        self.figures = figures


# The leak check's fix in the page's words: its fields, not the YAML keys they write
PAGE_LEAK_FIX = (
    "Pick a 'Group by' column that keeps related rows (say, paraphrases of one question) on one side of the "
    "split, or tick 'Allow leakage'."
)


RECIPES = Path(__file__).parent / "recipes"  # one YAML file of stages per recipe, named by it
# In a recipe's stages, a value "$slot" takes the mapping's or the settings' value of that slot, and a slot left
# empty drops its key (the kind's default applies): so the recipes, not this module, know the kinds they use.
SLOT = re.compile(r"\$([a-z_]+)")


def recipes() -> dict[str, str]:
    """Each recipe's name and what it makes (its file's `description`)."""
    return {p.stem: yaml.safe_load(p.read_text())["description"] for p in sorted(RECIPES.glob("*.yaml"))}


RecipeName = Literal["supervised", "sft_dpo", "sft_dpo_pairs", "sft_grpo", "support_chain"]


class Recipe(Settings):
    """The stages a draft trains and the settings people change; the rest are each kind's defaults."""

    stages: RecipeName = Field("supervised", description="A recipe of recipes/ (each file's description says what).")
    max_steps: int = Field(60, ge=1, le=100_000, description="Optimizer steps of the SFT stage.")
    learning_rate: float = Field(2.0e-4, gt=0, lt=1, description="Its learning rate.")
    lora_rank: int = Field(16, ge=1, le=1024, description="The LoRA rank (alpha is twice it).")
    eval_frac: float = Field(0.1, ge=0, lt=1, description="Share of rows held out for the report.")
    tune_steps: int = Field(
        10, ge=1, le=100_000, description="Optimizer steps of the stage after SFT (DPO or GRPO), where it has one."
    )
    beta: float | None = Field(
        None, gt=0, description="DPO's or GRPO's beta (how far from the SFT model it may move); empty: its default."
    )
    rewards: list[str] = Field(
        default_factory=lambda: ["contains"],
        description="GRPO's rewards, by type (each with its defaults, weight 1): compared with the response column "
        "as the reference, or shaping the reply.",
    )


@dataclass
class Mapping:
    """Where the rows come from in the file: columns or `{column}` templates, or a conversation layout."""

    prompt: str | None = None
    response: str | None = None  # the reply; the chosen one for pairs, the reference for GRPO prompts
    system: str | None = None
    rejected: str | None = None  # the worse reply, for a pairs file
    layout: str = "auto"  # columns, messages, sharegpt, alpaca, or detected (as chat_dataset does)
    conversations: str | None = None  # the column of whole conversations (messages, sharegpt)
    group_by: str | None = None  # the column (or template) whose rows stay on one side of the held-out split
    allow_leakage: bool = False  # held-out rows may repeat train (the leak check then only warns)

    def __post_init__(self):
        for name in ("prompt", "response", "system", "rejected", "conversations", "group_by"):
            setattr(self, name, (getattr(self, name) or "").strip() or None)
        self.layout = self.layout or "auto"


def plain_rewards() -> list[str]:
    """The reward types that need no option of their own (the ones a recipe can take by name)."""
    plain = []
    for name, model in REWARD_TYPES.items():
        try:
            model.model_validate({"type": name})
        except ValidationError:
            continue
        plain.append(name)
    return plain


def fill(value: Any, slots: dict[str, Any]) -> Any:
    """A recipe's stages with their "$slot" values filled in and the empty ones dropped."""
    if isinstance(value, dict):
        filled = {k: fill(v, slots) for k, v in value.items()}
        return {k: v for k, v in filled.items() if v is not None}
    if isinstance(value, list):
        return [fill(v, slots) for v in value]
    if isinstance(value, str) and (m := SLOT.fullmatch(value)):
        if m.group(1) not in slots:
            raise KeyError(f"recipe slot {value!r} is not one the studio fills: {', '.join(sorted(slots))}")
        return slots[m.group(1)]
    return value


def recipe_slots(mapping: Mapping, recipe: Recipe) -> dict[str, Any]:
    return {
        **{
            k: getattr(mapping, k)
            for k in ("prompt", "response", "system", "rejected", "layout", "conversations", "group_by")
        },
        "allow_leakage": True if mapping.allow_leakage else None,  # false is the default: no key written
        "eval_frac": recipe.eval_frac,
        "lora": {"r": recipe.lora_rank, "alpha": 2 * recipe.lora_rank},
        # a loss point every twentieth of the run (at least every step): a curve on the page, not a dot
        "sft_steps": recipe.max_steps,
        "learning_rate": recipe.learning_rate,
        "sft_logging": max(1, recipe.max_steps // 20),
        "tune_steps": recipe.tune_steps,
        "tune_logging": max(1, recipe.tune_steps // 20),
        "beta": recipe.beta,
        "rewards": [{"type": t} for t in recipe.rewards] or None,
    }


@dataclass
class Draft:
    name: str
    attributes: dict[str, Any]  # the pipeline's YAML, as data
    data_file: Path
    figures: dict[str, Any]  # train and held-out rows, the leak, the quality
    preview: list[dict] = field(default_factory=list)  # the first training rows: prompt, response, system
    prompts: list[list[dict]] = field(default_factory=list)  # those rows' prompt turns and replies, as messages
    replies: list[list[dict]] = field(default_factory=list)
    system: str | None = None  # the system prompt chat and feedback send with its model (Pipeline.system_prompt)
    system_varies: bool = False  # `system` is a column or template whose value differs between rows

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
    except errors.DataError as exc:  # in the file's own name: where it was uploaded to says nothing to the user
        raise DraftError(f"{path.name}: {str(exc).replace(str(path), path.name)}") from None


def _first_error(exc: ValidationError, kind: str) -> str:
    """The first problem pydantic found, named by its field (the union's tag, the kind, left out)."""
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()) if p != kind)
    message = str(error.get("msg", exc)).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def draft(
    name: str, model: str, data_file: str | Path, mapping: Mapping | None = None, recipe: Recipe | None = None
) -> Draft:
    """A checked draft of pipeline `name`: the recipe's stages filled with the mapping and the settings; every
    dataset stage that reads the file maps, splits and measures its rows as the dataset asset will."""
    mapping, recipe = mapping or Mapping(), recipe or Recipe()
    if not re.fullmatch(NAME_PATTERN, name or ""):
        raise DraftError(f"name {name!r}: lower-case letters, digits and _, starting with a letter")
    data_file = Path(data_file)
    df = read_data(data_file)
    stages = yaml.safe_load((RECIPES / f"{recipe.stages}.yaml").read_text())["stages"]
    stages = fill(stages, recipe_slots(mapping, recipe))
    role = {stage["name"]: catalog.get(stage["kind"]).role for stage in stages}
    readers = [s for s in stages if role[s["name"]] == "dataset" and s.get("source") == DATA]
    checked = [_check(stage, df) for stage in readers]  # every reader of the file, each as its asset will map it
    settings, prepared = checked[0]  # the first is the one trained on first: its rows are previewed
    figures = _figures(prepared)
    attributes = {"name": name, "model": model, "datasets": {DATA: {"path": data_file.name}}, "stages": stages}
    preview = [
        {
            "system": next((m["content"] for m in r["prompt"] if m["role"] == "system"), ""),
            "prompt": row_parts.user_text(r),
            "response": (r.get("completion") or r.get("chosen") or [{"content": r.get("reference") or ""}])[-1][
                "content"
            ],
            **({"rejected": r["rejected"][-1]["content"]} if r.get("rejected") else {}),
        }
        for r in prepared.train[:PREVIEW_ROWS]
    ]
    shown = prepared.train[:PREVIEW_ROWS]
    replies = [r.get("completion") or r.get("chosen") or [] for r in shown]  # a bare prompt row has none
    out = Draft(name, attributes, data_file, figures, preview, [r["prompt"] for r in shown], replies)
    _validate(out)
    return out


def _figures(prepared) -> dict[str, Any]:
    """Train and held-out rows, the leak, the quality of a prepared dataset."""
    return {
        "rows": prepared.quality["rows"],
        "train_rows": len(prepared.train),
        "eval_rows": len(prepared.held),
        "duplicates_dropped": prepared.duplicates,
        **prepared.leakage,
        **{k: v for k, v in prepared.quality.items() if k != "rows"},
    }


def _check(stage: dict, df):
    """A dataset stage's settings and prepared rows, or the first problem in the words of its model and checks."""
    try:
        settings = catalog.parse_stage(stage)
        prepared = prepare(settings, df)
    except ValidationError as exc:
        raise DraftError(_first_error(exc, stage["kind"])) from None
    except errors.DataError as exc:
        raise DraftError(str(exc)) from None
    q = prepared.quality
    if q["rows"] == 0 or q["empty_prompts"] or q["empty_replies"]:
        raise DraftError(f"{stage['name']}: {quality_reason(q)}")
    leak = leak_problem(*blocking_overlap(prepared.leakage), answers_count=settings.answers_are_text, fix=PAGE_LEAK_FIX)
    if leak and not settings.allow_leakage:
        raise LeakError(f"{stage['name']}: {leak}", _figures(prepared))
    return settings, prepared


def render(model: str, draft_: Draft) -> list[str]:
    """The previewed rows as the model will see them: through its chat template (the model's tokenizer, cached)."""
    tokenizer = _tokenizer(model)
    return [
        tokenizer.apply_chat_template(prompt + reply, tokenize=False, add_generation_prompt=not reply)
        for prompt, reply in zip(draft_.prompts, draft_.replies, strict=True)
    ]


@functools.lru_cache(maxsize=4)
def _tokenizer(model: str):
    try:
        return models.load_tokenizer(models.check_loadable(model))
    except (OSError, ValueError) as exc:
        raise DraftError(f"model {model!r}: {exc}") from None


def _validate(out: Draft) -> None:
    """Load the draft as a run would (the pipeline model, every stage's own), from a scratch folder."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / out.name
        folder.mkdir()
        (folder / "defs.yaml").write_text(yaml.safe_dump(out.attributes, sort_keys=False))
        os.symlink(out.data_file.resolve(), folder / out.data_file.name)
        try:
            pipeline = load(folder / "defs.yaml")
        except ValueError as exc:  # where the scratch copy was says nothing to the user
            raise DraftError(str(exc).replace(f"{folder / 'defs.yaml'}: ", "").replace(str(folder), ".")) from None
        # what chat and feedback will send with its model: the dataset's one system prompt, never a column's name
        out.system = pipeline.system_prompt()
        dataset = pipeline.system_dataset()
        out.system_varies = out.system is None and dataset is not None and dataset.per_row_system(pipeline)


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
