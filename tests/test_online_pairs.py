"""Pair building of online DPO (dpo/online_pairs.py): best vs worst, all pairs above a
margin, ties, duplicate answers, and the shuffled plan of optimiser steps; hand-worked
cases, no models."""
import numpy as np
import pytest

from dpo.online_pairs import build_pairs, first_occurrences, group_rows, pair_batches


def test_best_worst_takes_argmax_and_argmin_of_each_group():
    # group 0 rows 0-2: best row 1 (0.9), worst row 2 (-1); group 1 rows 3-5: best row 5, worst row 4
    scores = [0.2, 0.9, -1.0, 0.0, -0.5, 3.0]
    pairs = build_pairs(scores, 3)
    assert pairs.chosen.tolist() == [1, 5] and pairs.rejected.tolist() == [2, 4]
    assert pairs.num_groups == 2 and pairs.tied_groups == 0 and len(pairs) == 2


def test_groups_whose_scores_are_all_equal_are_skipped_and_counted():
    scores = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5]  # groups of 2: tied, (row 3 > row 2), tied, tied
    pairs = build_pairs(scores, 2)
    assert pairs.chosen.tolist() == [3] and pairs.rejected.tolist() == [2]
    assert pairs.tied_groups == 3 and pairs.tied_fraction == pytest.approx(0.75)


def test_best_worst_tie_breaks_by_first_row():
    pairs = build_pairs([1.0, 0.0, 1.0, 0.0], 4)
    assert pairs.chosen.tolist() == [0] and pairs.rejected.tolist() == [1]


def test_margin_drops_small_gaps_in_best_worst():
    scores = [0.0, 0.4, 0.0, 0.6]  # gaps 0.4 and 0.6
    pairs = build_pairs(scores, 2, margin=0.5)
    assert pairs.chosen.tolist() == [3] and pairs.rejected.tolist() == [2]
    assert pairs.tied_groups == 1  # a gap not above the margin counts as tied


def test_all_pairs_lists_every_ordered_pair_above_the_margin():
    # one group, scores 3, 1, 2: pairs with gap > 0.5: (0 > 1) gap 2, (0 > 2) gap 1, (2 > 1) gap 1
    pairs = build_pairs([3.0, 1.0, 2.0], 3, selection="all_pairs", margin=0.5)
    assert list(zip(pairs.chosen.tolist(), pairs.rejected.tolist())) == [(0, 1), (0, 2), (2, 1)]
    strict = build_pairs([3.0, 1.0, 2.0], 3, selection="all_pairs", margin=1.0)  # gaps must EXCEED the margin
    assert list(zip(strict.chosen.tolist(), strict.rejected.tolist())) == [(0, 1)]


def test_all_pairs_counts_groups_without_any_pair_as_tied():
    scores = [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]  # group 0 tied, group 1: rows 3 and 5 beat row 4
    pairs = build_pairs(scores, 3, selection="all_pairs")
    assert list(zip(pairs.chosen.tolist(), pairs.rejected.tolist())) == [(3, 4), (5, 4)]
    assert pairs.tied_groups == 1 and pairs.num_groups == 2


def test_all_pairs_keeps_one_pair_per_distinct_answer_pair():
    # rows 0 and 1 are the same correct answer "a", rows 2 and 3 the same wrong answer "b"
    scores = [1.0, 1.0, 0.0, 0.0]
    keys = ["a", "a", "b", "b"]
    pairs = build_pairs(scores, 4, selection="all_pairs", answer_keys=keys)
    assert list(zip(pairs.chosen.tolist(), pairs.rejected.tolist())) == [(0, 2)]
    assert pairs.duplicate_pairs == 3
    without = build_pairs(scores, 4, selection="all_pairs")
    assert len(without) == 4 and without.duplicate_pairs == 0


def test_the_same_answers_in_two_groups_are_two_pairs():
    pairs = build_pairs([1.0, 0.0, 1.0, 0.0], 2, selection="all_pairs", answer_keys=["a", "b", "a", "b"])
    assert pairs.chosen.tolist() == [0, 2] and pairs.duplicate_pairs == 0


def test_vectorised_all_pairs_equals_a_loop():
    rng = np.random.RandomState(0)
    scores = rng.randint(0, 3, size=40).astype("float64")
    pairs = build_pairs(scores, 8, selection="all_pairs", margin=0.5)
    expected = [(g * 8 + i, g * 8 + j) for g in range(5) for i in range(8) for j in range(8)
                if scores[g * 8 + i] - scores[g * 8 + j] > 0.5]
    assert list(zip(pairs.chosen.tolist(), pairs.rejected.tolist())) == expected


def test_inputs_are_not_written_into():
    scores = np.array([0.0, 1.0, 2.0, 2.0])
    keys = ["x", "y", "z", "z"]
    build_pairs(scores, 2, selection="all_pairs", answer_keys=keys)
    assert scores.tolist() == [0.0, 1.0, 2.0, 2.0] and keys == ["x", "y", "z", "z"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(scores=[0.0, 1.0, 2.0], group_size=2), "do not split into groups of 2"),
        (dict(scores=[0.0, 1.0], group_size=1), "at least 2 answers"),
        (dict(scores=[0.0, 1.0], group_size=2, selection="listwise"), "pair selection must be one of"),
        (dict(scores=[0.0, 1.0], group_size=2, margin=-0.1), "margin must be >= 0"),
        (dict(scores=[0.0, float("nan")], group_size=2), "scores must be finite"),
    ],
)
def test_bad_input_is_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_pairs(**kwargs)


def test_group_rows_and_first_occurrences():
    assert group_rows(6, 3).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert first_occurrences(["b", "a", "b", "c", "a"]).tolist() == [0, 1, 3]
    assert first_occurrences([]).tolist() == []


def test_pair_batches_cover_every_pair_once_in_steps_of_micro_batches():
    plan = pair_batches(10, 3, 2, seed=7)
    assert [[len(mb) for mb in step] for step in plan] == [[3, 3], [3, 1]]
    flat = [p for step in plan for mb in step for p in mb]
    assert sorted(flat) == list(range(10))
    assert pair_batches(10, 3, 2, seed=7) == plan  # seeded: a resumed run draws the same plan
    assert pair_batches(10, 3, 2, seed=8) != plan
