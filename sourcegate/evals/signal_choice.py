"""The gating signal chosen per corpus, by a written rule, from the fit set alone (`answer.signal: auto`).

No one signal separates should-answer from should-decline questions on every corpus: on the demo only answer models
trained on it do; on a collection of medical abstracts the untrained `rerank_top` and `cosine_top` do and the demo's
model does not. So a corpus whose config says `auto` gets the signal its own fit set supports, and the check set
(questions that chose nothing) judges the pick, as it judges a threshold.

The rule, in order (docs/calibration.md "Choosing the gating signal"):
  1. candidates: `answer.candidates`, less those the night excluded with a reason (an answer model that learned
     another corpus, or too little of this one) and those not scored on every question the gap holds;
  2. among candidates with a gap on the fit set (every should-answer question above every gated should-decline one),
     the widest gap relative to the signal's own spread (the gap over the 10th-90th percentile range of its scores on
     those questions: unchanged by a signal's units or offset, and not set by one outlier), then the earlier in
     `answer.candidates` (untrained signals first: they hold on any corpus);
  3. no candidate with a gap: the highest ROC AUC (then the earlier), and the gate fails on its missing gap;
  4. its threshold is placed on the fit set by `calibration.placement`, as `sourcegate calibrate` would place it.
Every candidate's gap, AUC and cross-fitted figures are recorded beside the pick, so a maintainer sees the margin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sourcegate.artifact_io import jsonable
from sourcegate.evals.calibration import gating_scope, held_to_gap, signal_options
from sourcegate.evals.placement import place
from sourcegate.evals.sweep import ANSWER

AUTO = "auto"
RULE = (
    "among the candidates with a gap on the fit set, the widest gap relative to the signal's 10th-90th percentile "
    "spread, then the order of answer.candidates; none with a gap: the highest ROC AUC; threshold placed by "
    "calibration.placement"
)
SPREAD = (10, 90)  # percentiles whose range a gap is measured against


def _scores(records: Sequence[Mapping], name: str, decline_kinds: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The signal's should-answer and gated should-decline scores."""
    scope = [r for r in records if held_to_gap(r, decline_kinds)]
    answer = np.array([r["signals"][name] for r in scope if r["label"] == ANSWER], float)
    return answer, np.array([r["signals"][name] for r in scope if r["label"] != ANSWER], float)


def relative_gap(gap: float, answer: np.ndarray, decline: np.ndarray) -> float:
    """The gap over the spread of the scores (SPREAD percentiles of both labels together); 0 for a flat signal."""
    low, high = np.percentile(np.concatenate([answer, decline]), SPREAD)
    return float(gap / (high - low)) if high > low else 0.0


def _row(name: str, scope: Mapping[str, Any], order: int, scores: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
    result, folded = scope["result"], scope["cross_fitted"] or {}
    return {
        "signal": name,
        "order": order,
        "eligible": True,
        "has_gap": bool(result["has_gap"]),
        "gap": result["gap"],
        "relative_gap": relative_gap(result["gap"], *scores),
        "auc": result["auc"],
        "cross_fitted_coverage": folded.get("coverage"),
        "cross_fitted_decline_recall": folded.get("decline_recall"),
    }


def _rank(row: Mapping[str, Any]) -> tuple:
    if row["has_gap"]:
        return (1, row["relative_gap"], -row["order"])
    return (0, row["auc"] or 0.0, -row["order"])


def choose(
    records: Sequence[Mapping],
    candidates: Sequence[str],
    decline_kinds: Sequence[str],
    options: Mapping[str, Any],
    folds: int = 5,
    excluded: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The rule over the fit set's records: every candidate's row (why it was left out, or its gap, AUC and
    cross-fitted figures), the pick and its threshold. `options` as `calibrate_signal` takes them."""
    excluded = dict(excluded or {})
    rows: list[dict[str, Any]] = []
    for order, name in enumerate(dict.fromkeys(candidates)):
        if name in excluded:
            rows.append({"signal": name, "order": order, "eligible": False, "why": excluded[name]})
            continue
        scope = gating_scope(records, name, decline_kinds, options, folds)
        in_scope = scope["n"][ANSWER] + scope["n"]["decline"]
        result = scope["result"]
        scored = 0 if result is None else result["n"][ANSWER] + result["n"]["decline"]
        if result is None or scored < in_scope or result.get("gap") is None:
            why = f"scored on {scored} of the {in_scope} questions the gap holds"
            rows.append({"signal": name, "order": order, "eligible": False, "why": why})
            continue
        rows.append(_row(name, scope, order, _scores(records, name, decline_kinds)))
    eligible = [r for r in rows if r["eligible"]]
    if not eligible:
        return jsonable({"rule": RULE, "candidates": rows, "signal": None, "threshold": None})
    pick = max(eligible, key=_rank)
    threshold = place(
        *_scores(records, pick["signal"], decline_kinds), options["placement"], options.get("margin_logit", 0.0)
    )
    why = "has a gap" if pick["has_gap"] else "no candidate has a gap; highest ROC AUC"
    return jsonable(
        {
            "rule": RULE,
            "candidates": rows,
            "signal": pick["signal"],
            "threshold": threshold,
            "placement": options["placement"],
            "why": why,
        }
    )


def resolve(records: Sequence[Mapping], config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The calibration config with an `auto` gating signal replaced by the rule's pick and threshold (and the
    choice, for calibration.json); any other config is returned as it is, with no choice."""
    gating = config.get("gating") or {}
    if gating.get("signal") != AUTO:
        return dict(config), None
    options = signal_options(config)
    choice = choose(
        records,
        config.get("candidates") or (),
        config.get("gate_decline_kinds") or [],
        options,
        config.get("cross_fit_folds", 5),
        config.get("excluded"),
    )
    if choice["signal"] is None:
        return dict(config), choice
    resolved = {**gating, "signal": choice["signal"], "adjacent": choice["threshold"]}
    if gating.get("strong_signal") in (None, AUTO):  # `sourced` on the same signal: strong at least the threshold
        resolved["strong"] = max(gating.get("strong", choice["threshold"]), choice["threshold"])
    return {**config, "gating": resolved}, choice
