"""Feedback records as training data (data/feedback_rows.py): the datasets crafted records become, and bad
records skipped and counted."""

from __future__ import annotations

import json

import pytest

from dragon_dagster.engine.data.conversations import conversation_row
from dragon_dagster.engine.data.feedback_rows import (
    SKIP_REASONS,
    check_record,
    feedback_prompts,
    objective_records,
    preference_pairs,
    sft_conversations,
    split_by_conversation,
    unpaired_ratings,
    usable_records,
)
from dragon_dagster.engine.data.feedback_turns import FeedbackError, check_turns
from tests.engine.data.feedback_support import CRAFTED, P1, P2, P3, record, turns


def test_sft_conversations_from_crafted_records():
    expected = [
        {"messages": P1 + [{"role": "assistant", "content": "Click 'forgot password'."}]},
        {"messages": P2 + [{"role": "assistant", "content": "Refunds take 5 business days."}]},
    ]
    shuffled = [CRAFTED[i] for i in (4, 2, 6, 0, 3, 1, 5)]
    assert sft_conversations(CRAFTED) == expected
    assert sft_conversations(shuffled) == expected  # ordered by id, whatever the input order
    assert conversation_row(expected[1]["messages"]) == {
        "prompt": P2,
        "completion": [{"role": "assistant", "content": "Refunds take 5 business days."}],
    }
    assert sft_conversations([]) == []


def test_preference_pairs_from_crafted_records():
    pairs = preference_pairs(CRAFTED)
    assert pairs == [
        {
            "prompt": P1,
            "chosen": [{"role": "assistant", "content": "Click 'forgot password'."}],
            "rejected": [{"role": "assistant", "content": "No idea."}],
        },
        {
            "prompt": P2,
            "chosen": [{"role": "assistant", "content": "Refunds take 5 business days."}],
            "rejected": [{"role": "assistant", "content": "Refunds take 5 days."}],
        },
        # P3: "changed my mind" ends up disliked and "meh" too: no good reply, no pair
    ]
    # an edit plus a separate dislike on the same prompt: every good x bad combination, deduplicated
    more = CRAFTED + [
        record(8, "g", P2, "Ask someone else.", "down"),
        record(9, "h", P2, "Refunds take 5 days.", "down"),
    ]
    rejected = [p["rejected"][0]["content"] for p in preference_pairs(more) if p["prompt"] == P2]
    assert rejected == ["Refunds take 5 days.", "Ask someone else."]
    assert preference_pairs(list(reversed(more))) == preference_pairs(more)


def test_unpaired_ratings_are_the_votes_no_pair_uses():
    # P1 (liked and disliked) and P2 (an edit) give pairs; P3's votes have no opposite: KTO gets them
    assert unpaired_ratings(CRAFTED) == [
        {"prompt": P3, "completion": [{"role": "assistant", "content": "meh"}], "label": False},
        {"prompt": P3, "completion": [{"role": "assistant", "content": "changed my mind"}], "label": False},
    ]
    liked_alone = [record(1, "a", P1, "Click 'forgot password'.", "up")]
    assert unpaired_ratings(liked_alone) == [
        {"prompt": P1, "completion": [{"role": "assistant", "content": "Click 'forgot password'."}], "label": True}
    ]
    assert objective_records(CRAFTED) == {
        "sft": [1, 3, 5],
        "dpo": [1, 2, 3, 5],
        "kto": [4, 7],
        "rlhf": [1, 2, 3, 4, 5, 7],  # every rated turn is a prompt to sample fresh replies to
    }


def test_feedback_prompts_are_each_rated_turns_once():
    records = [
        record(1, "c1", turns("q1"), "a", "up"),
        record(2, "c1", turns("q1"), "b", "down"),
        record(3, "c2", turns("q2"), "c", "edit", edited="better"),
        record(4, "c3", "not json", "d", "up"),  # skipped, as everywhere
    ]
    assert feedback_prompts(records) == [{"prompt": turns("q1")}, {"prompt": turns("q2")}]


def test_held_out_conversations_are_whole_and_stable():
    records = [record(i, f"c{i // 2}", turns(f"q{i}"), "r", "up") for i in range(20)]  # 10 conversations
    train, held = split_by_conversation(records, 0.2)
    assert len({r["conversation_id"] for r in held}) == 2 and len(held) == 4
    assert not {r["conversation_id"] for r in held} & {r["conversation_id"] for r in train}
    assert split_by_conversation(list(reversed(records)), 0.2)[1] == list(reversed(held))  # same conversations
    assert split_by_conversation(records[:2], 0.2) == (records[:2], [])  # one conversation: nothing held out
    assert len(split_by_conversation(records[:4], 0.2)[1]) == 2  # two: one held out, one trained on
    assert split_by_conversation(records, 0) == (records, [])


# ------------------------------------------------------------------------------------ bad records

BAD = [
    record(20, "x", "[{not json", "r", "up"),  # turns not JSON
    record(21, "x", [{"role": "assistant", "content": "only me"}], "r", "up"),  # no user turn
    record(22, "x", P1, "Click 'forgot password'.", "edit", edited=None),  # an edit without text
    record(23, "x", P1, "No idea.", "edit", edited="   "),  # an edit with blank text
    record(24, "x", [{"role": "robot", "content": "beep"}], "r", "up"),  # malformed turns
    record(25, "x", None, "r", "up"),  # no turns at all
    record(26, "x", P1, "r", "meh"),  # bad verdict
    record(27, "x", P1, None, "down"),  # reply not text
    "not a record",
]


def test_bad_records_are_skipped_and_counted_never_raised():
    mixed = BAD[:4] + CRAFTED + BAD[4:]
    assert sft_conversations(mixed) == sft_conversations(CRAFTED)
    assert preference_pairs(mixed) == preference_pairs(CRAFTED)
    usable, skipped = usable_records(mixed)
    assert [r["id"] for r in usable] == [r["id"] for r in CRAFTED]
    assert skipped == {
        "turns_not_json": 1,
        "no_user_turn": 1,
        "edit_without_text": 2,
        "turns_malformed": 2,
        "bad_verdict": 1,
        "reply_not_text": 1,
        "malformed": 1,
    }
    assert set(skipped) <= set(SKIP_REASONS) and check_record(CRAFTED[0]) is None
    assert [check_record(r) for r in BAD[:3]] == ["turns_not_json", "no_user_turn", "edit_without_text"]
    # turns given as JSON text are fine when they parse
    assert check_record({**CRAFTED[0], "turns": json.dumps(P1)}) is None
    assert usable_records(BAD) == (
        [],
        {
            "turns_not_json": 1,
            "no_user_turn": 1,
            "edit_without_text": 2,
            "turns_malformed": 2,
            "bad_verdict": 1,
            "reply_not_text": 1,
            "malformed": 1,
        },
    )
    with pytest.raises(FeedbackError, match="not JSON"):  # not a raw JSONDecodeError
        check_turns("[{not json")
