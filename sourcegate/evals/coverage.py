"""The coverage promise: three figures, each with what it assumes, and the lowest as the headline.

- in-sample: n/(n+1) over the fit set's should-answer questions (sourcegate/evals/sweep.promise); holds only
  for new questions exchangeable with the fit set's.
- cross-fitted: the placement rule's threshold placed without each fold of the fit set, judged on
  that fold (sourcegate/evals/placement.cross_fitted); still the fit set's kind of questions.
- check: the check set's kept share at the shipped threshold, with its exact (Clopper-Pearson)
  lower bound; questions that chose nothing, and so the nearest to what users will ask (a check
  question that asks a fit question again placed the threshold in its other wording: left out).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sourcegate.evals.placement import exact_lower_bound

ASSUMES = {
    "in_sample": "new should-answer questions are like the fit set's (exchangeable with the questions "
    "that placed the threshold)",
    "cross_fitted": "new should-answer questions are like the fit set's; the rule, not one threshold, "
    "is judged on questions it did not see",
    "check": "new should-answer questions are like the check set's, which never chose anything (its questions "
    "that ask a fit question again left out)",
}


# What each figure claims: two are bounds, the cross-fitted one a share observed (an estimate: no confidence)
CLAIMS = {
    "in_sample": "with probability >=",
    "cross_fitted": "at an estimated rate of",
    "check": "with probability >=",
}


def _figure(name: str, value: float | None, **facts: Any) -> dict[str, Any]:
    return {"name": name, "value": value, "assumes": ASSUMES[name], "claim": CLAIMS[name], **facts}


def coverage_figures(calibration: Mapping, confidence: float) -> dict[str, Any]:
    """The three figures from calibration.json (a figure without its data has value None)."""
    gating = calibration.get("gating") or {}
    promised = (gating.get("result") or {}).get("promise") or {}
    crossed = gating.get("cross_fitted")
    part = calibration.get("check") or {}
    check = part.get("shipped") or {}
    repeats = {r["id"] for r in part.get("repeats_fit") or ()}
    unseen = {q["id"] for q in part.get("questions") or () if q["label"] == "answer"} - repeats
    missed = {q["id"] for q in check.get("wrongly_declined") or ()} | set(check.get("unscored") or ())
    n_check, kept = len(unseen), len(unseen - missed)
    figures = [
        _figure("in_sample", promised.get("keep_new_answer"), n=promised.get("n_answer")),
        _figure(
            "cross_fitted",
            crossed["coverage"] if crossed else None,
            kept=crossed and crossed["kept"],
            n=crossed and crossed["n_answer"],
            folds=crossed and crossed["folds"],
            rule=crossed and crossed["rule"],
            missed=crossed["missed"] if crossed else [],
        ),
        _figure(
            "check",
            exact_lower_bound(kept, n_check, confidence),
            kept=kept,
            n=n_check,
            observed=check.get("coverage"),
            repeats_left_out=len(repeats),
            confidence=confidence,
            bound="lower end of the exact (Clopper-Pearson) two-sided interval",
        ),
    ]
    known = [f for f in figures if f["value"] is not None]
    headline = min(known, key=lambda f: f["value"]) if known else None
    return {"figures": figures, "headline": headline}


def headline_text(figures: Mapping) -> str:
    """One sentence: the promise and what it rests on."""
    head = figures.get("headline")
    if not head:
        return "no coverage figure could be computed"
    return (
        f"a new should-answer question is kept {head.get('claim', CLAIMS['check'])} {head['value']:.3f} "
        f"({head['name'].replace('_', '-')} figure, the lowest of {len(figures['figures'])}; assumes {head['assumes']})"
    )
