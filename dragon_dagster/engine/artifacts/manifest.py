"""manifest.json: what made an artifact (its kind, settings, inputs, Dagster and MLflow runs, the result), one
typed model per artifact kind. Written by the Dagster layer when an artifact is published, read back through the
same models by everything downstream, so a missing, corrupt or foreign manifest is a named error (ManifestError),
never a KeyError three stages later.

A reader that needs any artifact (the runs listing, pruning) reads `Manifest`, which keeps every field; a reader
that needs one kind reads its model (`read_manifest(path, AdapterManifest)`), which checks the kind too.

A manifest's `settings` are the stage's settings model: the Dagster layer writes the stage itself, and a manifest
read back holds them as `RecordedSettings` (its name and kind typed, every other field as written), since the
kinds are known a layer above this one; `catalog.recorded_stage(manifest.settings)` reads them with the kind's
own model. A manifest written before (settings as a plain mapping, even a partial one) reads the same way.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SerializeAsAny, ValidationError

from ..config.results import HeldOutRows, StageResult, TrainingSummary
from ..config.stage import Stage

MANIFEST = "manifest.json"


class ManifestError(ValueError):
    """An artifact's manifest is missing, unreadable, of another kind than expected, or malformed."""


class RecordedSettings(BaseModel):
    """A stage's settings as a manifest holds them, read without its kind's model: every field kept as written
    (model_extra, written back the same), so that any manifest reads, whichever kinds this process knows."""

    model_config = ConfigDict(extra="allow")

    @property
    def name(self) -> str | None:
        return (self.model_extra or {}).get("name")

    @property
    def kind(self) -> str | None:
        return (self.model_extra or {}).get("kind")


def _recorded(value: Any) -> Any:
    return RecordedSettings.model_validate(value) if isinstance(value, dict) else value


# The stage's settings in a manifest: the kind's model when the Dagster layer writes it (all its fields written,
# SerializeAsAny), RecordedSettings when read back.
StageSettings = Annotated[SerializeAsAny[Stage] | RecordedSettings, BeforeValidator(_recorded)]


class Manifest(BaseModel):
    """What every manifest has. Read as this, a manifest keeps all its other fields too (model_extra)."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")

    kind: str
    created: str = ""
    dagster_run_id: str | None = None
    mlflow_run_id: str | None = None


class ArtifactManifest(Manifest):
    """A manifest of one known kind: its fields are all declared."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class SourceManifest(ArtifactManifest):
    kind: Literal["source"] = "source"
    source: str
    file: str
    rows: int
    columns: list[str]
    sha256: str | None = None


class MixShare(BaseModel):
    """One source of a mixed dataset: the weight it was asked for (normalised), the rows drawn from it, the rows
    it has in the dataset (duplicates dropped) and their share of the dataset."""

    source: str
    weight: float
    drawn: int
    rows: int
    share: float
    read_from: str | None = None  # its source snapshot's directory, or the file it was read from


class NearDuplicateReport(BaseModel):
    """The near-duplicate prompts a dataset stage found (engine/data/near_dups.py): clusters of two rows or more,
    the rows in them, the largest's size, the rows dedupe: near dropped, a few clusters' prompts (largest first),
    the search's seconds and its settings."""

    clusters: int
    rows_in_clusters: int
    largest: int = 0
    dropped: int = 0
    examples: list[list[str]] = Field(default_factory=list)
    seconds: float = 0.0
    threshold: float | None = None
    ngram: int | None = None
    num_perm: int | None = None


class PiiFinding(BaseModel):
    """One piece of personal data found: where (the table row, 0-based, or the feedback record's id; the source of
    a mixture; the row's field) and what, in a snippet with the data masked (letters x, digits 9), never in full."""

    row: int
    source: str | None = None
    field: str
    entity: str
    snippet: str


class PiiReport(BaseModel):
    """What the personal-data scan of a dataset found (engine/data/pii.py) and what the stage did about it."""

    mode: str  # warn, redact or block: the stage's `pii`
    unit: str = "row"  # what rows_scanned counts and a finding's row is: a table's row, a feedback record
    rows_scanned: int
    rows_with_pii: int
    counts: dict[str, int] = Field(default_factory=dict)  # pieces found, by entity type
    redacted: int = 0  # pieces replaced by their placeholder (redact)
    findings: list[PiiFinding] = Field(default_factory=list)  # the first few (the counts cover all)
    detected: list[str] = Field(default_factory=list)  # what the scan looks for
    not_detected: list[str] = Field(default_factory=list)  # what it cannot (names: no NER model offline)
    seconds: float = 0.0


class DatasetManifest(ArtifactManifest):
    """A dataset stage's rows: train.jsonl and eval.jsonl. kind: the stage's kind (chat_dataset, ...).

    The leak between the sides, as shares of the held-out rows: prompt_overlap and answer_overlap count prompts
    and answers repeated word for word in train (as they always have); near_prompt_overlap also counts prompts
    that are near-copies of a training prompt, identifying_answer_overlap only the repeated answers that identify
    a row (long enough to be memorised, or with a (near-)repeated prompt). Those two are None in a manifest written
    before them, and the leak check then judges the word-for-word figures."""

    kind: str
    source: str
    settings: StageSettings
    train_rows: int
    eval_rows: int
    dropped: dict[str, int] = Field(default_factory=dict)
    quality: dict[str, Any] = Field(default_factory=dict)
    duplicates_dropped: int = 0
    prompt_overlap: float = 0.0
    answer_overlap: float = 0.0
    near_prompt_overlap: float | None = None
    identifying_answer_overlap: float | None = None
    near_duplicates: NearDuplicateReport | None = None  # None: the search was off (or predates this field)
    group_by: str | None = None
    system_prompt_uri: str | None = None  # the pipeline's system prompt in the Prompt Registry, if this is its dataset
    mixture: list[MixShare] = Field(default_factory=list)  # a mixture's sources as realised (empty: one source)
    pii: PiiReport | None = None  # personal data found (None: made before the scan existed)


class DataResult(StageResult):
    """What a worker that makes rows reports (preference pairs, teacher-written rows)."""

    kept: int
    train_rows: int
    eval_rows: int
    dropped: dict[str, int] = Field(default_factory=dict)
    preview: list[dict[str, Any]] = Field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "train_rows": self.train_rows,
            "eval_rows": self.eval_rows,
            **{f"dropped_{k}": v for k, v in self.dropped.items()},
            "preview": self.preview,
        }


D = TypeVar("D", bound=DataResult)


class SynthesisManifest(ArtifactManifest, Generic[D]):
    """Rows made by models: kind is the stage's kind (preference_pairs, synthetic_dataset)."""

    kind: str
    dataset: str
    student: str | None = None
    settings: StageSettings
    result: D


R = TypeVar("R", bound=TrainingSummary)


class AdapterManifest(ArtifactManifest, Generic[R]):
    """A LoRA adapter (adapter/) and how it was trained. result: the kind's result model (TrainingSummary
    reads any kind's)."""

    kind: Literal["adapter"] = "adapter"
    stage: str
    method: str
    base_model: str
    resolved_model: str
    chain: list[str]
    dataset: str
    previous: str | None = None
    settings: StageSettings
    reward_files: dict[str, str] = Field(default_factory=dict)
    upstream_mlflow_run_id: str | None = None
    result: R


class MergeResult(StageResult):
    """What a merge worker reports: the standalone model directory and a sample reply."""

    model_dir: str
    size_mb: float
    parameters: int
    sample_prompt: str
    sample_reply: str
    card: dict[str, Any] = Field(default_factory=dict)  # the model card's facts (release/card.py)


class MergedManifest(ArtifactManifest):
    kind: Literal["merged_model"] = "merged_model"
    base_model: str
    resolved_model: str
    adapters: list[str]
    upstream_mlflow_run_id: str | None = None
    info: MergeResult
    settings: StageSettings


class ReportManifest(ArtifactManifest):
    """An evaluation report: report.json (the evaluate kind's result), report.md, loss.png (each stage's curve) and
    heldout.png (the held-out NLL along the chain, each model named; absent on prompt data)."""

    kind: Literal["evaluation_report"] = "evaluation_report"
    merged: str
    dataset: str
    settings: StageSettings
    base_mlflow_run_id: str | None = None
    # the rows the report scored out of the split's (its settings' max_eval_rows, a seeded sample)
    held_out_rows: HeldOutRows | None = None


class ReplyAgreement(BaseModel):
    """How a GGUF file loaded back replies against the model it was made from (release/export/verify.py)."""

    model_config = ConfigDict(extra="forbid")

    prompts: int
    identical_replies: int
    reply_agreement: float  # share of the prompts whose whole greedy reply is the model's
    tokens: int
    token_agreement: float  # share of the model's reply tokens the file picks too (teacher-forced)


class ExportedFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: str
    format: str
    path: str
    size_bytes: int
    size_mb: float
    sha256: str
    seconds: float
    agreement: ReplyAgreement | None = None  # None: not verified (exports written before verification)


class ExportManifest(ArtifactManifest):
    kind: Literal["gguf_export"] = "gguf_export"
    merged: str
    report: str | None = None
    settings: StageSettings
    name: str
    architecture: str
    files: list[ExportedFile]
    system: str | None = None
    system_prompt_uri: str | None = None  # the registered version `system` is (prompts:/<pipeline>-system/N)
    stop: list[str] = Field(default_factory=list)
    ollama_create: str | None = None
    seconds: float
    merged_mlflow_run_id: str | None = None


class FeedbackDatasetManifest(ArtifactManifest):
    """Rows made from the chat feedback store for one retraining objective (kind feedback_<objective>_dataset)."""

    kind: str
    objective: str
    first_id: int
    last_id: int
    records: int
    rows: int
    train_rows: int
    eval_rows: int
    records_used: list[int]
    held_out_records: int
    skipped_records: int
    skipped: dict[str, int]
    pii: PiiReport | None = None  # personal data found in the records (None: made before the scan existed)


M = TypeVar("M", bound=Manifest)


def write_manifest(directory: str | Path, manifest: Manifest) -> Manifest:
    """Write manifest.json into directory (created now unless the manifest says when)."""
    if not manifest.created:
        manifest = manifest.model_copy(update={"created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    (Path(directory) / MANIFEST).write_text(manifest.model_dump_json(indent=2))
    return manifest


def read_manifest(directory: str | Path, model: type[M] = Manifest) -> M:
    """The manifest of the artifact at directory, validated by model; ManifestError names the directory and
    what is wrong (no manifest, not JSON, another kind of artifact, a field missing or malformed)."""
    path = Path(directory) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ManifestError(f"{directory} is not an artifact: it has no {MANIFEST}") from None
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path} is unreadable: {exc}") from None
    if not isinstance(data, dict) or "kind" not in data:
        raise ManifestError(f"{path} is not a dragon-dagster manifest (no kind)")
    expected = model.model_fields["kind"].annotation
    if get_origin(expected) is Literal and data["kind"] not in get_args(expected):
        raise ManifestError(f"{directory} is a {data['kind']} artifact, not a {get_args(expected)[0]} one")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise ManifestError(f"{path} is not a valid {data['kind']} manifest: {problems}") from None


def manifest_kind(directory: str | Path) -> str | None:
    """The kind of the artifact at directory; None where there is no readable manifest (a plain model dir)."""
    try:
        return read_manifest(directory).kind
    except ManifestError:
        return None
