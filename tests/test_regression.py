"""evals.regression: the exact one-sided McNemar p-value and the paired comparison."""

import pytest
from scipy.stats import binomtest  # installed with sentence-transformers

from sourcegate.evals.regression import binomial_tail, compare, paired


def test_binomial_tail_hand_values():
    assert binomial_tail(0, 0) == 1.0
    assert binomial_tail(5, 5) == 1 / 32
    assert binomial_tail(4, 8) == pytest.approx(163 / 256)  # (70 + 56 + 28 + 8 + 1) / 256
    assert binomial_tail(7, 10) == pytest.approx(176 / 1024)  # (120 + 45 + 10 + 1) / 1024
    with pytest.raises(ValueError):
        binomial_tail(3, 2)


@pytest.mark.parametrize("discordant", [1, 2, 5, 9, 20, 41])
def test_binomial_tail_matches_scipy(discordant):
    for losses in range(discordant + 1):
        expected = binomtest(losses, discordant, 0.5, alternative="greater").pvalue
        assert binomial_tail(losses, discordant) == pytest.approx(expected, rel=1e-12)


def outcomes(values, kind="k"):
    return {f"q{i}": {"kind": kind, "ok": v} for i, v in enumerate(values)}


def test_paired_counts_flips_and_lists_new_and_missing():
    base = outcomes([True, True, False, False, True])
    cur = outcomes([True, False, True, False])
    cur["q9"] = {"kind": "k", "ok": True}
    r = paired(base, cur, "ok")
    assert r["wins"] == ["q2"] and r["losses"] == ["q1"] and r["unchanged"] == 2 and r["n"] == 4
    assert r["new"] == ["q9"] and r["missing"] == ["q4"]


def test_compare_fails_on_significant_losses_only():
    base = outcomes([True] * 6 + [False] * 4)
    cur = outcomes([False] * 5 + [True] * 5)  # 5 lost, 4 won: p = P(X >= 5 | 9) = 0.5
    r = compare(base, cur, "ok", alpha=0.05, max_losses=10, min_kind_questions=1)
    assert r["overall"]["p_value"] == pytest.approx(0.5) and r["failed"] is False
    assert compare(base, cur, "ok", alpha=0.05, max_losses=4, min_kind_questions=1)["failed"] is True


def test_a_comparison_that_matched_no_baseline_question_fails_rather_than_pass_unread():
    """60 precision questions renamed: nothing is compared, and a check that compared nothing does not pass."""
    from sourcegate.evals.regression import describe

    base = outcomes([True] * 60)
    renamed = {f"new-{q}": row for q, row in base.items()}
    r = compare(base, renamed, "ok", alpha=0.05, max_losses=3, min_kind_questions=10)
    assert r["overall"]["n"] == 0 and r["overall"]["too_few"] and r["failed"] is True
    assert "none of the baseline's 60 questions matched by id" in describe(r, "hit@1")
    one = {**renamed, "q0": base["q0"]}  # a set sharing any question compares those (a tiny fixture's set)
    assert compare(base, one, "ok", alpha=0.05, max_losses=3, min_kind_questions=10)["failed"] is False
    assert compare({}, renamed, "ok", alpha=0.05, max_losses=3, min_kind_questions=10)["failed"] is False


def test_calibrates_own_questions_are_not_compared_with_the_precision_baseline():
    """`calibrate --questions FIT` evaluates precision on the fit set: the baseline's outcomes are of the precision
    set, so nothing pairs, and that is said rather than failed (a night's renamed set still fails)."""
    from sourcegate.evals.gate import check_precision_regression

    baseline = {"questions": {"precision": {"p1": {"kind": "section", "reranked_rank": 1}}, "decline": {}}}
    mine = {"per_question": {"f1": {"kind": "single", "reranked_rank": 1}}}
    assert check_precision_regression(mine, baseline)["passed"] is False  # a night: nothing compared
    calibrated = check_precision_regression({**mine, "set": "other"}, baseline)
    assert calibrated["passed"] is True and calibrated["detail"].startswith("Not compared: the precision questions")
