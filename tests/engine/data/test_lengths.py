"""Token lengths of a dataset's rows (the dataset asset's `tokens` metadata), batched: the same counts as rendering
and tokenizing each row alone, across chunks."""

from dragon_dagster.engine.data import lengths
from dragon_dagster.engine.models import load_tokenizer


def test_batched_lengths_equal_one_row_at_a_time_across_chunks(tiny_model, monkeypatch):
    tokenizer = load_tokenizer(str(tiny_model))
    user = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is my parcel?"}]
    reply = [{"role": "assistant", "content": "It left the depot today and arrives on Monday."}]
    rows = [
        {"prompt": user, "completion": reply},
        {"prompt": user, "chosen": reply + reply, "rejected": []},
        {"prompt": user},  # a bare prompt: with the generation prompt, as generation sees it
    ] * 3
    monkeypatch.setattr(lengths, "CHUNK", 2)  # chunk edges inside the rows

    def one(row):
        answer = row.get("completion") or row.get("chosen") or []
        text = tokenizer.apply_chat_template(row["prompt"] + answer, tokenize=False, add_generation_prompt=not answer)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    counted = lengths.chat_token_lengths(tokenizer, rows)
    assert counted == [one(r) for r in rows]
    assert counted[0] < counted[1] and counted[2] < counted[0]  # the reply's tokens count, twice when doubled
