"""sourcegate.evals.sweep: the sweep's mathematics over score arrays, hand-computed (test_calibration covers the artifact)."""

import itertools

import numpy as np
import pytest

from sourcegate.evals.sweep import (
    count_at_least,
    fragility,
    ids_by_label,
    is_answer_mask,
    needed_for,
    pair_full_coverage,
    roc_auc,
    split_by_label,
    sweep,
)

A, D = "answer", "decline"


def labelled(answer, decline):
    return list(answer) + list(decline), [A] * len(answer) + [D] * len(decline)


def test_sweep_is_exact_at_every_distinct_score():
    scores, labels = labelled([0.2, 0.5, 0.8], [0.1, 0.5, 0.6])
    s = sweep(scores, labels)
    assert s["thresholds"] == [0.1, 0.2, 0.5, 0.6, 0.8]
    assert s["kept"] == pytest.approx([1, 1, 2 / 3, 1 / 3, 1 / 3])
    assert s["declined"] == pytest.approx([0, 1 / 3, 1 / 3, 2 / 3, 1])
    assert s["false_decline_rate"] == pytest.approx([0, 0, 1 / 3, 2 / 3, 2 / 3])


def test_needed_for_coverage_hand_computed():
    # the check figure is the two-sided exact interval's lower end, (alpha/2)**(1/n) for n of n kept:
    # 0.99**367 = 0.02503 > 0.025, 0.99**368 = 0.02478 <= 0.025
    assert needed_for(0.99, 0.95) == 368
    assert needed_for(0.95, 0.95) == 72  # log 0.025 / log 0.95 = 71.9
    assert needed_for(0.5, 0.75) == 3  # exactly 3 (log 0.125 / log 0.5): no extra question for an integer quotient
    from sourcegate.evals.placement import exact_lower_bound

    for coverage, confidence in ((0.99, 0.95), (0.95, 0.95), (0.9, 0.8)):  # the n it names reaches the check figure
        n = needed_for(coverage, confidence)
        assert exact_lower_bound(n, n, confidence) >= coverage > exact_lower_bound(n - 1, n - 1, confidence)
    with pytest.raises(ValueError):
        needed_for(1.0, 0.95)


def test_labels_become_a_mask_and_anything_else_is_an_error():
    assert is_answer_mask([A, D, A]).tolist() == [True, False, True]
    assert is_answer_mask(np.array([True, False])).tolist() == [True, False]
    with pytest.raises(ValueError, match="maybe"):
        is_answer_mask([A, "maybe"])
    with pytest.raises(ValueError, match="finite"):
        split_by_label([0.1, float("nan")], [A, D])
    with pytest.raises(ValueError, match="2 scores but 3 labels"):
        split_by_label([0.1, 0.2], [A, D, A])


def test_split_sorts_each_label_and_ids_follow_their_scores():
    scores, labels = [0.9, 0.1, 0.5, 0.3], [A, D, A, D]
    answer, decline = split_by_label(scores, labels)
    answer_ids, decline_ids = ids_by_label(scores, labels, ["a9", "d1", "a5", "d3"])
    assert answer.tolist() == [0.5, 0.9] and decline.tolist() == [0.1, 0.3]
    assert answer_ids.tolist() == ["a5", "a9"] and decline_ids.tolist() == ["d1", "d3"]
    assert ids_by_label(scores, labels, None)[0].tolist() == ["#2", "#0"]


def test_auc_is_mann_whitney_with_half_credit_for_ties():
    # pairs (answer > decline): 0.5>0.1, 0.5=0.5 (half), 0.5<0.6, 0.8 beats all three: (1 + 0.5 + 3) / 6
    answer, decline = np.array([0.5, 0.8]), np.array([0.1, 0.5, 0.6])
    assert roc_auc(answer, decline) == pytest.approx(4.5 / 6)
    assert roc_auc(np.array([0.9]), np.array([0.1])) == 1.0 and roc_auc(np.array([0.1]), np.array([0.9])) == 0.0
    assert np.isnan(roc_auc(np.array([]), np.array([0.1])))


def test_fragility_without_a_gap_finds_the_fewest_removals():
    answer, decline = np.array([0.5, 0.7, 0.9]), np.array([0.1, 0.2, 0.8])
    f = fragility(answer, decline, np.array(["a1", "a2", "a3"]), np.array(["d1", "d2", "d-odd"]))
    assert f["gap"] == pytest.approx(-0.3) and f["to_close"] == 0
    assert f["to_open"] == 1 and f["opening"] == ["d-odd"] and f["one_question"] is True
    assert f["deciding"] == {A: ["a1"], D: ["d-odd"]}


def test_count_at_least_matches_brute_force():
    rng = np.random.default_rng(1)
    x, y = rng.uniform(size=60), rng.uniform(size=60)
    gx, gy = np.sort(rng.uniform(size=7)), np.sort(rng.uniform(size=5))
    counts = count_at_least(x, y, gx, gy)
    for i, j in itertools.product(range(len(gx)), range(len(gy))):
        assert counts[i, j] == int(((x >= gx[i]) & (y >= gy[j])).sum())


def test_pair_full_coverage_is_the_minimum_of_each_signal_over_should_answer():
    x = np.array([0.4, 0.6, 0.5, 0.1, 0.7])
    y = np.array([0.3, 0.2, 0.9, 0.9, 0.1])
    is_answer = np.array([True, True, False, False, False])
    a, b, recall, single = pair_full_coverage(x, y, is_answer)
    # declines x < 0.4 or y < 0.2: the should-decline (0.1, 0.9) and (0.7, 0.1), not (0.5, 0.9)
    assert (a, b) == (0.4, 0.2) and recall == pytest.approx(2 / 3) and single == pytest.approx((1 / 3, 1 / 3))
