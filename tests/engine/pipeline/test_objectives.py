"""A range of feedback records made into every objective's rows, and "nothing to do" as a typed `Skipped` with
its reason: off, no rows of its kind, or no records at all."""

from dragon_dagster.engine.pipeline.objectives import NAMES, OBJECTIVES, FeedbackRange, Skipped

Q1, Q2 = [{"role": "user", "content": "Hub Pro blinks red"}], [{"role": "user", "content": "Doorbell lags"}]


def record(i, conversation, turns, verdict, reply, edited=None):
    return {"id": i, "conversation_id": conversation, "turns": turns, "verdict": verdict, "reply": reply,
            "edited": edited}  # fmt: skip


def test_a_range_makes_each_objective_s_rows_and_says_which_have_none():
    # thumbs up and down on different prompts: no pair anywhere, so dpo has nothing; one record is unusable
    records = [record(1, "a", Q1, "up", "Restart it."), record(2, "b", Q2, "down", "No idea."), {"id": "x"}]
    found = FeedbackRange.of(records, 1, 3, held_out_frac=0)
    assert set(found.rows) == set(NAMES) and found.skipped == {"malformed": 1}
    by_name = {o.name: o for o in OBJECTIVES}
    train = {name: rows for name, (rows, _) in found.rows.items()}
    assert len(train["sft"]) == 1 and train["dpo"] == [] and len(train["kto"]) == 2 and len(train["rlhf"]) == 2
    assert by_name["dpo"].skipped(["sft", "dpo"], len(train["dpo"])) == Skipped("no pairs")
    assert by_name["sft"].skipped(["sft", "dpo"], len(train["sft"])) is None
    assert by_name["kto"].skipped(["sft", "dpo"], len(train["kto"])) == Skipped("off (feedback.objectives)")
    # rlhf's reward model learns from the pairs, so it says what it lacks in its own words
    assert by_name["rlhf"].skipped(["rlhf"], 0, in_chain=False) == Skipped("no pairs to learn a taste from")
    assert found.nothing_to_train(["sft", "dpo"]) is None
    nothing = found.nothing_to_train(["dpo"])
    assert isinstance(nothing, Skipped) and nothing.reason.startswith("nothing to retrain on in feedback records 1-3")
    assert "no pairs to train dpo on" in nothing.reason and "1 skipped as unusable" in nothing.reason


def test_no_records_is_skipped_with_what_to_do():
    nothing = FeedbackRange.of([], 1, 0, held_out_frac=0.2).nothing_to_train(["sft"])
    assert nothing == Skipped(
        "no feedback records yet (range 1-0); rate or edit replies in the chat, and the feedback sensor or "
        "schedule requests retraining"
    )
