"""Near-duplicate prompts: two prompts are near-copies when the Jaccard similarity of their word n-gram sets
reaches the threshold; the connected near-copies are the clusters. Past EXACT_ROWS rows, MinHash signatures
(datasketch's MinHash permutations, applied to every row at once) and LSH banding (datasketch's MinHashLSH
choice of bands) find the candidate pairs, so the cost grows with the rows, not with their pairs; a candidate
the signatures' estimate cannot decide is measured exactly.

What is compared is the user prompt (the last user turn, row_parts.user_text): the held-out split keeps rows
that ask the same thing on one side, and the leak check counts a held-out prompt that nearly repeats a training
one, whatever the replies. Text is lower-cased and split into words (punctuation dropped), so a changed comma or
an added '!' changes nothing; a swapped word changes the n-grams that span it.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from ..config.settings import Settings

# n-grams permuted per block: 4,096 x 128 permutations x 4 bytes = 2 MB, which stays in the processor's cache.
BLOCK_SHINGLES = 4096
# A candidate pair whose MinHash estimate is this far from the threshold is decided by it (3 standard deviations
# at 128 permutations); nearer, its n-gram sets are compared exactly.
SURE_MARGIN = 0.1
# Up to this many rows every pair is measured exactly (125,000 pairs, well under a second): no signatures, and no
# datasketch import (~1 s, its LSH module loads scipy.integrate) for a small dataset.
EXACT_ROWS = 500
CHUNK_ROWS = 20_000  # texts split into words and n-grams at once
LSH_WEIGHTS = (0.1, 0.9)  # MinHashLSH's weights of false positives and false negatives
BLOCK_PAIRS = 20_000  # pairs compared exactly at once (their n-grams sorted together: ~10 MB)
EXAMPLES = 3  # clusters shown in the manifest and the asset's metadata, largest first
EXAMPLE_ROWS = 3  # prompts shown of each
EXAMPLE_CHARS = 160


class NearDuplicates(Settings):
    find: bool = Field(
        True,
        description="Look for near-duplicate prompts (MinHash LSH over word n-grams): without group_by each "
        "cluster stays on one side of the held-out split, dedupe: near drops all but one row of each, and the "
        "leak check counts held-out prompts that nearly repeat a training prompt. false: only word-for-word "
        "copies are grouped and counted.",
    )
    threshold: float = Field(
        0.8,
        gt=0,
        le=1,
        description="Jaccard similarity of two prompts' word n-gram sets from which they are near-copies, in "
        "(0, 1]. 0.7 catches a ticket of 25 words or more with a word swapped or a sentence added, and not "
        "templated prompts that differ in one slot of six words ('What is the status of F3471?').",
    )
    ngram: int = Field(
        3,
        ge=1,
        le=10,
        description="Words per n-gram (shingle). Shorter n-grams make small edits cheaper (and templates look "
        "alike); a prompt shorter than this is one n-gram.",
    )
    num_perm: int = Field(
        128,
        ge=16,
        le=512,
        description="MinHash permutations per prompt: more estimate the similarity closer (128: about +-0.04) "
        "and cost time and memory linearly (4 bytes each per row).",
    )


@dataclass
class Found:
    """The near-copies among some prompts: each row's cluster (rows with no near-copy are their own), the pairs
    found to be near-copies (i < j), and what it took."""

    labels: np.ndarray  # cluster id per row: the index of its first row
    pairs: np.ndarray  # (m, 2) int64, near-copy pairs
    seconds: float
    settings: NearDuplicates = field(default_factory=NearDuplicates)

    def clusters(self) -> list[list[int]]:
        """Clusters of two rows or more, each as its rows in order; largest first."""
        members: dict[int, list[int]] = {}
        for i, label in enumerate(self.labels.tolist()):
            members.setdefault(label, []).append(i)
        return sorted((m for m in members.values() if len(m) > 1), key=lambda m: (-len(m), m[0]))

    def firsts(self) -> list[int]:
        """The rows that stay when each cluster keeps its first row."""
        return np.flatnonzero(self.labels == np.arange(len(self.labels))).tolist()

    def report(self, texts: list[str], dropped: int = 0) -> dict:
        """What the manifest and the asset's metadata show: how many clusters, the rows in them, a few examples."""
        clusters = self.clusters()
        return {
            "clusters": len(clusters),
            "rows_in_clusters": sum(len(c) for c in clusters),
            "largest": len(clusters[0]) if clusters else 0,
            "dropped": dropped,
            "examples": [[_short(texts[i]) for i in c[:EXAMPLE_ROWS]] for c in clusters[:EXAMPLES]],
            "seconds": round(self.seconds, 3),
            "threshold": self.settings.threshold,
            "ngram": self.settings.ngram,
            "num_perm": self.settings.num_perm,
        }


def _short(text: str) -> str:
    return text if len(text) <= EXAMPLE_CHARS else text[: EXAMPLE_CHARS - 1] + "…"


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's finalizer, as datasketch's affine32 scheme mixes each hash before its permutations."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def word_ids(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every text's words, lower-cased, split at anything but letters, digits and '_' (pyarrow's vectorised
    string kernels): (each word's index in the vocabulary, concatenated; each vocabulary word's crc32; the number
    of words of each text)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lists = pc.split_pattern_regex(pc.utf8_lower(pa.array(texts, pa.large_string())), r"[^\p{L}\p{N}_]+")
    flat, parents = pc.list_flatten(lists), pc.list_parent_indices(lists)
    keep = pc.not_equal(flat, "")  # a text that starts or ends with punctuation splits off an empty word
    encoded = pc.dictionary_encode(pc.filter(flat, keep))
    vocab = encoded.dictionary.to_pylist()
    word_hash = np.fromiter((zlib.crc32(w.encode()) for w in vocab), dtype=np.uint32, count=len(vocab))
    lengths = np.bincount(pc.filter(parents, keep).to_numpy(), minlength=len(texts))
    return encoded.indices.to_numpy(), word_hash, lengths


def shingle_hashes(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every text's n-gram hashes, concatenated (uint32), and where each text's start (len(texts) + 1 offsets).
    An n-gram's hash combines its words' (FNV-style, in numpy), so no n-gram is ever a string; a text shorter
    than n words is one n-gram (of no words: the same for every empty text)."""
    ids, word_hash, lengths = word_ids(texts)
    # each word as its hash, and a last 0 for the n-gram of a text of no words (int32 indices: half the memory)
    word = np.append(word_hash[ids], np.uint32(0))
    del ids
    word_starts = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    counts = np.maximum(lengths - n + 1, 1)
    starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    text_of = np.repeat(np.arange(len(texts), dtype=np.int32), counts)
    offset = (np.arange(int(starts[-1]), dtype=np.int64) - starts[text_of]).astype(np.int32)  # within its text
    first = word_starts[text_of] + offset
    left = lengths[text_of].astype(np.int32) - offset  # words from the n-gram's first to its text's end
    del text_of, offset
    hashed = np.full(len(first), 0x811C9DC5, dtype=np.uint32)
    with np.errstate(over="ignore"):
        for k in range(n):
            inside = left > k  # a short text's one n-gram has fewer than n words
            at = np.where(inside, first + k, len(word) - 1)
            hashed = np.where(inside, (hashed ^ word[at]) * np.uint32(0x01000193), hashed)
    return hashed, starts


def signatures(hashed: np.ndarray, starts: np.ndarray, num_perm: int, seed: int = 1) -> np.ndarray:
    """(rows, num_perm) uint32: each row's MinHash of its n-gram hashes (shingle_hashes), equal to datasketch's
    MinHash(num_perm, seed, hashfunc=int) updated with them, computed for all rows at once (MinHash.bulk updates
    one row at a time: ~25 s at 100,000 short rows). The permutations run over blocks of n-grams small enough
    for the processor's cache."""
    from datasketch import MinHash

    a, b = MinHash(num_perm=num_perm, seed=seed).permutations
    rows = len(starts) - 1
    hashed = _fmix32(hashed)
    out = np.empty((rows, num_perm), dtype=np.uint32)
    buffer = np.empty((num_perm, BLOCK_SHINGLES), dtype=np.uint32)  # a permutation's values side by side
    row = 0
    with np.errstate(over="ignore"):  # the permutations are modulo 2**32: wrapping is the arithmetic meant
        while row < rows:
            end = int(np.searchsorted(starts, starts[row] + BLOCK_SHINGLES, side="right")) - 1
            end = min(max(end, row + 1), rows)
            size = int(starts[end] - starts[row])
            block = buffer[:, :size] if size <= BLOCK_SHINGLES else np.empty((num_perm, size), dtype=np.uint32)
            np.multiply(a[:, None], hashed[None, starts[row] : starts[end]], out=block)
            np.add(block, b[:, None], out=block)
            out[row:end] = np.minimum.reduceat(block, starts[row:end] - starts[row], axis=1).T
            row = end
    return out


def _hashed(texts: list[str], settings: NearDuplicates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """shingle_hashes and signatures of all the texts, made CHUNK_ROWS texts at a time: the words and the
    n-grams' index arrays are transient, and at 100,000 rows they would take ~0.4 GB at once."""
    parts = []
    for at in range(0, len(texts), CHUNK_ROWS):
        hashed, starts = shingle_hashes(texts[at : at + CHUNK_ROWS], settings.ngram)
        parts.append((hashed, starts, signatures(hashed, starts, settings.num_perm)))
    offsets = np.cumsum([0] + [len(h) for h, _, _ in parts])
    starts = np.concatenate([[0]] + [st[1:] + off for (_, st, _), off in zip(parts, offsets, strict=False)])
    return np.concatenate([h for h, _, _ in parts]), starts, np.concatenate([sig for _, _, sig in parts])


def _band_keys(band: np.ndarray) -> np.ndarray:
    """One uint64 per row for its band of signature values (a polynomial hash: equal bands, equal keys; the
    rare unequal bands that collide are candidates the threshold then rejects)."""
    keys = np.zeros(len(band), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in band.T:
            keys = keys * np.uint64(0x100000001B3) + column.astype(np.uint64)
    return keys


def _bucket_pairs(keys: np.ndarray) -> np.ndarray:
    """Pairs of rows that share a band's key: each row with the first of its bucket and with the one before it
    (enough to connect a bucket, without the all-pairs blow-up of a large one)."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    same = ordered[1:] == ordered[:-1]
    if not same.any():
        return np.empty((0, 2), dtype=np.int64)
    run_start = np.concatenate(([True], ~same))
    first = order[np.maximum.accumulate(np.where(run_start, np.arange(len(order)), 0))]
    later = np.flatnonzero(same) + 1
    pairs = np.concatenate([np.stack([first[later], order[later]], 1), np.stack([order[later - 1], order[later]], 1)])
    return pairs[pairs[:, 0] != pairs[:, 1]]


def find(texts: list[str], settings: NearDuplicates | None = None, exact_rows: int | None = None) -> Found:
    """The near-copies among texts: pairs whose n-gram sets' Jaccard similarity is at or above the threshold;
    clusters are the connected near-copies. Up to exact_rows texts (EXACT_ROWS by default), every pair is
    measured exactly; past that, rows sharing a band of their MinHash signatures (MinHashLSH's bands and rows
    for the threshold) are the candidates, and those the estimate cannot decide are measured exactly."""
    settings = settings or NearDuplicates()
    started = time.perf_counter()
    n = len(texts)
    if n < 2:
        pairs = np.empty((0, 2), dtype=np.int64)
    elif n <= (EXACT_ROWS if exact_rows is None else exact_rows):
        hashed, starts = shingle_hashes(texts, settings.ngram)
        pairs = np.stack(np.triu_indices(n, 1), axis=1)
        pairs = pairs[_jaccard(pairs, hashed, starts) >= settings.threshold]
    else:
        pairs = _lsh_pairs(texts, settings)
    return Found(_components(n, pairs), pairs.astype(np.int64), time.perf_counter() - started, settings)


def _lsh_pairs(texts: list[str], settings: NearDuplicates) -> np.ndarray:
    from datasketch import MinHashLSH

    n = len(texts)
    hashed, starts, sigs = _hashed(texts, settings)
    # datasketch's bands and rows for the threshold, weighted to miss few near-copies (at 128 permutations and 0.8:
    # 14 bands of 9, which make a pair at the threshold a candidate 87% of the time, at 0.85 97%, against 40% and
    # 69% with equal weights); the extra candidates cost little, since each is checked
    lsh = MinHashLSH(threshold=settings.threshold, num_perm=settings.num_perm, weights=LSH_WEIGHTS)
    candidates = [_bucket_pairs(_band_keys(sigs[:, start:end])) for start, end in lsh.hashranges]
    pairs = np.sort(np.concatenate(candidates), axis=1)
    codes = _distinct(pairs[:, 0] * n + pairs[:, 1])
    pairs = np.stack([codes // n, codes % n], axis=1)
    if not len(pairs):
        return pairs
    estimate = np.concatenate(
        [(sigs[p[:, 0]] == sigs[p[:, 1]]).mean(axis=1) for p in np.array_split(pairs, -(-len(pairs) // BLOCK_PAIRS))]
    )
    sure = estimate >= settings.threshold + SURE_MARGIN
    unsure = ~sure & (estimate >= settings.threshold - SURE_MARGIN)
    exact = np.zeros(len(pairs), dtype=bool)
    exact[unsure] = _jaccard(pairs[unsure], hashed, starts) >= settings.threshold
    return pairs[sure | exact]


def _jaccard(pairs: np.ndarray, hashed: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The exact Jaccard similarity of each pair's n-gram sets. Near the threshold the estimate is not enough
    (+-0.04 at 128 permutations): templated prompts that differ in one slot sit just under it by the hundred, and
    the estimate would let one in ten of them through as near-copies. In numpy: each pair's two sets, tagged
    with the pair, sorted together; an n-gram both hold is two equal neighbours."""
    if not len(pairs):
        return np.empty(0)
    rows = len(starts) - 1
    tagged = _distinct((np.repeat(np.arange(rows, dtype=np.uint64), np.diff(starts)) << np.uint64(32)) | hashed)
    distinct, row_starts = tagged & np.uint64(0xFFFFFFFF), np.searchsorted(tagged >> np.uint64(32), np.arange(rows + 1))
    sizes = np.diff(row_starts)

    def gathered(of: np.ndarray) -> np.ndarray:
        counts = sizes[of]
        pair = np.repeat(np.arange(len(of), dtype=np.uint64), counts)
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        return (pair << np.uint64(32)) | distinct[np.repeat(row_starts[of], counts) + within]

    out = np.empty(len(pairs))
    for at in range(0, len(pairs), BLOCK_PAIRS):
        block = pairs[at : at + BLOCK_PAIRS]
        both = np.sort(np.concatenate([gathered(block[:, 0]), gathered(block[:, 1])]))
        twice = both[1:][both[1:] == both[:-1]]
        shared = np.bincount((twice >> np.uint64(32)).astype(np.int64), minlength=len(block))
        out[at : at + BLOCK_PAIRS] = shared / (sizes[block[:, 0]] + sizes[block[:, 1]] - shared)
    return out


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted (np.unique's hash table is ten times slower on millions of integers)."""
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) else values


def _components(n: int, pairs: np.ndarray) -> np.ndarray:
    """Union-find over the pairs, in numpy: each row's cluster as its cluster's first row. Roots are hooked to the
    smaller of two joined roots and every row then points at its root (pointer jumping), until each pair shares
    one; a row's parent is never above it, so a cluster's root is its first row."""
    parent = np.arange(n)
    if not len(pairs):
        return parent
    i, j = pairs[:, 0], pairs[:, 1]
    while True:
        ri, rj = parent[i], parent[j]
        if (ri == rj).all():
            return parent
        low = np.minimum(ri, rj)
        np.minimum.at(parent, ri, low)
        np.minimum.at(parent, rj, low)
        while True:  # every row straight to its root
            jumped = parent[parent]
            if (jumped == parent).all():
                break
            parent = jumped
