import json

import pandas as pd
import pytest

from dragon_dagster.engine.data import holdout, row_mapping, row_parts, tables
from dragon_dagster.engine.data.errors import DataError
from dragon_dagster.engine.data.row_mapping import Mapping
from dragon_dagster.engine.pipeline.definition import EXAMPLE_DIR

TICKETS = EXAMPLE_DIR / "tickets.csv"


def frame(n=3):
    return pd.DataFrame(
        {
            "subject": [f"s{i}" for i in range(n)],
            "body": [f"b{i}" for i in range(n)],
            "reply": [f"r{i}" for i in range(n)],
        }
    )


def test_reads_csv_jsonl_parquet_datasets_dir_and_frames(tmp_path):
    df = frame(4)
    df.to_json(tmp_path / "d.jsonl", orient="records", lines=True)
    df.to_parquet(tmp_path / "d.parquet")
    import datasets

    datasets.Dataset.from_pandas(df).save_to_disk(str(tmp_path / "saved"))
    for source in (tmp_path / "d.jsonl", tmp_path / "d.parquet", tmp_path / "saved", df):
        got = tables.read_table(source)
        assert list(got["subject"]) == ["s0", "s1", "s2", "s3"]
    assert len(tables.read_table(TICKETS)) == 200


def test_template_renders_columns_into_turns():
    rows = row_mapping.map_rows(frame(2), Mapping(prompt="{subject}\n\n{body}", response="reply", system="Be brief."))
    assert rows[1] == {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "s1\n\nb1"}],
        "completion": [{"role": "assistant", "content": "r1"}],
    }


def test_missing_column_error_lists_the_columns_there_are():
    with pytest.raises(DataError) as err:
        row_mapping.map_rows(frame(), Mapping(prompt="{subject}\n\n{body_text}", response="reply"))
    assert "body_text" in str(err.value) and "['subject', 'body', 'reply']" in str(err.value)
    with pytest.raises(DataError, match="answer"):
        row_mapping.map_rows(frame(), Mapping(prompt="subject", response="answer"))


def test_bad_template_is_named():
    with pytest.raises(DataError, match="bad template"):
        row_mapping.map_rows(frame(), Mapping(prompt="{subject", response="reply"))
    with pytest.raises(DataError, match="bad template"):
        row_mapping.map_rows(frame(), Mapping(prompt="{}", response="reply"))


def test_empty_and_unreadable_files_fail_with_the_path(tmp_path):
    (tmp_path / "empty.csv").write_text("subject,body,reply\n")
    with pytest.raises(DataError, match="empty"):
        tables.read_table(tmp_path / "empty.csv")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="broken.parquet"):
        tables.read_table(tmp_path / "broken.parquet")
    with pytest.raises(DataError, match="not found"):
        tables.read_table(tmp_path / "nope.csv")
    with pytest.raises(DataError, match="not a saved `datasets` directory"):
        tables.read_table(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match="cannot tell the format"):
        tables.read_table(tmp_path / "notes.txt")


def test_conversations_end_in_an_assistant_turn_and_earlier_turns_are_context():
    conv = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"},
    ]
    df = pd.DataFrame({"messages": [json.dumps(conv), conv]})
    rows = row_mapping.map_rows(df, Mapping(conversations="messages"))
    assert rows[0] == rows[1]
    assert rows[0]["completion"] == [{"role": "assistant", "content": "a2"}]
    assert [m["content"] for m in rows[0]["prompt"]] == ["sys", "u1", "a1", "u2"]
    with pytest.raises(DataError, match="end with an assistant"):
        row_mapping.map_rows(pd.DataFrame({"messages": [conv[:-1]]}), Mapping(conversations="messages"))
    with pytest.raises(DataError, match="no user turn"):
        row_mapping.map_rows(pd.DataFrame({"messages": [[conv[0], conv[2]]]}), Mapping(conversations="messages"))


def test_split_holds_out_five_percent_with_seed_and_none_under_twenty_rows():
    rows = [{"i": i} for i in range(200)]
    train, held = holdout.split_rows(rows)
    assert len(held) == 10 and len(train) == 190
    assert holdout.split_rows(rows)[1] == held  # deterministic for seed 42
    assert holdout.split_rows(rows, seed=7)[1] != held
    assert holdout.split_rows(rows[:19])[1] == []
    assert len(holdout.split_rows(rows[:20])[1]) == 1
    assert len(holdout.split_rows(rows, eval_frac=0.25)[1]) == 50
    for bad in (1.0, 1.5, -0.1):
        with pytest.raises(DataError, match="eval_frac"):
            holdout.split_rows(rows, eval_frac=bad)
    with pytest.raises(DataError, match="empty"):
        holdout.split_rows([])


def test_quality_counts_empty_turns_and_duplicates():
    rows = row_mapping.map_rows(
        pd.DataFrame({"p": ["a", "a", ""], "r": ["x", "x", "y"]}), Mapping(prompt="p", response="r")
    )
    q = row_parts.quality(rows)
    assert q == {"rows": 3, "empty_prompts": 1, "empty_replies": 0, "duplicate_share": round(1 / 3, 4)}
