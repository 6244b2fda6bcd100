"""Champion and challenger on live traffic: each registered version's liked rate from the ratings people gave
its replies, and the test the promotion gate asks of a challenger before it replaces the champion.

`dragon serve` writes every rating into the pipeline's feedback store with the version that answered
(`model`: `models:/support/4`); a record's verdict `up` is a like, `down` and `edit` (a reply someone had to
correct) are not. `live_rates` counts them per version: {version: (liked, rated)}. Records of other models (the
chat page's `models:/support@champion (version 3)`, a directory) are not a version's and are left out.

The gate's test is fixed-size and exact, stated as: of the first `min_ratings` ratings of each version since the
challenger started waiting, the one-sided Fisher exact test of the 2x2 table (challenger, champion) x (liked, not
liked) against the alternative "the challenger's odds of a like are lower than the champion's". A p-value below
`alpha` says the challenger is worse: it is refused. Otherwise it is promoted ("not shown worse", not "shown
better": with 20 ratings each only a large fall is detected). The test is run once, when both versions have
their `min_ratings`, on exactly those ratings; never again on more: looking after every rating and stopping at
the first "not worse" would let chance promote a worse model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

Counts = tuple[int, int]  # (liked, rated)
_VERSION = re.compile(r"^models:/(?P<name>[^/@]+)/(?P<version>\d+)$")


def record_version(model: str | None, name: str) -> str | None:
    """The version of `name` a record's `model` names (`models:/name/4` -> "4"); None for anything else."""
    found = _VERSION.match((model or "").strip())
    return found["version"] if found and found["name"] == name else None


def live_rates(records: Iterable[dict], name: str, after_id: int = 0, first: int | None = None) -> dict[str, Counts]:
    """{version: (liked, rated)} of the registered model `name`, from feedback records (as the store returns
    them: `id`, `model`, `verdict`). after_id: only records after it; first: only each version's first this many
    ratings, by record id."""
    counts: dict[str, list[int]] = {}
    for record in sorted(records, key=lambda r: r["id"]):
        version = record_version(record.get("model"), name)
        if version is None or record["id"] <= after_id:
            continue
        liked, rated = counts.setdefault(version, [0, 0])
        if first is not None and rated >= first:
            continue
        counts[version] = [liked + (record.get("verdict") == "up"), rated + 1]
    return {v: (c[0], c[1]) for v, c in sorted(counts.items(), key=lambda kv: int(kv[0]))}


def version_counts(by_model: dict[str, Counts], name: str) -> dict[str, Counts]:
    """live_rates from per-model counts ({model: (liked, rated)}, as a store's verdict_counts gives them): the
    same {version: (liked, rated)}, every record counted."""
    counts: dict[str, list[int]] = {}
    for model, (liked, rated) in by_model.items():
        version = record_version(model, name)
        if version is not None:
            total = counts.setdefault(version, [0, 0])
            total[0], total[1] = total[0] + liked, total[1] + rated
    return {v: (c[0], c[1]) for v, c in sorted(counts.items(), key=lambda kv: int(kv[0]))}


class Ratings:
    """A feedback source's ratings as the live gate reads them, as of a record id: each version's counts, and the
    versions' first ratings after a record. A store counts and seeks in SQL (verdict_counts, first_ratings: no
    look reads the whole store); another source (MLflow traces) is read once, whole, and counted here."""

    def __init__(self, source, name: str, up_to_id: int):
        self.source, self.name, self.up_to_id = source, name, up_to_id
        self.counted = hasattr(source, "verdict_counts") and hasattr(source, "first_ratings")
        if self.counted:
            self.by_model = source.verdict_counts(up_to_id)
        else:
            self.records = source.records(up_to_id=up_to_id)

    def rates(self) -> dict[str, Counts]:
        """{version: (liked, rated)} of every rating up to up_to_id."""
        return version_counts(self.by_model, self.name) if self.counted else live_rates(self.records, self.name)

    def first(self, versions: Iterable[str], after_id: int, limit: int) -> list[dict]:
        """The versions' first `limit` ratings each after after_id (up to up_to_id): what the gate tests."""
        wanted = set(versions) - {None}  # no champion: nothing to ask for it
        if not self.counted:
            return [
                r for r in self.records if r["id"] > after_id and record_version(r.get("model"), self.name) in wanted
            ]
        models = [m for m in self.by_model if record_version(m, self.name) in wanted]
        found = [r for m in models for r in self.source.first_ratings(m, after_id, limit) if r["id"] <= self.up_to_id]
        return sorted(found, key=lambda r: r["id"])


def rate(counts: Counts) -> float | None:
    liked, rated = counts
    return liked / rated if rated else None


def challenger_worse_p(challenger: Counts, champion: Counts) -> float:
    """The one-sided Fisher exact p-value of "the challenger is liked less than the champion": the chance, with
    both margins fixed and no difference, of the challenger getting at most the likes it got."""
    from scipy.stats import fisher_exact

    (a, n), (c, m) = challenger, champion
    if n == 0 or m == 0:
        return 1.0
    return float(fisher_exact([[a, n - a], [c, m - c]], alternative="less").pvalue)


@dataclass(frozen=True)
class LiveDecision:
    """What the live gate says: promote (True), refuse (False) or wait for ratings (None), and why."""

    promote: bool | None
    reason: str
    challenger: Counts
    champion: Counts
    p_value: float | None = None


def live_decision(
    records: Iterable[dict],
    name: str,
    challenger: str,
    champion: str,
    min_ratings: int,
    alpha: float,
    after_id: int = 0,
) -> LiveDecision:
    """The gate on live ratings: the challenger's and the champion's first min_ratings ratings after after_id,
    tested as the module says once both have them."""
    counts = live_rates(records, name, after_id=after_id, first=min_ratings)
    ours, theirs = counts.get(challenger, (0, 0)), counts.get(champion, (0, 0))
    if ours[1] < min_ratings or theirs[1] < min_ratings:
        return LiveDecision(
            None,
            f"waiting for live ratings: {name}/{challenger} (challenger) has {ours[1]} and {name}/{champion} "
            f"(champion) {theirs[1]} of the {min_ratings} each needs",
            ours,
            theirs,
        )
    p = challenger_worse_p(ours, theirs)
    said = (
        f"{name}/{challenger} liked {ours[0]}/{ours[1]} against {name}/{champion}'s {theirs[0]}/{theirs[1]}: "
        f"one-sided Fisher exact p = {p:.3g}"
    )
    if p < alpha:
        return LiveDecision(False, f"refused: {said} < alpha {alpha:g}, the challenger is liked less", ours, theirs, p)
    return LiveDecision(True, f"promoted: {said} >= alpha {alpha:g}, not worse", ours, theirs, p)
