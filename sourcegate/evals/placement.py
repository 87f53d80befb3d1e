"""Where a threshold goes in a gap, and what that placement keeps of questions it never saw.

Pure functions over score arrays (higher = more answerable; answered when score >= threshold):
- `place`: the placement rules. `tightest` is the lowest should-answer score; `midpoint` the
  middle of the gap on the linear scale; `logit_midpoint` the middle on the logit scale, for
  probabilities whose gap spans orders of magnitude (0.0019-0.2567 splits at 0.14 linearly,
  at 0.022 on the logit scale). Without a gap every rule is the tightest.
  `margin_logit` keeps every rule's threshold at least that far below the lowest should-answer
  score (on the logit scale for a probability), so a score that moves by less between workers
  (threads, CPU kernels: docs/benchmarks/24-score-spread.md) never flips a kept question.
- `cross_fitted`: each fold's threshold placed without that fold, by the same rule; what it
  keeps and declines of the fold. Folds are deterministic (round-robin per label, in input order).
- `exact_lower_bound`: the Clopper-Pearson lower end of a kept share (scipy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import binomtest

RULES = ("tightest", "midpoint", "logit_midpoint")


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def below_by(score: float, margin_logit: float) -> float:
    """`score` lowered by `margin_logit`: on the logit scale when it is strictly inside (0, 1) (a
    probability, where a fixed linear step would be vast near 0 and nothing near 0.5), else on its own scale."""
    if margin_logit < 0 or not math.isfinite(margin_logit):
        raise ValueError(f"margin_logit must be a finite number >= 0, got {margin_logit!r}")
    if not margin_logit:
        return score
    if 0.0 < score < 1.0:
        return _sigmoid(_logit(score) - margin_logit)
    return score - margin_logit


def place(answer: Sequence[float], decline: Sequence[float], rule: str, margin_logit: float = 0.0) -> float:
    """The threshold `rule` places between should-answer and should-decline scores, at least
    `margin_logit` below the lowest should-answer score (`below_by`).

    `logit_midpoint` needs both gap edges strictly inside (0, 1) (a probability); otherwise it is
    the linear midpoint, which is what a logit of a non-probability would have to fall back to.
    The margin may put the threshold at or below the highest should-decline score: a gap narrower
    than the margin is a gap the workers' spread can close, which the gate's threshold_in_gap then says.
    """
    if rule not in RULES:
        raise ValueError(f"placement must be one of {', '.join(RULES)}, got {rule!r}")
    if not len(answer):
        raise ValueError("no should-answer scores to place a threshold on")
    low_answer = float(np.min(answer))
    highest = below_by(low_answer, margin_logit)
    if rule == "tightest" or not len(decline) or low_answer <= float(np.max(decline)):
        return highest
    high_decline = float(np.max(decline))
    if rule == "logit_midpoint" and high_decline > 0.0 and low_answer < 1.0:
        mid = (_logit(low_answer) + _logit(high_decline)) / 2.0
        return min(1.0 / (1.0 + math.exp(-mid)), highest)
    return min((low_answer + high_decline) / 2.0, highest)


def folds_of(is_answer: Sequence[bool], k: int) -> np.ndarray:
    """Fold number per question: round-robin within each label, in input order (stratified, deterministic)."""
    mask = np.asarray(is_answer, dtype=bool)
    fold = np.empty(len(mask), dtype=np.int64)
    for label in (True, False):
        where = np.flatnonzero(mask == label)
        fold[where] = np.arange(len(where)) % k
    return fold


def cross_fitted(
    scores: Sequence[float], is_answer: Sequence[bool], rule: str, k: int = 5, margin_logit: float = 0.0
) -> dict[str, Any]:
    """Coverage and decline recall of `rule` on questions its threshold did not see.

    Each fold's questions are judged by the threshold placed on the other k - 1 folds.
    """
    s, mask = np.asarray(scores, dtype=float), np.asarray(is_answer, dtype=bool)
    if s.shape != mask.shape:
        raise ValueError(f"{len(s)} scores but {len(mask)} labels")
    if k < 2 or mask.sum() < k:
        raise ValueError(f"cross-fitting needs k >= 2 and at least k should-answer questions (k={k}, n={mask.sum()})")
    fold = folds_of(mask, k)
    kept = declined = 0
    missed: list[int] = []
    thresholds = []
    for f in range(k):
        train, test = fold != f, fold == f
        t = place(s[train & mask], s[train & ~mask], rule, margin_logit)
        thresholds.append(t)
        kept += int((s[test & mask] >= t).sum())
        declined += int((s[test & ~mask] < t).sum())
        missed += np.flatnonzero(test & mask & (s < t)).tolist()
    n_answer, n_decline = int(mask.sum()), int((~mask).sum())
    return {
        "rule": rule,
        "folds": k,
        "kept": kept,
        "n_answer": n_answer,
        "coverage": kept / n_answer,
        "declined": declined,
        "n_decline": n_decline,
        "decline_recall": declined / n_decline if n_decline else None,
        "thresholds": thresholds,
        "missed": sorted(missed),  # positions of the should-answer questions a fold's threshold declined
    }


def exact_lower_bound(kept: int, n: int, confidence: float) -> float | None:
    """Lower end of the exact (Clopper-Pearson) two-sided interval for a kept share of kept/n."""
    if not n:
        return None
    return float(binomtest(kept, n).proportion_ci(confidence_level=confidence, method="exact").low)
