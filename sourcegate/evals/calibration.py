"""Decline calibration: does a retrieval signal separate should-answer questions
from should-decline ones, and which threshold keeps every answerable question?

This module assembles calibration.json from eval records: per signal, the pair and the
shipped threshold, with verdicts in words and the curves downsampled for the report. The
numbers come from sourcegate/evals/sweep.py (pure, exact functions over score arrays); only the
downsampled curve and the heatmap grid are approximations, and only in what they draw.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from sourcegate.artifact_io import jsonable
from sourcegate.evals.answer_modes import has_score, mode_bands
from sourcegate.evals.coverage import coverage_figures
from sourcegate.evals.placement import RULES, cross_fitted, place
from sourcegate.evals.sweep import (
    ANSWER,
    DECLINE,
    fragility,
    grid_sweep,
    ids_by_label,
    is_answer_mask,
    pair_full_coverage,
    promise,
    roc_auc,
    split_by_label,
    sweep_arrays,
)

SWEEP_POINTS = 200  # curve points kept in the artifact; numbers stay exact
HEATMAP_SIZE = 25  # grid per axis for the 2-D sweep picture
INVERTED_BELOW = 0.4  # AUC under this: should-decline questions score higher
CHANCE_BELOW = 0.6  # AUC in [0.4, 0.6): no better than a coin


# --------------------------------------------------------------------------- inputs


def _one_question_ids(fragile: Mapping[str, Any]) -> list[str]:
    """The question(s) a one-question verdict turns on."""
    if fragile["gap"] > 0:
        return fragile["deciding"][ANSWER] + fragile["deciding"][DECLINE]
    return fragile["opening"]


def _signal_matrix(records: Sequence[Mapping], names: Sequence[str]) -> np.ndarray:
    """(n_records, n_names) float scores; a missing (None) score becomes NaN."""
    rows = [[r.get("signals", {}).get(name) for name in names] for r in records]
    return np.array(rows, dtype=float).reshape(len(records), len(names))


def _answer_mask(records: Sequence[Mapping]) -> np.ndarray:
    return is_answer_mask([r["label"] for r in records])


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _fmt_auc(auc: float) -> str:
    """Two decimals, more when rounding would claim a perfect (or perfectly inverted) AUC."""
    for digits in (2, 3, 4, 6):
        text = f"{auc:.{digits}f}"
        if (float(text) in (0.0, 1.0)) == (auc in (0.0, 1.0)):
            return text
    return repr(auc)


# --------------------------------------------------------------------------- 1-D


def _downsample(n: int, keep: Iterable[int], limit: int = SWEEP_POINTS) -> np.ndarray:
    """At most `limit` indices into a length-n curve, evenly spread, always
    including the ends and `keep` (e.g. the recommended threshold)."""
    keep = np.unique(np.asarray(list(keep), dtype=np.int64))
    if n <= limit:
        return np.arange(n)
    spread = np.linspace(0, n - 1, limit - len(keep)).round().astype(np.int64)
    return np.unique(np.concatenate([spread, keep]))


def _verdict(auc: float, gap: float, recall: float) -> tuple[bool, str]:
    """Plain-words verdict and whether the signal ranks better than chance."""
    if gap > 0:
        return True, f"separates: gap {_fmt(gap)}"
    if auc < INVERTED_BELOW:
        return False, f"inverted: AUC {_fmt_auc(auc)} — higher scores for should-decline"
    if auc < CHANCE_BELOW:
        return False, f"does not discriminate: AUC {_fmt_auc(auc)}"
    return True, (
        f"overlaps: AUC {_fmt_auc(auc)}, no gap — keeping every should-answer "
        f"question declines {recall:.0%} of should-decline"
    )


def _empty_signal(name: str, n_answer: int, n_decline: int, warnings: list[str]) -> dict[str, Any]:
    missing = "should-answer" if not n_answer else "should-decline"
    return {
        "name": name,
        "n": {ANSWER: n_answer, DECLINE: n_decline},
        "answer_band": None,
        "decline_band": None,
        "gap": None,
        "has_gap": False,
        "auc": None,
        "recommended_threshold": None,
        "position_in_gap": None,
        "decline_recall_at_recommended": None,
        "promise": None,
        "fragility": None,
        "warnings": warnings,
        "discriminates": False,
        "verdict": f"cannot calibrate: no {missing} questions",
        "sweep": None,
    }


def calibrate_signal(
    name: str,
    scores: Sequence[float],
    labels: Iterable,
    *,
    placement: str = "tightest",
    margin_logit: float = 0.0,
    min_per_label: int = 20,
    ids: Sequence[str] | None = None,
    coverage: float = 0.99,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Bands, gap, AUC, recommended threshold and verdict for one signal.

    placement (sourcegate/evals/placement.py): "tightest" recommends min(should-answer), the highest
    threshold that still keeps every should-answer question; "midpoint" and "logit_midpoint"
    put it in the middle of the gap, on the linear or the logit scale, when there is one; every rule
    stays `margin_logit` below min(should-answer) (on the logit scale for a probability).
    """
    if placement not in RULES:
        raise ValueError(f"placement must be one of {', '.join(RULES)}, got {placement!r}")
    answer, decline = split_by_label(scores, labels)
    answer_ids, decline_ids = ids_by_label(scores, labels, ids)
    warnings = [
        f"only {len(s)} {label} questions (< {min_per_label}): bands and gap are fragile"
        for label, s in (("should-answer", answer), ("should-decline", decline))
        if len(s) < min_per_label
    ]
    if not len(answer) or not len(decline):
        return jsonable(_empty_signal(name, len(answer), len(decline), warnings))

    answer_min, decline_max = answer[0], decline[-1]
    gap = answer_min - decline_max
    has_gap = bool(gap > 0)
    threshold = place(answer, decline, placement, margin_logit)
    if placement != "tightest" and not has_gap:
        warnings.append(f"no gap: {placement} placement fell back to the tightest threshold")
    if has_gap and threshold <= decline_max:
        warnings.append(f"the gap is narrower than the margin ({margin_logit} logit): the threshold is not above it")
    declined_at = float(np.searchsorted(decline, threshold, "left") / len(decline))
    auc = roc_auc(answer, decline)

    promised = promise(len(answer), len(decline), coverage, confidence)
    fragile = fragility(answer, decline, answer_ids, decline_ids)

    full = sweep_arrays(answer, decline)
    at = int(np.searchsorted(full["thresholds"], answer_min))  # the tightest threshold's index
    idx = _downsample(len(full["thresholds"]), [at])
    discriminates, verdict = _verdict(auc, gap, declined_at)
    if fragile["one_question"]:
        verdict += f" — decided by one question ({', '.join(_one_question_ids(fragile))})"
    return jsonable(
        {
            "name": name,
            "n": {ANSWER: len(answer), DECLINE: len(decline)},
            "answer_band": [answer_min, answer[-1]],
            "decline_band": [decline[0], decline_max],
            "gap": gap,
            "has_gap": has_gap,
            "auc": auc,
            "placement": placement,
            "recommended_threshold": threshold,
            "position_in_gap": (answer_min - threshold) / gap if has_gap else None,
            "coverage_at_recommended": 1.0,  # by construction: threshold <= min(answer)
            "decline_recall_at_recommended": declined_at,
            "promise": promised,
            "fragility": fragile,
            "warnings": warnings,
            "discriminates": discriminates,
            "verdict": verdict,
            "sweep": {"n_thresholds": len(full["thresholds"]), **{key: values[idx] for key, values in full.items()}},
        }
    )


# --------------------------------------------------------------------------- 2-D


def calibrate_pair(
    x_name: str,
    xs: Sequence[float],
    y_name: str,
    ys: Sequence[float],
    labels: Iterable,
    rule: str = "and",
    *,
    grid_size: int = HEATMAP_SIZE,
) -> dict[str, Any]:
    """2-D sweep: answer when x >= a AND y >= b.

    Raising either threshold can only decline more, so the best pair that keeps
    every should-answer question is exactly (min x, min y) over should-answer:
    no search needed.
    """
    if rule != "and":
        raise ValueError(f"only rule='and' is supported, got {rule!r}")
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    is_answer = is_answer_mask(labels)
    if not (x.shape == y.shape == is_answer.shape):
        raise ValueError("xs, ys and labels must have the same length")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("scores must be finite; leave out questions without a score")
    n_answer, n_decline = int(is_answer.sum()), int((~is_answer).sum())
    if not n_answer or not n_decline:
        return jsonable(
            {
                "x": x_name,
                "y": y_name,
                "rule": rule,
                "n": {ANSWER: n_answer, DECLINE: n_decline},
                "recommended": None,
                "separates": False,
                "verdict": "cannot calibrate: a label has no questions",
            }
        )

    a, b, recall, (x_recall, y_recall) = pair_full_coverage(x, y, is_answer)
    single = {x_name: x_recall, y_name: y_recall}
    best_single = max(single, key=single.get)
    separates = recall == 1.0
    verdict = (
        "separates perfectly: keeps every should-answer and declines every should-decline"
        if separates
        else f"keeps every should-answer and declines {recall:.0%} of should-decline "
        f"(best single signal: {best_single} {single[best_single]:.0%})"
    )
    return jsonable(
        {
            "x": x_name,
            "y": y_name,
            "rule": rule,
            "n": {ANSWER: n_answer, DECLINE: n_decline},
            "recommended": {x_name: a, y_name: b},
            "coverage_at_recommended": 1.0,
            "decline_recall_at_recommended": recall,
            "single_signal_recall": single,
            "separates": separates,
            "verdict": verdict,
            "heatmap": grid_sweep(x, y, is_answer, grid_size),
        }
    )


# --------------------------------------------------------------------------- shipped


def check_shipped(records: Sequence[Mapping], signal: str, threshold: float) -> dict[str, Any]:
    """What the shipped threshold (the lower, "adjacent" one) does to this eval set.

    A question without a score is declined, as `sourcegate.pipelines.retrieval.answer.decide` declines it at
    runtime: a should-answer one counts as not kept, a should-decline one as declined
    (the same rule as `decline_recall_by_kind`); `unscored` lists them all.
    """
    scores = _signal_matrix(records, [signal])[:, 0]
    is_answer = _answer_mask(records)
    scored = np.isfinite(scores)
    n_answer, n_decline = int(is_answer.sum()), int((~is_answer).sum())
    kept = is_answer & scored & (scores >= threshold)
    declined = ~is_answer & (~scored | (scores < threshold))

    def listing(mask: np.ndarray, descending: bool) -> list[dict[str, Any]]:
        order = np.flatnonzero(mask)[np.argsort(-scores[mask] if descending else scores[mask], kind="stable")]
        return [
            {
                "id": records[i]["id"],
                "question": records[i].get("question", ""),
                "kind": records[i].get("kind"),
                "score": float(scores[i]),
            }
            for i in order
        ]

    per_question = {
        records[i]["id"]: {
            "kind": records[i].get("kind"),
            "label": ANSWER if is_answer[i] else DECLINE,
            "declined": bool(not kept[i] if is_answer[i] else declined[i]),
        }
        for i in range(len(records))
    }
    wrongly_declined = listing(is_answer & scored & ~kept, descending=False)
    for row in wrongly_declined:
        row["fix"] = f"threshold <= {row['score']!r}"  # repr round-trips: never above the score
    answer_scores = scores[is_answer & scored]
    summary = jsonable(
        {
            "signal": signal,
            "threshold": float(threshold),
            "n": {ANSWER: n_answer, DECLINE: n_decline},
            "available": bool(scored.any()),
            "coverage": kept.sum() / n_answer if n_answer else None,
            "decline_recall": declined.sum() / n_decline if n_decline else None,
        }
    )
    return {
        **summary,  # the lists below already hold plain Python values
        "wrongly_declined": wrongly_declined,
        "wrongly_answered": listing(~is_answer & scored & ~declined, descending=True),
        "unscored": [records[i]["id"] for i in np.flatnonzero(~scored)],
        "unscored_by_label": {ANSWER: int((is_answer & ~scored).sum()), DECLINE: int((~is_answer & ~scored).sum())},
        "max_threshold_for_full_coverage": float(answer_scores.min()) if len(answer_scores) else None,
        "per_question": per_question,  # what the decline regression check pairs with the baseline
    }


# --------------------------------------------------------------------------- artifact


def decline_recall_by_kind(records: Sequence[Mapping], signal: str, threshold: float) -> dict[str, dict]:
    """Per should-decline kind: how many a threshold declines (a missing score counts as declined,
    as in `check_shipped` and at runtime)."""
    out: dict[str, dict] = {}
    for r in records:
        if r["label"] == ANSWER:
            continue
        value = r["signals"].get(signal)
        row = out.setdefault(r.get("kind") or "unknown", {"n": 0, "declined": 0})
        row["n"] += 1
        row["declined"] += int(not has_score(value) or not value >= threshold)
    for row in out.values():
        row["recall"] = row["declined"] / row["n"]
    return dict(sorted(out.items()))


def held_to_gap(record: Mapping, kinds: Sequence[str]) -> bool:
    """Whether the gap check holds this question: every should-answer one, and the should-decline ones of the gated
    `kinds` (`calibration.gate_decline_kinds`; none named: all of them)."""
    return record["label"] == ANSWER or not kinds or record.get("kind") in kinds


def gated_figures(scores: np.ndarray, is_answer: np.ndarray, in_scope: np.ndarray) -> dict[str, Any] | None:
    """One signal against the should-decline kinds the gap holds (`in_scope`: should-answer, or a gated kind): the
    gap, the AUC and the share declined at full coverage, as the gate would read them if it gated on this signal.
    The signal table's other columns weigh every should-decline question; None when a side has no score."""
    scored = np.isfinite(scores) & in_scope
    answer, decline = scores[scored & is_answer], scores[scored & ~is_answer]
    if not len(answer) or not len(decline):
        return None
    gap = float(answer.min() - decline.max())
    return jsonable(
        {
            "n": {ANSWER: len(answer), DECLINE: len(decline)},
            "gap": gap,
            "has_gap": gap > 0,
            "auc": roc_auc(answer, decline),
            "declined_at_full_coverage": float((decline < answer.min()).mean()),
        }
    )


def gating_scope(
    records: Sequence[Mapping], signal: str, decline_kinds: Sequence[str], options: Mapping[str, Any], folds: int = 5
) -> dict[str, Any]:
    """The gating signal calibrated on the questions the gap check holds it to.

    `decline_kinds` narrows the should-decline side to those kinds (empty: all of them);
    every other should-decline question is still swept and reported, and its decline
    recall is tracked against the accepted baseline by the gate.
    """
    scope = [r for r in records if held_to_gap(r, decline_kinds)]
    scores = np.array([np.nan if r["signals"].get(signal) is None else r["signals"][signal] for r in scope], float)
    scored = np.isfinite(scores)
    ids = [i for i, ok in zip((r["id"] for r in scope), scored) if ok]
    is_answer = _answer_mask(scope)[scored]
    result = calibrate_signal(signal, scores[scored], is_answer, ids=ids, **options) if scored.any() else None
    return {
        "signal": signal,
        "decline_kinds": list(decline_kinds) or "all",
        "n": {ANSWER: sum(r["label"] == ANSWER for r in scope), DECLINE: sum(r["label"] != ANSWER for r in scope)},
        "result": result,
        "cross_fitted": _cross_fitted(
            scores[scored], is_answer, ids, options["placement"], folds, options.get("margin_logit", 0.0)
        ),
    }


def _cross_fitted(
    scores: np.ndarray, is_answer: np.ndarray, ids: list[str], rule: str, folds: int, margin_logit: float = 0.0
) -> dict | None:
    """The placement rule's coverage on fit questions its threshold did not see (None: too few to fold)."""
    if is_answer.sum() < folds or not (~is_answer).any():
        return None
    result = cross_fitted(scores, is_answer, rule, folds, margin_logit)
    return jsonable({**result, "missed": [ids[i] for i in result["missed"]]})


def calibrate_check(records: Sequence[Mapping], config: Mapping[str, Any]) -> dict[str, Any]:
    """The check set (questions that never chose anything) at the shipped threshold.

    Every should-answer question must be kept, and every should-decline question of a kind the
    gap holds (`gate_decline_kinds`) declined, as on the fit set; `questions` keeps the
    per-question scores so `accept` can tell which check questions a new threshold has seen.
    """
    gating = config["gating"]
    kinds = config.get("gate_decline_kinds") or []
    gated = [r for r in records if held_to_gap(r, kinds)]
    shipped = check_shipped(gated, gating["signal"], gating["adjacent"])
    return {
        "signal": gating["signal"],
        "threshold": gating["adjacent"],
        "n": {ANSWER: int(_answer_mask(records).sum()), DECLINE: int((~_answer_mask(records)).sum())},
        "decline_kinds": list(kinds) or "all",
        "shipped": {k: v for k, v in shipped.items() if k != "per_question"},
        "decline_recall_by_kind": decline_recall_by_kind(records, gating["signal"], gating["adjacent"]),
        "questions": _questions(records, [gating["signal"]], _signal_matrix(records, [gating["signal"]])),
    }


def _config_signals(config: Mapping[str, Any]) -> list[str]:
    """Every signal the config mentions, in order, once."""
    names = list(config["signals"]) + list(config.get("pair") or [])
    if config.get("gating"):
        names.append(config["gating"]["signal"])
    return list(dict.fromkeys(names))


def _questions(records: Sequence[Mapping], names: list[str], matrix: np.ndarray) -> list[dict[str, Any]]:
    """Per-question rows for the artifact (already JSON-safe: NaN -> None)."""
    values = np.where(np.isfinite(matrix), matrix, None).tolist()
    return [
        {"id": r["id"], "label": r["label"], "kind": r.get("kind"), "signals": dict(zip(names, row))}
        for r, row in zip(records, values)
    ]


def _modes(records: Sequence[Mapping], check: Sequence[Mapping], gating: Mapping | None) -> dict | None:
    """What each answer mode holds, per set and kind, under the shipped thresholds (None: nothing ships)."""
    if not gating:
        return None
    return {"fit": mode_bands(records, gating), "check": mode_bands(check, gating) if check else None}


def signal_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """`calibrate_signal`'s settings from the calibration config: placement, margin and what a promise needs."""
    return {
        "placement": config.get("placement", "tightest"),
        "margin_logit": config.get("margin_logit", 0.0),
        "min_per_label": config.get("min_per_label", 20),
        "coverage": config.get("promise_coverage", 0.99),
        "confidence": config.get("promise_confidence", 0.95),
    }


def calibrate(
    records: Sequence[Mapping],
    config: Mapping[str, Any],
    check: Sequence[Mapping] = (),
    check_path: str | None = None,
    check_repeats: Sequence[tuple[str, str, float]] = (),
) -> dict[str, Any]:
    """The whole calibration.json for the fit set's records, and the check set's (`check`: questions
    that chose nothing) at the shipped threshold, with the three coverage figures. `check_repeats`:
    (check id, fit id, score) for check questions that ask a fit question again (`sourcegate.evals.evalset.copies`):
    still held to the check, but not unseen, so the check's figure leaves them out."""
    options = signal_options(config)
    names = _config_signals(config)
    matrix = _signal_matrix(records, names)
    column = {name: matrix[:, i] for i, name in enumerate(names)}
    is_answer = _answer_mask(records)
    kinds = config.get("gate_decline_kinds") or []
    in_scope = np.array([held_to_gap(r, kinds) for r in records], bool)

    signals = {}
    for name in config["signals"]:
        scored = np.isfinite(column[name])
        if not scored.any():
            hint = " (reranker off?)" if name in ("rerank_top", "margin") else ""
            signals[name] = {"name": name, "skipped": True, "note": f"skipped: no question has a {name} score{hint}"}
            continue
        ids = [r["id"] for r, ok in zip(records, scored) if ok]
        result = calibrate_signal(name, column[name][scored], is_answer[scored], ids=ids, **options)
        if not scored.all():
            result["warnings"].append(f"{int((~scored).sum())} questions have no {name} score and were left out")
        if kinds:
            result["gated"] = gated_figures(column[name], is_answer, in_scope)
        signals[name] = result

    pair = None
    if config.get("pair"):
        x_name, y_name = config["pair"]
        both = np.isfinite(column[x_name]) & np.isfinite(column[y_name])
        if both.any():
            pair = calibrate_pair(x_name, column[x_name][both], y_name, column[y_name][both], is_answer[both])
            if not both.all():
                pair["verdict"] += f"; {int((~both).sum())} questions without both scores left out"
        else:
            pair = {
                "x": x_name,
                "y": y_name,
                "skipped": True,
                "note": f"skipped: no question has both {x_name} and {y_name}",
            }

    shipped = gated = None
    if config.get("gating"):
        gating = config["gating"]
        shipped = check_shipped(records, gating["signal"], gating["adjacent"])
        shipped["strong_threshold"] = gating.get("strong")
        shipped["decline_recall_by_kind"] = decline_recall_by_kind(records, gating["signal"], gating["adjacent"])
        gated = gating_scope(records, gating["signal"], kinds, options, config.get("cross_fit_folds", 5))

    result = {
        "n": {ANSWER: int(is_answer.sum()), DECLINE: int((~is_answer).sum())},
        "config": jsonable(dict(config)),
        "signals": signals,
        "pair": pair,
        "shipped": shipped,
        "gating": gated,
        "check": {
            "path": check_path,
            **calibrate_check(check, config),
            "repeats_fit": [{"id": a, "fit_id": b, "score": r} for a, b, r in check_repeats],
        }
        if check and config.get("gating")
        else None,
        "modes": _modes(records, check, config.get("gating")),
        "questions": _questions(records, names, matrix),
    }
    result["coverage"] = coverage_figures(result, options["confidence"])
    return result
