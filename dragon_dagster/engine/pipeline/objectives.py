"""The objectives of a retraining from chat feedback, one row each in `OBJECTIVES`: the name
`feedback.objectives` lists, the dataset its rows are written to and how the records make them, the stages of the
`feedback:` section that train it, and why it does not train (off, or no rows). The Dagster layer
(assets/retraining.py and the modules beside it) builds every dataset, stage, run tag and report line from this
table, so an objective is added here, as one row and the `feedback:` field of its stage.

`FeedbackRange` is one retraining's records made into every objective's rows; "nothing to do" is a `Skipped`
value with its reason, which the Dagster layer turns into Dagster's own skip or an unchanged chain.
Framework-free: nothing here imports Dagster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..artifacts.manifest import PiiReport
from ..data.conversations import conversation_row
from ..data.feedback_rows import (
    feedback_prompts,
    objective_records,
    preference_pairs,
    sft_conversations,
    split_by_conversation,
    unpaired_ratings,
    usable_records,
)
from ..data.pii import PiiMode, scan_records


@dataclass(frozen=True)
class Skipped:
    """Nothing to do, and why, in words a person reads on the asset and the run ("no pairs")."""

    reason: str


def _conversation_rows(records: list[dict]) -> list[dict]:
    return [conversation_row(c["messages"], i) for i, c in enumerate(sft_conversations(records))]


@dataclass(frozen=True)
class Objective:
    """One objective of a retraining: what it needs, what it makes, what trains it."""

    name: str  # as feedback.objectives lists it, and the objective of its dataset's manifest
    dataset: str  # the asset its rows are written to: the dataset its last stage reads
    rows: Callable[[list[dict]], list[dict]]  # usable records, in id order, to its training rows
    what: str  # what its rows are, in its skip reason: "no <what>"
    unit: str  # what one row is, in the report
    about: str  # its dataset's description
    # the fields of the `feedback:` section holding the stages that train it, in order; the last continues the
    # chain of adapters, one before it is a model that stage reads (rlhf's reward model)
    stages: tuple[str, ...]
    helper_needs: str = ""  # what a stage before the last needs, in its skip reason
    by_default: bool = True  # in feedback.objectives unless the pipeline lists them

    def skipped(self, objectives: Sequence[str], train_rows: int, in_chain: bool = True) -> Skipped | None:
        """Why a stage of this objective does not train (off, or nothing to train on); None when it does."""
        if self.name not in objectives:
            return Skipped("off (feedback.objectives)")
        return None if train_rows else Skipped(f"no {self.what if in_chain else self.helper_needs}")


OBJECTIVES = (
    Objective(
        "sft",
        "feedback_sft_dataset",
        _conversation_rows,
        what="liked or edited replies",
        unit="conversations",
        about="Liked or edited replies with the turns before them, as conversations (an edit replaces the reply).",
        stages=("sft",),
    ),
    Objective(
        "dpo",
        "feedback_pairs",
        preference_pairs,
        what="pairs",
        unit="pairs",
        about="Preference pairs: an edit against its original, a liked or edited reply against a disliked one to "
        "the same turns.",
        stages=("dpo",),
    ),
    Objective(
        "kto",
        "feedback_ratings",
        unpaired_ratings,
        what="ratings without a pair",
        unit="rated replies",
        about="Thumbs up or down on replies to turns that give no pair (no edit, no opposite verdict), as rated "
        "replies for KTO.",
        stages=("kto",),
    ),
    # rlhf is asked for by name: a reward model, then GRPO, is the slowest
    Objective(
        "rlhf",
        "feedback_prompts",
        feedback_prompts,
        what="rated prompts",
        unit="prompts",
        about="The turns people rated a reply to, as prompts: GRPO samples fresh replies to them, which the "
        "feedback reward model scores (rlhf).",
        stages=("reward_model", "rlhf"),
        helper_needs="pairs to learn a taste from",
        by_default=False,
    ),
)
NAMES = tuple(o.name for o in OBJECTIVES)
DEFAULT = tuple(o.name for o in OBJECTIVES if o.by_default)


@dataclass(frozen=True)
class FeedbackRange:
    """The records of one retraining's range (ids first to last) made into each objective's train and held-out
    rows. Whole conversations are held out (the gate measures on them), the same ones for every objective."""

    first: int
    last: int
    records: list[dict]
    skipped: dict[str, int]  # unusable records by reason (feedback_rows.SKIP_REASONS)
    rows: dict[str, tuple[list[dict], list[dict]]]  # objective -> (train rows, held-out rows)
    used: dict[str, list[int]]  # objective -> the ids of the training records its rows come from
    held_out_records: int
    pii: PiiReport | None = None  # personal data in the usable records (redacted in every row when it says so)

    @classmethod
    def of(
        cls, records: list[dict], first: int, last: int, held_out_frac: float, pii: PiiMode = "warn"
    ) -> FeedbackRange:
        """The range's rows. pii: what to do with personal data in the usable records (feedback.pii), scanned
        before any objective's rows are made from them, so a redaction reaches every row."""
        usable, skipped = usable_records(records)
        usable, found = scan_records(usable, pii)
        train, held = split_by_conversation(usable, held_out_frac)
        return cls(
            first=first,
            last=last,
            records=records,
            skipped=skipped,
            rows={o.name: (o.rows(train), o.rows(held)) for o in OBJECTIVES},
            used=objective_records(train),
            held_out_records=len(held),
            pii=found,
        )

    def nothing_to_train(self, objectives: Sequence[str]) -> Skipped | None:
        """Why no objective the retraining runs has anything to train on; None when one has rows."""
        if any(self.rows[o][0] for o in objectives):
            return None
        if not self.records:
            return Skipped(
                f"no feedback records yet (range {self.first}-{self.last}); rate or edit replies in the chat, and "
                "the feedback sensor or schedule requests retraining"
            )
        by_name = {o.name: o for o in OBJECTIVES}
        return Skipped(
            f"nothing to retrain on in feedback records {self.first}-{self.last} ({len(self.records)} records, "
            f"{sum(self.skipped.values())} skipped as unusable: {self.skipped}, "
            f"{self.held_out_records} held out for the gate): no "
            + " and no ".join(by_name[o].what for o in objectives)
            + " to train "
            + ", ".join(objectives)
            + " on"
        )
