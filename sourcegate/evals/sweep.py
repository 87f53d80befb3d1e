"""The sweep's mathematics: pure functions over score arrays and their labels.

Convention throughout: a higher score means "more answerable", and a question is
answered when score >= threshold. Labels are "answer" / "decline" (or a boolean mask,
True = should-answer). Everything here is exact; sourcegate/evals/calibration.py assembles these
numbers, with verdicts in words and downsampled curves, into calibration.json.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from scipy.stats import mannwhitneyu

ANSWER, DECLINE = "answer", "decline"


def is_answer_mask(labels: Iterable) -> np.ndarray:
    """Boolean mask from 'answer'/'decline' labels (booleans pass through)."""
    arr = np.asarray(list(labels) if not isinstance(labels, np.ndarray) else labels)
    if arr.dtype == bool:
        return arr
    if arr.size == 0:
        return np.zeros(0, dtype=bool)
    bad = ~np.isin(arr, (ANSWER, DECLINE))
    if bad.any():
        raise ValueError(f"labels must be 'answer' or 'decline', got {sorted(set(arr[bad].tolist()))[:5]}")
    return arr == ANSWER


def split_by_label(scores: Sequence[float], labels: Iterable) -> tuple[np.ndarray, np.ndarray]:
    """Sorted should-answer and should-decline scores."""
    s = np.asarray(scores, dtype=float)
    is_answer = is_answer_mask(labels)
    if s.shape != is_answer.shape:
        raise ValueError(f"{s.shape[0]} scores but {is_answer.shape[0]} labels")
    if not np.isfinite(s).all():
        raise ValueError("scores must be finite; leave out questions without a score")
    return np.sort(s[is_answer]), np.sort(s[~is_answer])


def ids_by_label(scores: Sequence[float], labels: Iterable, ids: Sequence[str] | None) -> tuple[np.ndarray, np.ndarray]:
    """Question ids in the order `split_by_label` sorts the scores (positions when no ids are given)."""
    s = np.asarray(scores, dtype=float)
    is_answer = is_answer_mask(labels)
    names = np.asarray([str(i) for i in ids] if ids is not None else [f"#{i}" for i in range(len(s))], dtype=object)
    if names.shape != s.shape:
        raise ValueError(f"{s.shape[0]} scores but {names.shape[0]} ids")
    return (
        names[is_answer][np.argsort(s[is_answer], kind="stable")],
        names[~is_answer][np.argsort(s[~is_answer], kind="stable")],
    )


def fraction(count: np.ndarray | int, n: int) -> np.ndarray | float:
    return np.asarray(count, dtype=float) / n if n else np.full(np.shape(count), np.nan)


def sweep_arrays(answer: np.ndarray, decline: np.ndarray) -> dict[str, np.ndarray]:
    """Exact sweep over every distinct score (inputs sorted)."""
    thresholds = np.unique(np.concatenate([answer, decline]))
    # searchsorted 'left' counts scores strictly below the threshold: declined ones.
    kept = 1.0 - fraction(np.searchsorted(answer, thresholds, "left"), len(answer))
    declined = fraction(np.searchsorted(decline, thresholds, "left"), len(decline))
    return {"thresholds": thresholds, "kept": kept, "declined": declined, "false_decline_rate": 1.0 - kept}


def sweep(scores: Sequence[float], labels: Iterable) -> dict[str, list[float]]:
    """Exact threshold sweep for one signal.

    At every distinct score t (ascending): `kept` = share of should-answer with
    score >= t, `declined` = share of should-decline with score < t,
    `false_decline_rate` = 1 - kept.
    """
    return {k: v.tolist() for k, v in sweep_arrays(*split_by_label(scores, labels)).items()}


def roc_auc(answer: np.ndarray, decline: np.ndarray) -> float:
    """ROC AUC: P(answer > decline) + 0.5 P(tie), the Mann-Whitney U over n_answer x n_decline (NaN when a
    side is empty). The one AUC of the project (the combiner's cross-validation uses it too)."""
    if not len(answer) or not len(decline):
        return math.nan
    u = mannwhitneyu(answer, decline, alternative="two-sided", method="asymptotic").statistic
    return float(u / (len(answer) * len(decline)))


# No bootstrap interval for the gap: resampling can only raise a minimum and lower a
# maximum, so every resampled gap is >= the observed one and its "interval" could never
# show a fragile gap (the bootstrap of an extreme order statistic is inconsistent). The
# statements below are exact for any n instead.


def needed_for(coverage: float, confidence: float) -> int:
    """Should-answer questions, all kept, needed to claim a keep rate >= coverage at `confidence` by the check
    figure: the lower end of the exact (Clopper-Pearson) two-sided interval at `confidence`, which for n kept of n
    is (alpha/2)**(1/n), alpha = 1 - confidence. It reaches `coverage` once n >= log(alpha/2) / log(coverage)
    (368 for 99% at 95%; a one-sided bound would need 299, and the check figure at 299 would fall short).
    """
    if not (0 < coverage < 1 and 0 < confidence < 1):
        raise ValueError("coverage and confidence must lie strictly between 0 and 1")
    n = math.log((1.0 - confidence) / 2) / math.log(coverage)
    return max(1, math.ceil(n - 1e-9))  # 1e-9: an exact integer quotient needs no extra question


def promise(n_answer: int, n_decline: int, coverage: float = 0.99, confidence: float = 0.95) -> dict[str, Any]:
    """What the bands promise about a new question of the same kinds, by exchangeability alone.

    A new should-answer question is as likely to be any of the n + 1 positions in the sorted
    scores, so a threshold at or below the lowest of n keeps it with probability >= n/(n+1);
    likewise a new should-decline question scores at or below the highest of m with
    probability >= m/(m+1). Nothing here says how wide the margin is.
    """
    return {
        "keep_new_answer": n_answer / (n_answer + 1) if n_answer else None,
        "decline_new_decline": n_decline / (n_decline + 1) if n_decline else None,
        "coverage": coverage,
        "confidence": confidence,
        "n_needed": needed_for(coverage, confidence),
        "n_answer": n_answer,
    }


def _ids_at(ids: np.ndarray, scores: np.ndarray, value: float) -> list[str]:
    return sorted(str(i) for i in ids[scores == value])


def fragility(
    answer: np.ndarray, decline: np.ndarray, answer_ids: np.ndarray, decline_ids: np.ndarray, ks=(1, 2, 3)
) -> dict[str, Any]:
    """How much the gap rests on single questions. Inputs sorted by score (ids aligned).

    - `gap_without`: the gap after removing the k lowest should-answer and the k highest
      should-decline questions (None when a side has no more than k);
    - `deciding`: the questions at the gap's edges (lowest should-answer, highest should-decline);
    - with a gap, `to_close`: how many questions must be relabelled (or move across) to close it:
      any one question past the other band's edge does, so it is 1 whenever it is not 0;
      without one, `to_open`: the fewest questions whose removal opens a gap, and `opening`
      their ids (at the best cut; removing them or relabelling them opens it);
    - `one_question`: the verdict turns on one question: no gap but one removal opens it, or a
      gap of which one question per side takes more than half (the gap without it is > 2x).
    """
    gap = float(answer[0] - decline[-1])
    gap_without = {
        str(k): float(answer[k] - decline[-1 - k]) if len(answer) > k and len(decline) > k else None for k in ks
    }
    deciding = {
        ANSWER: _ids_at(answer_ids, answer, answer[0]),
        DECLINE: _ids_at(decline_ids, decline, decline[-1]),
    }
    if gap > 0:
        wider = gap_without[str(ks[0])]
        one = wider is not None and wider > 2 * gap
        return {
            "gap": gap,
            "gap_without": gap_without,
            "deciding": deciding,
            "to_close": 1,
            "to_open": 0,
            "opening": [],
            "one_question": bool(one),
        }
    # Fewest removals: at each cut t, should-answer scores < t plus should-decline scores >= t.
    # Cuts that leave both sides non-empty; without one, only dropping a whole side "opens" it.
    cuts = np.unique(np.concatenate([answer, decline]))
    answer_removed = np.searchsorted(answer, cuts, "left")
    decline_kept = np.searchsorted(decline, cuts, "left")
    valid = (answer_removed < len(answer)) & (decline_kept > 0)
    result = {"gap": gap, "gap_without": gap_without, "deciding": deciding, "to_close": 0}
    if not valid.any():
        return {**result, "to_open": None, "opening": [], "one_question": False}
    errors = np.where(valid, answer_removed + len(decline) - decline_kept, np.iinfo(np.int64).max)
    best = int(np.argmin(errors))
    t = cuts[best]
    opening = sorted(str(i) for i in answer_ids[answer < t]) + sorted(str(i) for i in decline_ids[decline >= t])
    return {**result, "to_open": int(errors[best]), "opening": opening, "one_question": bool(errors[best] == 1)}


def count_at_least(x: np.ndarray, y: np.ndarray, gx: np.ndarray, gy: np.ndarray) -> np.ndarray:
    """counts[i, j] = number of points with x >= gx[i] and y >= gy[j] (grids ascending)."""
    ix = np.searchsorted(gx, x, "right") - 1  # highest grid line at or below x
    iy = np.searchsorted(gy, y, "right") - 1
    ok = (ix >= 0) & (iy >= 0)
    cells = np.bincount(ix[ok] * len(gy) + iy[ok], minlength=len(gx) * len(gy))
    cells = cells.reshape(len(gx), len(gy))
    # Suffix sums in both directions turn cell counts into "at least" counts.
    return cells[::-1, ::-1].cumsum(0).cumsum(1)[::-1, ::-1]


def grid_sweep(x: np.ndarray, y: np.ndarray, is_answer: np.ndarray, size: int) -> dict[str, Any]:
    """Coverage and decline recall on a grid of thresholds at quantiles of each signal."""
    q = np.linspace(0.0, 1.0, size)
    gx, gy = np.unique(np.quantile(x, q)), np.unique(np.quantile(y, q))
    kept_answer = count_at_least(x[is_answer], y[is_answer], gx, gy)
    kept_decline = count_at_least(x[~is_answer], y[~is_answer], gx, gy)
    return {
        "x_thresholds": gx,
        "y_thresholds": gy,
        "coverage": fraction(kept_answer, int(is_answer.sum())),
        "decline_recall": 1.0 - fraction(kept_decline, int((~is_answer).sum())),
    }


def pair_full_coverage(x: np.ndarray, y: np.ndarray, is_answer: np.ndarray) -> tuple[float, float, float, tuple]:
    """The best "x >= a and y >= b" that keeps every should-answer question, and what it declines.

    Raising either threshold can only decline more, so it is exactly a = min x, b = min y over
    should-answer. Returns a, b, the share of should-decline it declines, and that share for each
    signal alone (x < a, y < b).
    """
    a, b = x[is_answer].min(), y[is_answer].min()
    dx, dy = x[~is_answer], y[~is_answer]
    return a, b, float(((dx < a) | (dy < b)).mean()), (float((dx < a).mean()), float((dy < b).mean()))
