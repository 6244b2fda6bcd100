"""Near-duplicate prompts (issue 63): paraphrases found as clusters and kept on one side of the split, counted by
the leak check when a split puts them on both, dropped by dedupe: near; short answers two rows happen to share
reported, not blocking. Engine-level: no training."""

import zlib

import numpy as np
import pandas as pd
import pytest
from datasketch import MinHash
from pydantic import ValidationError

from dragon_dagster.engine import catalog
from dragon_dagster.engine.artifacts.manifest import DatasetManifest
from dragon_dagster.engine.data import holdout, near_dups, row_parts
from dragon_dagster.engine.data.checks import blocking_overlap, leak_problem
from dragon_dagster.engine.data.prepare import prepare

PROBLEMS = [
    "I ordered a {p} and it still has not arrived, the tracking page has said in transit for a week.",
    "The {p} I received stopped working after two days and will not turn on even with a new cable.",
    "I was charged twice for the {p}, my bank statement shows two payments from your shop on one day.",
    "My {p} arrived with a cracked lid and a torn box, it looks like it was dropped in the warehouse.",
    "I would like to change the delivery address for my {p} because I am moving to another city soon.",
    "The {p} on your site was shown in dark green but the one that came to my door is bright orange.",
]
CONTEXTS = [
    "I have been a customer for many years and this never happened before. Can you tell me what to do next?",
    "My sister recommended your shop to me and I was looking forward to using it. What are my options here?",
    "I already wrote to you last Tuesday but nobody answered my message yet. Could someone please call me back?",
    "It was meant to be a birthday present for my son this weekend. Is there any way to fix this quickly?",
    "I paid extra for express shipping so I expected a better service. Please let me know how you will help.",
]
PRODUCTS = ["kettle", "lamp", "backpack", "blender", "jacket", "router"]


def paraphrases(text: str) -> list[str]:
    """Three wordings of one ticket: a word swapped, the punctuation changed, a sentence added."""
    swapped = text.replace(" the ", " this ", 1)
    return [swapped, text.replace(". ", "! ", 1).replace("?", "??").replace(",", ""), text + " Thanks for your help."]


def tickets() -> pd.DataFrame:
    """30 tickets (each problem with each context), each in three paraphrases sharing its case id and its reply."""
    rows = []
    for case in range(30):
        problem, context = divmod(case, 5)
        ticket = PROBLEMS[problem].format(p=PRODUCTS[(problem + context) % 6]) + " " + CONTEXTS[context]
        reply = f"Sorry about that: I have opened case {case} for you and a colleague will write within a day."
        rows += [{"case": f"C{case}", "ticket": t, "reply": reply} for t in paraphrases(ticket)]
    return pd.DataFrame(rows).assign(row=lambda df: [str(i) for i in range(len(df))])


def chat(**settings):
    return catalog.parse_stage(
        {"name": "tickets", "kind": "chat_dataset", "path": "t.csv", "prompt": "ticket", "response": "reply"}
        | {"eval_frac": 0.2, **settings}
    )


def sides(prepared, df: pd.DataFrame) -> dict[str, set[bool]]:
    """case -> the sides its rows landed on (True: held out)."""
    case = dict(zip(df.ticket, df.case, strict=True))
    out: dict[str, set[bool]] = {}
    for held, rows in ((False, prepared.train), (True, prepared.held)):
        for r in rows:
            out.setdefault(case[row_parts.user_text(r)], set()).add(held)
    return out


def test_signatures_are_datasketch_minhashes_and_exact_jaccard_decides_near_the_threshold():
    texts = ["Where is my parcel, it has not come yet?", "", "Où est ma commande? Ça fait dix jours."]
    hashed, starts = near_dups.shingle_hashes(texts, 3)
    signatures = near_dups.signatures(hashed, starts, 64)
    for k in range(len(texts)):  # the same MinHash as datasketch's, one row at a time
        one = MinHash(num_perm=64, seed=1, hashfunc=int)
        one.update_batch(hashed[starts[k] : starts[k + 1]].tolist())
        assert np.array_equal(one.hashvalues, signatures[k])
    assert [starts[k + 1] - starts[k] for k in range(3)] == [7, 1, 6]  # n-grams of words; an empty text is one
    # template prompts differing in their last word: Jaccard 0.75, under 0.8 however the estimate falls
    orders = [f"Could you look up my order? It's H{1000 + i}." for i in range(60)]
    for exact_rows in (0, 500):  # signatures and LSH, or every pair measured
        assert near_dups.find(orders, exact_rows=exact_rows).clusters() == []
        loose = near_dups.NearDuplicates(threshold=0.7)
        assert len(near_dups.find(orders, loose, exact_rows=exact_rows).clusters()) == 1
    assert zlib.crc32(b"x")  # the words' hash is deterministic across processes (no PYTHONHASHSEED)


def test_paraphrases_are_clusters_that_stay_on_one_side_and_leak_when_split():
    df = tickets()
    prepared = prepare(chat(), df)
    near = prepared.near_duplicates
    assert (near["clusters"], near["rows_in_clusters"], near["largest"]) == (30, 90, 3)
    assert len(near["examples"]) == 3 and all(len(e) == 3 for e in near["examples"])
    assert prepared.held and all(len(s) == 1 for s in sides(prepared, df).values())  # no cluster split
    assert blocking_overlap(prepared.leakage) == (0.0, 0.0)

    # the old split (each user prompt its own group) puts paraphrases on both sides; word for word nothing
    # repeats, so the old prompt figure saw no leak: the near-copy figure does, and the check blocks
    old = prepare(chat(near_duplicates={"find": False}), df)
    assert any(len(s) == 2 for s in sides(old, df).values())
    assert old.leakage["prompt_overlap"] == 0.0 and old.near_duplicates is None
    split = prepare(chat(group_by="row"), df)  # group_by decides the split; the figure still counts near-copies
    assert any(len(s) == 2 for s in sides(split, df).values())
    assert split.leakage["prompt_overlap"] == 0.0 and split.leakage["near_prompt_overlap"] > 0.5
    assert "near-copy" in leak_problem(*blocking_overlap(split.leakage))
    by_case = prepare(chat(group_by="case"), df)
    assert blocking_overlap(by_case.leakage) == (0.0, 0.0)


def test_the_lsh_search_finds_what_comparing_every_pair_finds():
    texts = list(tickets().ticket) + [f"Could you look up my order? It's H{1000 + i}." for i in range(60)]
    exact, lsh = near_dups.find(texts, exact_rows=len(texts)), near_dups.find(texts, exact_rows=0)
    assert len(exact.clusters()) == 30 and lsh.clusters() == exact.clusters()


def test_dedupe_near_keeps_one_row_of_each_cluster():
    prepared = prepare(chat(dedupe="near"), tickets())
    assert len(prepared.rows) == 30 and prepared.near_duplicates["dropped"] == 60
    assert len({r["completion"][-1]["content"] for r in prepared.rows}) == 30  # one of each case
    assert prepare(chat(dedupe=True), tickets()).duplicates == 0 and len(prepare(chat(), tickets()).rows) == 90


def test_dedupe_values_are_checked():
    assert chat(dedupe=True).dedupe == "exact" and chat(dedupe=False).dedupe == "off"
    with pytest.raises(ValidationError, match="dedupe must be exact .* not 'fuzzy'"):
        chat(dedupe="fuzzy")
    with pytest.raises(ValidationError, match="near_duplicates.find is false"):
        chat(dedupe="near", near_duplicates={"find": False})
    with pytest.raises(ValidationError, match="threshold"):
        chat(near_duplicates={"threshold": 1.5})


def parcels(reply: str) -> pd.DataFrame:
    """40 parcels, each asked about twice; prices repeat across parcels (40 parcels, 7 prices)."""
    rows = [
        {"parcel": f"P{i}", "question": q.format(i=i, city=city), "answer": reply.format(price=f"{15 + i % 7}.50")}
        for i, city in zip(range(40), ["Lyon", "Graz", "Porto", "Ghent"] * 10, strict=True)
        for q in ("How much is shipping parcel P{i} to {city}?", "What will sending P{i} to {city} cost me?")
    ]
    return pd.DataFrame(rows)


def test_a_short_answer_two_parcels_share_is_reported_but_a_long_one_blocks():
    stage = catalog.parse_stage(
        {"name": "p", "kind": "chat_dataset", "path": "p.csv", "prompt": "question", "response": "answer"}
        | {"group_by": "parcel", "eval_frac": 0.2}
    )
    short = prepare(stage, parcels("Shipping costs {price} EUR.")).leakage
    assert short["answer_overlap"] > 0 and short["identifying_answer_overlap"] == 0.0
    assert leak_problem(*blocking_overlap(short)) is None  # a coincidence: reported, not blocking
    long = prepare(stage, parcels("Shipping costs {price} EUR, paid on delivery to the courier at your door.")).leakage
    assert long["identifying_answer_overlap"] == long["answer_overlap"] > 0
    assert "identifies a training row" in leak_problem(*blocking_overlap(long))


def test_a_manifest_from_before_near_duplicates_is_judged_by_its_word_for_word_figures():
    old = DatasetManifest(
        kind="chat_dataset", source="s", settings={"name": "d"}, train_rows=9, eval_rows=1, answer_overlap=0.1
    )
    assert old.near_duplicates is None and blocking_overlap(old) == (0.0, 0.1)
    assert holdout.IDENTIFYING_ANSWER_WORDS == 8
