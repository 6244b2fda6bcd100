"""Stage versions: the same YAML gives the same versions wherever it lies, and each thing that decides a stage's
output (a setting, a file it reads, the base model, its kind's code) changes its version and only its own."""

from __future__ import annotations

import dataclasses
import shutil

from dragon_dagster.engine import catalog
from dragon_dagster.engine.pipeline import load
from dragon_dagster.engine.pipeline.versions import file_version, stage_version

YAML = """\
name: small
model: smollm2-135m
datasets:
  tickets: {path: tickets.csv}
stages:
  - {name: sft_dataset, kind: chat_dataset, source: tickets, prompt: subject, response: reply}
  - {name: sft_adapter, kind: sft, dataset: sft_dataset}
  - {name: pairs, kind: preference_pairs, dataset: sft_dataset, mode: teacher, teacher: reference}
  - {name: dpo_adapter, kind: dpo, dataset: pairs, beta: 0.1}
  - {name: prompts, kind: prompt_dataset, path: questions.csv, prompt: question, reference: answer}
  - name: grpo_adapter
    kind: grpo
    dataset: prompts
    rewards: [{type: numeric, weight: 1.0}, {type: custom, file: answer_reward.py, name: answer}]
  - {name: merged_model, kind: merge}
"""


def write(folder, yaml: str = YAML, reward: str = "return 1.0"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "defs.yaml").write_text(yaml)
    (folder / "tickets.csv").write_text("subject,reply\nReset,Hold the button.\nPair,Open the app.\n")
    (folder / "questions.csv").write_text("question,answer\n2+2?,4\n3+3?,6\n")
    (folder / "answer_reward.py").write_text(f"def reward(prompt, completion, reference, row):\n    {reward}\n")
    return folder / "defs.yaml"


def versions(path) -> dict[str, str]:
    pipeline = load(path)
    return {stage.name: stage_version(pipeline, stage) for stage in pipeline.stages}


def changed(before: dict, after: dict) -> set[str]:
    return {name for name in before if before[name] != after[name]}


def test_the_same_yaml_gives_the_same_versions_wherever_it_lies(tmp_path):
    here, there = versions(write(tmp_path / "a")), versions(write(tmp_path / "elsewhere" / "b"))
    assert here == there and len(set(here.values())) == len(here)  # each stage its own
    assert all(len(v) == 12 and int(v, 16) >= 0 for v in here.values())


def test_a_setting_changes_its_stage_only(tmp_path):
    before = versions(write(tmp_path / "a"))
    assert changed(before, versions(write(tmp_path / "b", YAML.replace("beta: 0.1", "beta: 0.2")))) == {"dpo_adapter"}
    # leaving out a setting that has its default changes nothing: the settings are compared as resolved
    assert changed(before, versions(write(tmp_path / "c", YAML.replace(", beta: 0.1}", "}")))) == set()


def test_a_file_a_stage_reads_counts_by_its_content(tmp_path):
    before = versions(write(tmp_path / "a"))
    assert changed(before, versions(write(tmp_path / "b", reward="return 0.5"))) == {"grpo_adapter"}
    folder = tmp_path / "c"
    write(folder)
    (folder / "questions.csv").write_text("question,answer\n2+2?,4\n3+3?,7\n")  # one row edited
    assert changed(before, versions(folder / "defs.yaml")) == {"prompts"}
    # a source file is versioned on its own (its snapshot asset), by content
    (folder / "copy.csv").write_bytes((tmp_path / "a" / "tickets.csv").read_bytes())
    assert file_version(folder / "copy.csv") == file_version(tmp_path / "a" / "tickets.csv")
    (folder / "copy.csv").write_text("subject,reply\nReset,Hold the button longer.\nPair,Open the app.\n")
    assert file_version(folder / "copy.csv") != file_version(tmp_path / "a" / "tickets.csv")


def test_the_base_model_and_a_kinds_code_version_change_versions(tmp_path, monkeypatch):
    path = write(tmp_path / "a")
    before = versions(path)
    other = versions(write(tmp_path / "b", YAML.replace("model: smollm2-135m", "model: qwen2.5-0.5b")))
    assert changed(before, other) == set(before)
    monkeypatch.setitem(catalog.KINDS, "dpo", dataclasses.replace(catalog.get("dpo"), version="2"))
    assert changed(before, versions(path)) == {"dpo_adapter"}


def test_a_local_model_counts_by_its_files_not_its_place(tmp_path):
    model = tmp_path / "m1"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    shutil.copytree(model, tmp_path / "m2")
    a = versions(write(tmp_path / "a", YAML.replace("smollm2-135m", str(model))))
    b = versions(write(tmp_path / "b", YAML.replace("smollm2-135m", str(tmp_path / "m2"))))
    assert a == b
    (tmp_path / "m2" / "config.json").write_text('{"hidden_size": 16}')
    c = versions(write(tmp_path / "c", YAML.replace("smollm2-135m", str(tmp_path / "m2"))))
    assert changed(a, c) == set(a)


def test_a_missing_file_is_a_version_too(tmp_path):
    assert file_version(tmp_path / "nowhere.csv") == "missing"
