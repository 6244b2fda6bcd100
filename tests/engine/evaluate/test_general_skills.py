"""The general-skills suite (issue 30): the bundled lm-eval tasks load from the package's own files and score
offline, the data is what make_data.py makes, an unknown task name lists the bundled ones, the suite tells a
model that copies from one that does not, and the gate's rule names the task that fell."""

import importlib.util
import json

import pytest

from dragon_dagster.engine.evaluate.general_skills import SKILLS_DIR, SUITE_TAG, local_tasks, run_skills, skill_changes
from dragon_dagster.engine.pipeline.retraining import Gate, skill_falls

SUITE = ["skills_arithmetic", "skills_copy", "skills_format", "skills_order"]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    from transformers import AutoModelForCausalLM

    from dragon_dagster.engine.models import load_tokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model), load_tokenizer(str(tiny_model))


def test_the_bundled_suite_loads_from_its_own_files_and_scores_offline(tiny):
    assert local_tasks() == SUITE
    figures = run_skills(*tiny, [SUITE_TAG], limit=3)  # the tag: the whole suite
    assert set(figures) == set(SUITE)
    for name, f in figures.items():
        assert f["metric"] == "acc" and f["items"] == 3, (name, f)
        assert 0.0 <= f["score"] <= 1.0 and f["metrics"]["acc"] == f["score"]


def test_the_data_is_what_make_data_makes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_data", SKILLS_DIR / "make_data.py")
    make_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_data)
    make_data.HERE = tmp_path
    make_data.main()
    for skill in ("arithmetic", "copy", "format", "order"):
        for split, n in (("train", make_data.N_TRAIN), ("test", make_data.N_TEST)):
            written = (tmp_path / f"{skill}.{split}.jsonl").read_text()
            assert written == (SKILLS_DIR / f"{skill}.{split}.jsonl").read_text(), f"{skill}.{split} is stale"
            assert len(written.splitlines()) == n
    for line in (SKILLS_DIR / "order.test.jsonl").read_text().splitlines():
        row = json.loads(line)  # four distinct choices, the right one among them
        assert len(set(row["choices"])) == 4 and 0 <= row["answer"] < 4


def test_an_unknown_task_names_the_bundled_ones(tiny):
    with pytest.raises(ValueError, match=r"unknown skill task\(s\) \[.no_such_skill.\].*skills_arithmetic, skills_co"):
        run_skills(*tiny, ["no_such_skill"], limit=1)


def test_smollm2_copies_and_the_tiny_random_model_does_not(embedded_dir, tiny):
    """The suite measures a skill: the embedded SmolLM2 copies text after three examples, a random model never."""
    from transformers import AutoModelForCausalLM

    from dragon_dagster.engine.models import load_tokenizer

    smol = AutoModelForCausalLM.from_pretrained(embedded_dir), load_tokenizer(str(embedded_dir))
    good = run_skills(*smol, ["skills_copy"], limit=6)["skills_copy"]
    bad = run_skills(*tiny, ["skills_copy"], limit=6)["skills_copy"]
    assert good["score"] >= 5 / 6 and bad["score"] == 0.0, (good, bad)


def test_the_gate_names_each_task_that_fell_beyond_its_tolerance():
    base = {n: {"metric": "acc", "score": 0.5, "items": 16} for n in ("skills_copy", "skills_order")}
    merged = {
        "skills_copy": {"metric": "acc", "score": 0.125, "items": 16},
        "skills_order": {"metric": "acc", "score": 0.4375, "items": 16},  # fell 0.0625: within the default 0.1
    }
    changes = skill_changes(base, merged)
    assert [c["task"] for c in changes] == ["skills_copy", "skills_order"]
    assert changes[0]["change"] == -0.375
    skills = {"changes": changes}
    assert Gate().skills_tolerance == 0.1 and list(skill_falls(skills, Gate().skills_tolerance)) == ["skills_copy"]
    assert skill_falls(skills, 0.05) == {
        "skills_copy": "general skill skills_copy fell 0.50 -> 0.12 (acc), beyond skills_tolerance 0.05",
        "skills_order": "general skill skills_order fell 0.50 -> 0.44 (acc), beyond skills_tolerance 0.05",
    }
    assert skill_falls(skills, 0.5) == {} and skill_falls(None, 0.0) == {}
