"""Manifests written before a manifest's settings were typed (manifests_before/: as the tests' materialized chains
wrote them, one per artifact kind and training kind) still load, and their settings read as the kind's model."""

import json
import shutil
from pathlib import Path

import pytest

from dragon_dagster.engine import catalog
from dragon_dagster.engine.artifacts.manifest import (
    AdapterManifest,
    DatasetManifest,
    ExportManifest,
    FeedbackDatasetManifest,
    Manifest,
    ManifestError,
    MergedManifest,
    RecordedSettings,
    ReportManifest,
    SourceManifest,
    SynthesisManifest,
    read_manifest,
    write_manifest,
)
from dragon_dagster.engine.config.settings import value_at
from dragon_dagster.engine.stages.sft.settings import SFT

BEFORE = Path(__file__).parent / "manifests_before"
MODELS = {
    "source": SourceManifest,
    "adapter": AdapterManifest,
    "merged_model": MergedManifest,
    "evaluation_report": ReportManifest,
    "gguf_export": ExportManifest,
    "preference_pairs": SynthesisManifest,
}


def model_of(kind: str) -> type[Manifest]:
    if kind.startswith("feedback_"):
        return FeedbackDatasetManifest
    return MODELS.get(kind, DatasetManifest)


def artifact(tmp_path: Path, file: Path) -> Path:
    (tmp_path / file.stem).mkdir()
    shutil.copyfile(file, tmp_path / file.stem / "manifest.json")
    return tmp_path / file.stem


def test_there_is_an_old_manifest_of_every_training_kind():
    written = {json.loads(f.read_text())["settings"]["kind"] for f in BEFORE.glob("adapter_*.json")}
    assert written == {name for name, kind in catalog.KINDS.items() if kind.role == "training"}


@pytest.mark.parametrize("file", sorted(BEFORE.glob("*.json")), ids=lambda f: f.stem)
def test_an_old_manifest_loads_and_its_settings_read_as_its_kinds_model(file, tmp_path):
    written = json.loads(file.read_text())
    directory = artifact(tmp_path, file)
    manifest = read_manifest(directory, model_of(written["kind"]))
    if "settings" not in written:
        return
    assert isinstance(manifest.settings, RecordedSettings) and manifest.settings.kind == written["settings"]["kind"]
    stage = catalog.recorded_stage(manifest.settings)
    assert type(stage) is catalog.get(written["settings"]["kind"]).settings
    assert stage.name == written["settings"]["name"]
    if "args" in written["settings"]:
        assert value_at(stage, "args.learning_rate") == written["settings"]["args"]["learning_rate"]
    (tmp_path / "again").mkdir()
    rewritten = write_manifest(tmp_path / "again", manifest)  # written back as it was read
    assert json.loads((tmp_path / "again" / "manifest.json").read_text())["settings"] == written["settings"]
    assert rewritten.settings is manifest.settings


def test_a_manifest_written_with_the_stage_keeps_every_field_and_reads_back_as_its_model(tmp_path):
    stage = SFT(name="sft_adapter", kind="sft", dataset="rows", args={"learning_rate": 3e-4}, train_on="final_turn")
    report = ReportManifest(merged="m", dataset="d", settings=stage)
    assert report.settings is stage
    write_manifest(tmp_path, report)
    written = json.loads((tmp_path / "manifest.json").read_text())["settings"]
    assert written == stage.model_dump(mode="json")  # the kind's fields too, not only Stage's
    back = read_manifest(tmp_path, ReportManifest)
    assert catalog.recorded_stage(back.settings) == stage


def test_recorded_settings_of_an_unknown_kind_are_a_named_error(tmp_path):
    recorded = RecordedSettings.model_validate({"name": "x", "kind": "vanished", "lr": 1})
    with pytest.raises(ManifestError, match="stage 'x' name no known kind \\('vanished'\\)"):
        catalog.recorded_stage(recorded)
    old = RecordedSettings.model_validate({"name": "x", "kind": "sft", "dataset": "d", "lr": 1})
    with pytest.raises(ManifestError, match="sft stage 'x' no longer read as its kind's model"):
        catalog.recorded_stage(old)
