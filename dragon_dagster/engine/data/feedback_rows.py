"""Chat feedback records as training data: the three datasets they turn into (SFT conversations, DPO pairs, KTO
rated replies), and the held-out conversations the promotion gate measures on. The records come from
the feedback store (data/feedback/).

- `sft_conversations(records)`: replies people liked or edited, with the turns that led to them, as
  conversations ({"messages": [...]}, the edited text replacing the reply); `data.conversation_row` turns
  one into a prompt-completion training row.
- `preference_pairs(records)`: for prompts (the same turns) that got both a liked-or-edited reply and a
  disliked one, {"prompt", "chosen", "rejected"} in TRL's conversational preference format; every edit also
  gives the pair (chosen=edited text, rejected=the original reply).

- `unpaired_ratings(records)`: thumbs up or down on replies to turns that give no pair (most ratings), as KTO's
  rated replies {"prompt", "completion", "label"}.
- `feedback_prompts(records)`: the turns people rated replies to, as prompts {"prompt": turns} that a GRPO stage
  samples fresh replies to and a reward model trained on the pairs scores (the rlhf objective).
- `objective_records(records)`: which record ids each objective's rows come from (for the run's tags).
- `split_by_conversation(records, frac)`: whole conversations held out, the same for every objective, so the
  promotion gate measures on feedback no objective trained on.

A record's turns may hold a chat's tool turns (an assistant turn's tool_calls, a tool turn's result:
data/feedback_turns.py); they stay in every row's prompt, as the calls and results the rated answer came after.

All skip records that cannot be used (turns not JSON or malformed, no user turn, an edit without text, a bad
verdict or reply) instead of failing; `usable_records` gives the usable ones and the skipped counts by reason.
Both are deterministic: records are taken in id order, so the same records give the same output.
Framework-free: nothing here imports Dagster.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from .feedback.records import VERDICTS
from .feedback_turns import FeedbackError, clean_messages

# why a record is left out of the datasets (usable_records counts them by these keys)
SKIP_REASONS = {
    "malformed": "not a feedback record (not a mapping, or a bad id)",
    "turns_not_json": "its turns are not JSON",
    "turns_malformed": "its turns are not a list of chat messages (role/content, tool turns after a call)",
    "no_user_turn": "its turns have no user turn",
    "bad_verdict": f"its verdict is not one of {VERDICTS}",
    "reply_not_text": "its reply is not text",
    "edit_without_text": "an edit without the improved text",
}


def _inspect(record: Any) -> tuple[str | None, dict | None]:
    """(why the record cannot be used, None) or (None, the record with clean turns)."""
    if not isinstance(record, dict) or (
        "id" in record and (not isinstance(record["id"], int) or isinstance(record["id"], bool))
    ):
        return "malformed", None
    turns = record.get("turns")
    if isinstance(turns, (str, bytes)):
        try:
            turns = json.loads(turns)
        except ValueError:
            return "turns_not_json", None
    try:
        turns = clean_messages(turns)
    except FeedbackError:
        return "turns_malformed", None
    if not any(m["role"] == "user" for m in turns):
        return "no_user_turn", None
    if record.get("verdict") not in VERDICTS:
        return "bad_verdict", None
    if not isinstance(record.get("reply"), str):
        return "reply_not_text", None
    if record["verdict"] == "edit" and (not isinstance(record.get("edited"), str) or not record["edited"].strip()):
        return "edit_without_text", None
    return None, {**record, "turns": turns}


def check_record(record: Any) -> str | None:
    """Why a record cannot be used for training (a key of SKIP_REASONS), or None when it can."""
    return _inspect(record)[0]


def usable_records(records: Iterable[Any]) -> tuple[list[dict], dict[str, int]]:
    """(the usable records in id order with clean turns, {reason: how many were skipped}); a bad record is
    skipped and counted, never an error."""
    good, skipped = [], {}
    for i, r in enumerate(records):
        reason, clean = _inspect(r)
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
        else:
            good.append((clean.get("id", i), i, clean))
    return [r for _, _, r in sorted(good, key=lambda t: (t[0], t[1]))], skipped


def _ordered(records: Iterable[dict]) -> list[dict]:
    return usable_records(records)[0]


def _key(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _ratings(records: list[dict]) -> list[dict]:
    """Edits, plus up/down votes where a later vote on the same reply in the same conversation (a change of
    mind) replaces an earlier one; in id order."""
    last: dict[tuple, int] = {}
    for i, r in enumerate(records):
        if r["verdict"] != "edit":
            last[(str(r.get("conversation_id")), _key(r["turns"]), r["reply"])] = i
    return [
        r
        for i, r in enumerate(records)
        if r["verdict"] == "edit" or last[(str(r.get("conversation_id")), _key(r["turns"]), r["reply"])] == i
    ]


def _good(record: dict) -> str | None:
    if record["verdict"] == "up":
        return record["reply"]
    if record["verdict"] == "edit":
        return record["edited"]
    return None


def sft_conversations(records: Iterable[dict]) -> list[dict]:
    """Liked or edited replies with the turns before them, as {"messages": [...turns, assistant reply]} (an
    edit's text replaces the reply); deduplicated, in order of first appearance by id."""
    out, seen = [], set()
    for r in _ratings(_ordered(records)):
        text = _good(r)
        if text is None or not text.strip():
            continue
        messages = r["turns"] + [{"role": "assistant", "content": text}]
        key = _key(messages)
        if key not in seen:
            seen.add(key)
            out.append({"messages": messages})
    return out


def preference_pairs(records: Iterable[dict]) -> list[dict]:
    """{"prompt": turns, "chosen": [assistant], "rejected": [assistant]} rows (TRL conversational preference
    format). Every edit gives (edited, original reply); every prompt (same turns) with both a liked-or-edited
    reply and a disliked one gives each good x bad combination. Deduplicated; chosen never equals rejected."""
    out, seen = [], set()

    def add(turns, chosen, rejected):
        if not chosen.strip() or chosen == rejected:
            return
        key = _key([turns, chosen, rejected])
        if key not in seen:
            seen.add(key)
            out.append(
                {
                    "prompt": turns,
                    "chosen": [{"role": "assistant", "content": chosen}],
                    "rejected": [{"role": "assistant", "content": rejected}],
                }
            )

    for group in _groups(list(records)):
        goods = [g for g in (_good(r) for r in group["events"]) if g is not None]
        bads = [r["reply"] for r in group["events"] if r["verdict"] == "down"]
        for r in group["events"]:
            if r["verdict"] == "edit":
                add(group["turns"], r["edited"], r["reply"])
        for good in goods:
            for bad in bads:
                add(group["turns"], good, bad)
    return out


def _groups(records: list[dict]) -> list[dict]:
    """Ratings grouped by the turns they answer (the same prompt), in order of first id: {"turns", "events"}."""
    groups: dict[str, dict] = {}
    for r in _ratings(_ordered(records)):
        groups.setdefault(_key(r["turns"]), {"turns": r["turns"], "events": []})["events"].append(r)
    return list(groups.values())


def _paired(group: dict) -> bool:
    """Whether a group gives pairs: it has an edit, or both a liked-or-edited reply and a disliked one."""
    verdicts = {r["verdict"] for r in group["events"]}
    return "edit" in verdicts or ("up" in verdicts and "down" in verdicts)


def unpaired_ratings(records: Iterable[dict]) -> list[dict]:
    """Thumbs up or down on replies to turns that give no pair (no edit, no opposite verdict on the same turns),
    as KTO rows {"prompt": turns, "completion": [assistant reply], "label": liked}. Most ratings people give are
    of this kind; pairs need both sides. Deduplicated, in id order."""
    out, seen = [], set()
    for group in _groups(list(records)):
        if _paired(group):
            continue
        for r in group["events"]:
            key = _key([group["turns"], r["reply"], r["verdict"]])
            if key not in seen:
                seen.add(key)
                out.append(
                    {
                        "prompt": group["turns"],
                        "completion": [{"role": "assistant", "content": r["reply"]}],
                        "label": r["verdict"] == "up",
                    }
                )
    return out


def feedback_prompts(records: Iterable[dict]) -> list[dict]:
    """The turns of every rated reply, once each, as prompt rows {"prompt": turns}: what people asked, for fresh
    replies the reward model scores (its verdicts trained that model; here only the question is kept)."""
    out, seen = [], set()
    for r in _ordered(records):
        key = _key(r["turns"])
        if key not in seen:
            seen.add(key)
            out.append({"prompt": r["turns"]})
    return out


def objective_records(records: Iterable[dict]) -> dict[str, list[int]]:
    """The ids of the records each objective's rows come from: sft (liked and edited replies), dpo (records in a
    pair), kto (votes without a pair), rlhf (every record: its turns are a prompt)."""
    out = {"sft": [], "dpo": [], "kto": [], "rlhf": []}
    for group in _groups(list(records)):
        paired = _paired(group)
        for r in group["events"]:
            if _good(r) is not None:
                out["sft"].append(r.get("id"))
            out["dpo" if paired else "kto"].append(r.get("id"))
            out["rlhf"].append(r.get("id"))
    return {k: sorted(set(v)) for k, v in out.items()}


def split_by_conversation(records: Iterable[dict], held_out_frac: float, seed: int = 42) -> tuple[list, list]:
    """(train records, held-out records): whole conversations held out, about held_out_frac of them (at least
    one when there are two or more, never all). Conversations are ranked by a hash of their id and the seed,
    so a conversation keeps its rank whatever else is in the range, and the same records always split the same
    way. Every dataset made from feedback splits by it, so no objective trains on a held-out conversation."""
    records = list(records)
    conversations = {str(r.get("conversation_id")) for r in records}
    n_held = (
        0
        if len(conversations) < 2 or held_out_frac <= 0
        else min(len(conversations) - 1, max(1, round(len(conversations) * held_out_frac)))
    )
    rank = sorted(conversations, key=lambda c: hashlib.sha256(f"{seed}\0{c}".encode()).hexdigest())
    held = set(rank[:n_held])
    return (
        [r for r in records if str(r.get("conversation_id")) not in held],
        [r for r in records if str(r.get("conversation_id")) in held],
    )
