"""Preference pairs from scored groups of sampled answers (online / iterative DPO).

Pure numpy: no models, no I/O; inputs are never written into. A round samples `k`
answers per prompt; the rows of one prompt are `k` consecutive rows (a group).

* `best_worst` (Yuan et al. 2024, Self-Rewarding Language Models; TRL's
  OnlineDPOTrainer is the k = 2 case): one pair per group, the highest-scored answer
  against the lowest-scored one;
* `all_pairs` (the pairwise ranking of RRHF, Yuan et al. 2023, kept to gaps the scorer
  resolves): every ordered pair (i, j) of the group with `score_i - score_j > margin`.

A group whose scores are all equal gives no pair (there is no preference to learn)
and is counted as tied; so is, under `all_pairs`, a group whose largest gap is not
above the margin. Ties inside a group are broken by the first row, so the result is
deterministic. Under `all_pairs`, answers sampled more than once (equal `answer_keys`,
e.g. their token ids) give each pair once, so a frequent answer does not weigh more.

`build_judged_pairs` makes the same two selections from a judge's pairwise verdicts instead of
scores: `P[i, j]`, the judge's probability that answer i is better than answer j (asked in both
orders and averaged, so `P[j, i] = 1 - P[i, j]`), gives the gap `P[i, j] - P[j, i] = 2 P[i, j] - 1`.
"""
from dataclasses import dataclass

import numpy as np

PAIR_SELECTIONS = ("best_worst", "all_pairs")


@dataclass
class PreferencePairs:
    """Row indices of the chosen and rejected answer of every pair, `[P]` int64 each,
    and the counts a round logs."""

    chosen: np.ndarray
    rejected: np.ndarray
    num_groups: int
    tied_groups: int  # groups with all scores equal (or no gap above the margin)
    duplicate_pairs: int = 0  # all_pairs: pairs dropped because the same two answers were paired already

    def __len__(self):
        return int(self.chosen.shape[0])

    @property
    def tied_fraction(self):
        return self.tied_groups / self.num_groups if self.num_groups else 0.0


def group_rows(num_rows, group_size):
    """`[G, k]` row indices of consecutive groups; raises when `num_rows` is not a multiple of k."""
    if group_size < 2:
        raise ValueError(f"pairs need at least 2 answers per prompt, got group_size {group_size}")
    if num_rows % group_size:
        raise ValueError(f"{num_rows} rows do not split into groups of {group_size}")
    return np.arange(num_rows, dtype="int64").reshape(-1, group_size)


def build_pairs(scores, group_size, selection="best_worst", margin=0.0, answer_keys=None):
    """Pairs from `scores` `[N]` (N = groups x `group_size`, a group's rows consecutive).

    `best_worst`: per group, argmax row vs argmin row, kept when max - min > `margin`.
    `all_pairs`: per group, every (i, j) with `scores[i] - scores[j] > margin`, in row order
    of i then j; with `answer_keys` (N hashables, equal for identical answers) only the first
    pair of each (group, chosen answer, rejected answer). `margin` >= 0. Returns `PreferencePairs`.
    """
    if selection not in PAIR_SELECTIONS:
        raise ValueError(f"pair selection must be one of {PAIR_SELECTIONS}, got {selection!r}")
    if margin < 0:
        raise ValueError(f"the pair margin must be >= 0, got {margin}")
    values = np.asarray(scores, dtype="float64").reshape(-1)
    if not np.isfinite(values).all():
        raise ValueError(f"scores must be finite to build pairs, got {values[~np.isfinite(values)][:3].tolist()}")
    rows = group_rows(values.shape[0], group_size)
    grouped = values[rows]  # [G, k]
    if selection == "best_worst":
        best, worst = grouped.argmax(axis=1), grouped.argmin(axis=1)
        keep = grouped.max(axis=1) - grouped.min(axis=1) > margin
        chosen = rows[np.arange(len(rows)), best][keep]
        rejected = rows[np.arange(len(rows)), worst][keep]
        tied = int((~keep).sum())
    else:
        return pairs_above_margin(grouped[:, :, None] - grouped[:, None, :], rows, margin, answer_keys)
    return PreferencePairs(chosen.astype("int64"), rejected.astype("int64"), int(len(rows)), tied)


def pairs_above_margin(gaps, rows, margin, answer_keys=None):
    """`all_pairs` from `gaps` `[G, k, k]` (`gaps[g, i, j]`: how much answer i beats answer j):
    every (i, j) with a gap above `margin`, in row order; duplicates of (group, chosen answer,
    rejected answer) dropped when `answer_keys` are given."""
    g, i, j = np.nonzero(gaps > margin)
    chosen, rejected = rows[g, i], rows[g, j]
    tied, duplicates = int(len(rows) - np.unique(g).shape[0]), 0
    if answer_keys is not None:
        keep = first_occurrences([(int(a), answer_keys[c], answer_keys[r]) for a, c, r in zip(g, chosen, rejected)])
        duplicates = len(chosen) - len(keep)
        chosen, rejected = chosen[keep], rejected[keep]
    return PreferencePairs(chosen.astype("int64"), rejected.astype("int64"), int(len(rows)), tied, duplicates)


def build_judged_pairs(preferences, selection="best_worst", margin=0.0, answer_keys=None):
    """Pairs from a judge's pairwise verdicts `preferences` `[G, k, k]` (`P[g, i, j]`: P(answer i of
    group g is better than answer j), with `P[j, i] = 1 - P[i, j]` and 1/2 on the diagonal); the
    group's rows are `g k .. g k + k - 1`.

    `best_worst`: each answer's mean win probability against the group's other answers (a Borda
    count of the verdicts) picks the best and the worst answer; of these two, the chosen one is
    the one the judge prefers in their own comparison, kept when `|2 P - 1| > margin`.
    `all_pairs`: every (i, j) with `2 P[i, j] - 1 > margin`. Returns `PreferencePairs`."""
    if selection not in PAIR_SELECTIONS:
        raise ValueError(f"pair selection must be one of {PAIR_SELECTIONS}, got {selection!r}")
    if margin < 0:
        raise ValueError(f"the pair margin must be >= 0, got {margin}")
    prefs = np.asarray(preferences, dtype="float64")
    if prefs.ndim != 3 or prefs.shape[1] != prefs.shape[2] or prefs.shape[1] < 2:
        raise ValueError(f"preferences must be [groups, k, k] with k >= 2, got shape {prefs.shape}")
    if not np.isfinite(prefs).all():
        raise ValueError("the judge's preferences must be finite to build pairs")
    k = prefs.shape[1]
    rows = group_rows(prefs.shape[0] * k, k)
    gaps = 2.0 * prefs - 1.0  # P[i, j] - P[j, i]
    if selection == "all_pairs":
        return pairs_above_margin(gaps, rows, margin, answer_keys)
    wins = (prefs.sum(axis=2) - 0.5) / (k - 1)  # [G, k] mean win probability against the others
    best, worst = wins.argmax(axis=1), wins.argmin(axis=1)
    groups = np.arange(len(rows))
    best_first = gaps[groups, best, worst] >= 0
    first, second = np.where(best_first, best, worst), np.where(best_first, worst, best)
    keep = np.abs(gaps[groups, best, worst]) > margin
    return PreferencePairs(rows[groups, first][keep].astype("int64"), rows[groups, second][keep].astype("int64"),
                           int(len(rows)), int((~keep).sum()))


def first_occurrences(keys):
    """Indices `[M]` int64 of the first occurrence of each distinct key in `keys`, in order."""
    seen, keep = set(), []
    for index, key in enumerate(keys):
        if key not in seen:
            seen.add(key)
            keep.append(index)
    return np.asarray(keep, dtype="int64")


def pair_batches(num_pairs, pairs_per_micro_batch, accumulation_steps, seed):
    """A shuffled plan of optimiser steps: a list of steps, each a list of micro-batches, each
    a list of pair indices (`pairs_per_micro_batch` at most; the last ones may be shorter)."""
    order = np.random.RandomState(seed).permutation(num_pairs)
    micro = [order[s : s + pairs_per_micro_batch].tolist() for s in range(0, num_pairs, pairs_per_micro_batch)]
    return [micro[s : s + accumulation_steps] for s in range(0, len(micro), accumulation_steps)]
