"""The contamination check's n-gram overlap (issue 63): an evaluation row with 13 words in a row of a training row
is found, 12 are not; the length is a setting; a short row counts whole; a split is not checked against its own
train; and the demo pipelines' real datasets are checked as their report's check would."""

import pytest

from dragon_dagster.engine.evaluate.contamination import MIN_WORDS, find_contamination, words

WORDS = "the smart thermostat keeps restarting every night after the firmware update and the app shows error seven"


def chat(user: str, reply: str = "Thanks, we will look into it.") -> dict:
    return {
        "prompt": [{"role": "system", "content": "You are a support agent."}, {"role": "user", "content": user}],
        "completion": [{"role": "assistant", "content": reply}],
    }


def run_of(n: int, start: int = 2) -> str:
    return " ".join(WORDS.split()[start : start + n])


def test_thirteen_words_in_a_row_are_found_and_twelve_are_not():
    held_out = run_of(15, start=0)  # 15 words: 13 of them are 87% of the row, over the default 80%
    evaluation = {
        "held_out": [chat(held_out, ""), chat("Where is my parcel? It was due on Monday and nothing came yet.")]
    }
    thirteen = {"train": [chat("Hello.", "Other text. " + run_of(13, start=1).upper() + "!")]}  # case, punctuation
    found = find_contamination(thirteen, evaluation)
    [match] = found.matches
    assert (match.eval_set, match.eval_row, match.training_set, match.training_row) == ("held_out", 0, "train", 0)
    assert match.shared == " ".join(words(run_of(13, start=1)))
    assert found.checked == {"held_out": 2} and found.contaminated == {"held_out": 1} and found.n == 13

    twelve = {"train": [chat("Hello.", run_of(12, start=0) + " and then " + run_of(12, start=3))]}  # runs of 12
    assert find_contamination(twelve, evaluation).matches == []
    assert len(find_contamination(twelve, evaluation, n=12).matches) == 1  # the length is the setting's


def test_a_row_shorter_than_n_counts_whole_and_a_very_short_one_is_not_checked():
    evaluation = {"skills": [{"prompt": "Question: What is 20 + 7?\nAnswer:", "target": "27"}, {"prompt": "Yes."}]}
    assert MIN_WORDS > 1
    whole = find_contamination({"train": [chat("x question what is 20 7 answer 27 y")]}, evaluation)
    assert [(m.eval_row, m.shared) for m in whole.matches] == [(0, "question what is 20 7 answer 27")]
    assert whole.too_short == {"skills": 1} and whole.checked == {"skills": 1}
    part = find_contamination({"train": [chat("question what is 20 7 answer 28, yes")]}, evaluation)
    assert part.matches == []  # the whole item, answer included, or nothing: "yes" is too common to count


def test_a_split_is_not_checked_against_its_own_train_and_the_system_prompt_never_counts():
    system = "You are a support agent who answers in two sentences and never promises a refund to anybody."
    evaluation = {"a": [chat(WORDS)], "b": [chat("Is the doorbell waterproof and can it be mounted outside please?")]}
    for row in evaluation["b"]:
        row["prompt"][0]["content"] = system
    training = {
        "a": [chat(WORDS)],
        "c": [{"prompt": [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]}],
    }
    found = find_contamination(training, evaluation, exempt={"a": {"a"}})
    assert found.matches == [] and found.training_rows == 2


@pytest.mark.parametrize("chunk", [3, 1 << 21])
def test_rows_are_found_whatever_the_chunks(monkeypatch, chunk):
    from dragon_dagster.engine.evaluate import contamination

    monkeypatch.setattr(contamination, "CHUNK_WORDS", chunk)  # grams never cross from one row into the next
    training = {"train": [chat(w) for w in WORDS.split()] + [chat("filler"), chat(WORDS)]}
    [match] = find_contamination(training, {"held_out": [chat(WORDS)]}).matches
    assert match.training_row == len(WORDS.split()) + 1


def test_a_shared_sign_off_is_not_contamination_but_a_copied_row_is():
    sign_off = "If that does not help, reply here and we will arrange a replacement for you."
    held_out = chat("My doorbell camera lags by several seconds since the update.", "Lower the stream. " + sign_off)
    training = {"train": [chat(f"Ticket {i} about the hub.", f"Restart hub {i}. " + sign_off) for i in range(3)]}
    assert find_contamination(training, {"held_out": [held_out]}).matches == []  # 15 of 28 words: 54%
    assert len(find_contamination(training, {"held_out": [held_out]}, share=0.5).matches) == 1
    assert len(find_contamination(training, {"held_out": [held_out]}, share=0).matches) == 1  # GPT-3's: any run
    [match] = find_contamination({"train": [*training["train"], held_out]}, {"held_out": [held_out]}).matches
    assert match.training_row == 3


def test_a_report_checks_the_datasets_its_model_was_trained_on_and_not_a_stage_beside_it(tmp_path):
    from pathlib import Path

    from dragon_dagster.engine.pipeline import load
    from dragon_dagster.engine.pipeline.contamination import evaluation_datasets, training_datasets
    from tests.support import component_yaml

    support = load(Path(__file__).parents[3] / "dragon_dagster" / "defs" / "support" / "defs.yaml")
    report = support.stage("evaluation_report")
    assert training_datasets(support, report) == ["sft_dataset", "preference_pairs", "arithmetic_prompts"]
    path = tmp_path / "defs.yaml"
    path.write_text(
        component_yaml(
            "name: beside\nmodel: smollm2-135m\nstages:\n"
            "  - {name: a, kind: chat_dataset, path: 'example:tickets.csv', prompt: subject, response: reply}\n"
            "  - {name: b, kind: chat_dataset, path: 'example:tickets.csv', prompt: body, response: reply}\n"
            "  - {name: c, kind: chat_dataset, path: 'example:tickets.csv', prompt: product, response: reply}\n"
            "  - {name: a_sft, kind: sft, dataset: a}\n"
            "  - {name: merged, kind: merge}\n"
            "  - {name: report, kind: evaluate, dataset: c}\n"
            "  - {name: b_sft, kind: sft, dataset: b}\n"  # after the merge: not part of the report's model
        )
    )
    beside = load(path)
    assert training_datasets(beside, beside.stage("report")) == ["a"]
    assert evaluation_datasets(beside, beside.stage("report")) == ["a", "c"]
