"""Personal data found before training (issue 63): presidio's pattern recognisers over a dataset stage's rows and
the feedback records retraining uses; warn, redact or block, and the no_personal_data check that says so."""

import json

import pandas as pd
import pytest

from dragon_dagster.engine.artifacts.manifest import DatasetManifest, FeedbackDatasetManifest, write_manifest
from dragon_dagster.engine.data import pii
from dragon_dagster.engine.data.checks import pii_check
from dragon_dagster.engine.data.prepare import prepare
from dragon_dagster.engine.pipeline.objectives import FeedbackRange
from dragon_dagster.engine.stages.chat_dataset.settings import ChatDataset

EMAIL, PHONE, IP = "jane.doe@example.com", "+1 415-555-0134", "192.168.20.7"
CARD, NOT_A_CARD = "4111 1111 1111 1111", "4111 1111 1111 1112"  # the second fails the Luhn checksum
TICKETS = pd.DataFrame(
    {
        "body": [
            f"Write to me at {EMAIL} please.",
            f"Call me back on {PHONE}.",
            f"My card {CARD} was charged twice.",
            f"Order {NOT_A_CARD} arrived broken on 2024-03-15.",  # no checksum, a date: nothing personal
            f"The hub answers pings at {IP}.",
            "The doorbell chimes twice.",
        ],
        "reply": ["Noted.", "We will call.", "Refunded.", "Sorry!", "Thanks.", f"Mail {EMAIL} for a swap."],
    }
)


def stage(mode: str) -> ChatDataset:
    return ChatDataset(name="tickets", kind="chat_dataset", path="t.csv", prompt="body", response="reply", pii=mode)


def test_each_kind_is_found_in_the_rows_and_a_bad_checksum_or_a_date_is_not():
    prepared = prepare(stage("warn"), TICKETS)
    report = prepared.pii
    assert report.counts == {"CREDIT_CARD": 1, "EMAIL_ADDRESS": 2, "IP_ADDRESS": 1, "PHONE_NUMBER": 1}
    assert (report.rows_scanned, report.rows_with_pii) == (6, 5)
    assert {(f.row, f.entity) for f in report.findings} == {
        (0, "EMAIL_ADDRESS"), (1, "PHONE_NUMBER"), (2, "CREDIT_CARD"), (4, "IP_ADDRESS"), (5, "EMAIL_ADDRESS")
    }  # fmt: skip
    assert "PERSON" in report.not_detected  # names need an NER model, which is not here offline
    shown = json.dumps(report.model_dump())
    assert not any(secret in shown for secret in (EMAIL, PHONE, CARD, IP)), "findings are masked"
    assert "xxxx.xxx@xxxxxxx.xxx" in shown and "9999 9999 9999 9999" in shown  # the form shows, not the data
    texts = json.dumps(prepared.rows)
    assert EMAIL in texts and CARD in texts, "warn changes no row"


def test_redact_keeps_every_row_with_placeholders_in_prompts_and_replies():
    prepared = prepare(stage("redact"), TICKETS)
    rows = {r["prompt"][-1]["content"]: r["completion"][-1]["content"] for r in prepared.rows}
    assert len(rows) == 6 and prepared.pii.redacted == 5
    assert rows["Write to me at <EMAIL_ADDRESS> please."] == "Noted."
    assert "My card <CREDIT_CARD> was charged twice." in rows and "Call me back on <PHONE_NUMBER>." in rows
    assert "The hub answers pings at <IP_ADDRESS>." in rows
    assert rows["The doorbell chimes twice."] == "Mail <EMAIL_ADDRESS> for a swap."
    assert f"Order {NOT_A_CARD} arrived broken on 2024-03-15." in rows


def test_tool_call_arguments_and_every_turn_are_redacted():
    row = {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"I am {EMAIL}"}],
        "completion": [
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "lookup", "arguments": {"name": EMAIL, "n": 3}}}
            ]}
        ],
        "tools": [{"type": "function", "function": {"name": "lookup"}}],
    }  # fmt: skip
    [out], report = pii.scan_rows([row], "redact")
    assert out["prompt"][1]["content"] == "I am <EMAIL_ADDRESS>" and out["prompt"][0] == row["prompt"][0]
    call = out["completion"][0]["tool_calls"][0]["function"]
    assert call == {"name": "lookup", "arguments": {"name": "<EMAIL_ADDRESS>", "n": 3}} and out["tools"] == row["tools"]
    assert report.counts == {"EMAIL_ADDRESS": 2} and report.rows_with_pii == 1


@pytest.mark.parametrize(
    ("mode", "passed", "severity"), [("warn", False, "warn"), ("redact", True, "warn"), ("block", False, "error")]
)
def test_the_check_warns_blocks_or_passes_as_the_stage_says(tmp_path, mode, passed, severity):
    settings = stage(mode)
    prepared = prepare(settings, TICKETS)
    manifest = DatasetManifest(
        kind="chat_dataset", source="t.csv", settings=settings, train_rows=6, eval_rows=0, pii=prepared.pii
    )
    write_manifest(tmp_path, manifest)
    [spec] = [c for c in settings.checks() if c.name == "no_personal_data"]
    outcome = spec.judge(tmp_path)
    assert (outcome.passed, outcome.severity, spec.blocking) == (passed, severity, True)
    assert outcome.metadata["pii_email_address"] == 2 and outcome.metadata["rows_with_pii"] == 5
    if not passed:  # names the rows, masked, and the settings that fix it
        assert (
            "personal data in 5 of 6 rows" in outcome.description
            and "row 0 (prompt): EMAIL_ADDRESS" in outcome.description
        )
        assert "pii: redact" in outcome.description and EMAIL not in outcome.description


def record(i, conversation, text, verdict, reply):
    return {"id": i, "conversation_id": conversation, "turns": [{"role": "user", "content": text}],
            "verdict": verdict, "reply": reply, "edited": None}  # fmt: skip


RECORDS = [
    record(1, "a", f"My number is {PHONE}, the hub is dead", "up", "Unplug it for ten seconds."),
    record(2, "b", "The doorbell lags", "down", f"Mail {EMAIL}."),
    record(3, "c", "The lock jams", "up", "Oil the bolt."),
]


def test_feedback_records_are_redacted_in_every_objective_s_rows():
    found = FeedbackRange.of(RECORDS, 1, 3, held_out_frac=0, pii="redact")
    assert found.pii.unit == "record" and found.pii.counts == {"EMAIL_ADDRESS": 1, "PHONE_NUMBER": 1}
    every_row = json.dumps(found.rows)
    assert PHONE not in every_row and EMAIL not in every_row
    assert "My number is <PHONE_NUMBER>, the hub is dead" in json.dumps(found.rows["sft"][0])
    assert "Mail <EMAIL_ADDRESS>." in json.dumps(found.rows["kto"])
    assert len(found.rows["kto"][0]) == 3 and len(found.rows["sft"][0]) == 2, "every rating kept, both liked replies"


def test_feedback_pii_block_names_the_records(tmp_path):
    found = FeedbackRange.of(RECORDS, 1, 3, held_out_frac=0, pii="block")
    assert PHONE in json.dumps(found.rows), "block changes nothing: the check stops the retraining"
    write_manifest(
        tmp_path,
        FeedbackDatasetManifest(kind="feedback_sft_dataset", objective="sft", first_id=1, last_id=3, records=3,
                                rows=2, train_rows=2, eval_rows=0, records_used=[1, 3], held_out_records=0,
                                skipped_records=0, skipped={}, pii=found.pii),
    )  # fmt: skip
    outcome = pii_check("block", "Set feedback.pii: redact.").judge(tmp_path)
    assert not outcome.passed and outcome.severity == "error"
    assert (
        "personal data in 2 of 3 records" in outcome.description
        and "record 1 (turns): PHONE_NUMBER" in outcome.description
    )
    assert "record 2 (reply): EMAIL_ADDRESS" in outcome.description and PHONE not in outcome.description


def test_text_without_candidates_never_reaches_presidio():
    assert pii.candidates("The doorbell chimes twice, order 48213, on 2024-03-15.") == []
    assert pii.candidates(f"call {PHONE} or {EMAIL}") == ["EMAIL_ADDRESS", "PHONE_NUMBER"]


def test_an_identifier_s_digits_are_not_parsed_as_a_phone_number_and_a_number_beside_one_still_is():
    """phonenumbers refuses digits glued to a letter before them: the scan skips them (order numbers in every reply
    cost it 19 s at 100k rows), and only them."""
    assert pii.phone_windows("reply with case C0001234 and we will help") == []
    assert pii.find("reply with case C0001234 and we will help") == []
    # what the skip rests on: phonenumbers, given the whole text, refuses a valid number glued to a letter
    phones = pii.recognizers()["PHONE_NUMBER"]
    assert phones.analyze("order ORD4155550123 shipped", ["PHONE_NUMBER"], None) == []
    assert phones.analyze("order ORD 4155550123 shipped", ["PHONE_NUMBER"], None) != []
    text = f"case C0001234, call {PHONE}, ref A+14155550123"
    assert [e for _, _, e in pii.find(text)] == ["PHONE_NUMBER", "PHONE_NUMBER"]
