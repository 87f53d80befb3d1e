"""Decline calibration: does a retrieval signal separate should-answer questions
from should-decline ones, and which threshold keeps every answerable question?

Convention throughout: a higher score means "more answerable", and a question
is answered when score >= threshold. Everything is exact (no binning) except the
downsampled curve and the heatmap written for the report.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from pipelines.io import jsonable

ANSWER, DECLINE = "answer", "decline"
SWEEP_POINTS = 200  # curve points kept in the artifact; numbers stay exact
HEATMAP_SIZE = 25  # grid per axis for the 2-D sweep picture
INVERTED_BELOW = 0.4  # AUC under this: should-decline questions score higher
CHANCE_BELOW = 0.6  # AUC in [0.4, 0.6): no better than a coin


# --------------------------------------------------------------------------- inputs


def _is_answer(labels: Iterable) -> np.ndarray:
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


def _split(scores: Sequence[float], labels: Iterable) -> tuple[np.ndarray, np.ndarray]:
    """Sorted should-answer and should-decline scores."""
    s = np.asarray(scores, dtype=float)
    is_answer = _is_answer(labels)
    if s.shape != is_answer.shape:
        raise ValueError(f"{s.shape[0]} scores but {is_answer.shape[0]} labels")
    if not np.isfinite(s).all():
        raise ValueError("scores must be finite; leave out questions without a score")
    return np.sort(s[is_answer]), np.sort(s[~is_answer])


def _split_ids(scores: Sequence[float], labels: Iterable, ids: Sequence[str] | None) -> tuple[np.ndarray, np.ndarray]:
    """Question ids in the order `_split` sorts the scores (positions when no ids are given)."""
    s = np.asarray(scores, dtype=float)
    is_answer = _is_answer(labels)
    names = np.asarray([str(i) for i in ids] if ids is not None else [f"#{i}" for i in range(len(s))], dtype=object)
    if names.shape != s.shape:
        raise ValueError(f"{s.shape[0]} scores but {names.shape[0]} ids")
    return (
        names[is_answer][np.argsort(s[is_answer], kind="stable")],
        names[~is_answer][np.argsort(s[~is_answer], kind="stable")],
    )


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
    return _is_answer([r["label"] for r in records])


def _fraction(count: np.ndarray | int, n: int) -> np.ndarray | float:
    return np.asarray(count, dtype=float) / n if n else np.full(np.shape(count), np.nan)


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


def _sweep_arrays(answer: np.ndarray, decline: np.ndarray) -> dict[str, np.ndarray]:
    """Exact sweep over every distinct score (inputs sorted)."""
    thresholds = np.unique(np.concatenate([answer, decline]))
    # searchsorted 'left' counts scores strictly below the threshold: declined ones.
    kept = 1.0 - _fraction(np.searchsorted(answer, thresholds, "left"), len(answer))
    declined = _fraction(np.searchsorted(decline, thresholds, "left"), len(decline))
    return {"thresholds": thresholds, "kept": kept, "declined": declined, "false_decline_rate": 1.0 - kept}


def sweep(scores: Sequence[float], labels: Iterable) -> dict[str, list[float]]:
    """Exact threshold sweep for one signal.

    At every distinct score t (ascending): `kept` = share of should-answer with
    score >= t, `declined` = share of should-decline with score < t,
    `false_decline_rate` = 1 - kept.
    """
    return {k: v.tolist() for k, v in _sweep_arrays(*_split(scores, labels)).items()}


def _auc(answer: np.ndarray, decline: np.ndarray) -> float:
    """ROC AUC as Mann-Whitney: P(answer > decline) + 0.5 P(tie). Inputs sorted."""
    if not len(answer) or not len(decline):
        return math.nan
    below = np.searchsorted(decline, answer, "left")
    below_or_tied = np.searchsorted(decline, answer, "right")
    return float((below.sum() + below_or_tied.sum()) / (2.0 * len(answer) * len(decline)))


# No bootstrap interval for the gap: resampling can only raise a minimum and lower a
# maximum, so every resampled gap is >= the observed one and its "interval" could never
# show a fragile gap (the bootstrap of an extreme order statistic is inconsistent). The
# statements below are exact for any n instead.


def needed_for(coverage: float, confidence: float) -> int:
    """Should-answer questions, all kept, needed to claim a keep rate >= coverage at `confidence`.

    If the true rate were below `coverage`, n kept out of n happens with probability
    < coverage**n; that is <= alpha = 1 - confidence once n >= log(alpha) / log(coverage).
    """
    if not (0 < coverage < 1 and 0 < confidence < 1):
        raise ValueError("coverage and confidence must lie strictly between 0 and 1")
    n = math.log(1.0 - confidence) / math.log(coverage)
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
    min_per_label: int = 20,
    ids: Sequence[str] | None = None,
    coverage: float = 0.99,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Bands, gap, AUC, recommended threshold and verdict for one signal.

    placement "tightest" recommends min(should-answer), the highest threshold
    that still keeps every should-answer question; "midpoint" puts it in the
    middle of the gap when there is one (more margin for unseen questions).
    """
    if placement not in ("tightest", "midpoint"):
        raise ValueError(f"placement must be 'tightest' or 'midpoint', got {placement!r}")
    answer, decline = _split(scores, labels)
    answer_ids, decline_ids = _split_ids(scores, labels, ids)
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
    threshold = answer_min
    if placement == "midpoint":
        if has_gap:
            threshold = (answer_min + decline_max) / 2.0
        else:
            warnings.append("no gap: midpoint placement fell back to the tightest threshold")
    declined_at = float(np.searchsorted(decline, threshold, "left") / len(decline))
    auc = _auc(answer, decline)

    promised = promise(len(answer), len(decline), coverage, confidence)
    fragile = fragility(answer, decline, answer_ids, decline_ids)

    full = _sweep_arrays(answer, decline)
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


def _count_at_least(x: np.ndarray, y: np.ndarray, gx: np.ndarray, gy: np.ndarray) -> np.ndarray:
    """counts[i, j] = number of points with x >= gx[i] and y >= gy[j] (grids ascending)."""
    ix = np.searchsorted(gx, x, "right") - 1  # highest grid line at or below x
    iy = np.searchsorted(gy, y, "right") - 1
    ok = (ix >= 0) & (iy >= 0)
    cells = np.bincount(ix[ok] * len(gy) + iy[ok], minlength=len(gx) * len(gy))
    cells = cells.reshape(len(gx), len(gy))
    # Suffix sums in both directions turn cell counts into "at least" counts.
    return cells[::-1, ::-1].cumsum(0).cumsum(1)[::-1, ::-1]


def _heatmap(x: np.ndarray, y: np.ndarray, is_answer: np.ndarray, size: int) -> dict[str, Any]:
    """Coverage and decline recall on a grid of thresholds at quantiles of each signal."""
    q = np.linspace(0.0, 1.0, size)
    gx, gy = np.unique(np.quantile(x, q)), np.unique(np.quantile(y, q))
    kept_answer = _count_at_least(x[is_answer], y[is_answer], gx, gy)
    kept_decline = _count_at_least(x[~is_answer], y[~is_answer], gx, gy)
    return {
        "x_thresholds": gx,
        "y_thresholds": gy,
        "coverage": _fraction(kept_answer, int(is_answer.sum())),
        "decline_recall": 1.0 - _fraction(kept_decline, int((~is_answer).sum())),
    }


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
    is_answer = _is_answer(labels)
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

    a, b = x[is_answer].min(), y[is_answer].min()
    dx, dy = x[~is_answer], y[~is_answer]
    recall = float(((dx < a) | (dy < b)).mean())
    single = {x_name: float((dx < a).mean()), y_name: float((dy < b).mean())}
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
            "heatmap": _heatmap(x, y, is_answer, grid_size),
        }
    )


# --------------------------------------------------------------------------- shipped


def check_shipped(records: Sequence[Mapping], signal: str, threshold: float) -> dict[str, Any]:
    """What the shipped threshold (the lower, "adjacent" one) does to this eval set.

    A question without a score is declined, as `pipelines.answer.decide` declines it at
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
            {"id": records[i]["id"], "question": records[i].get("question", ""), "score": float(scores[i])}
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
        row["declined"] += int(value is None or not value >= threshold)
    for row in out.values():
        row["recall"] = row["declined"] / row["n"]
    return dict(sorted(out.items()))


def gating_scope(
    records: Sequence[Mapping], signal: str, decline_kinds: Sequence[str], options: Mapping[str, Any]
) -> dict[str, Any]:
    """The gating signal calibrated on the questions the gap check holds it to.

    `decline_kinds` narrows the should-decline side to those kinds (empty: all of them);
    every other should-decline question is still swept and reported, and its decline
    recall is tracked against the accepted baseline by the gate.
    """
    scope = [r for r in records if r["label"] == ANSWER or not decline_kinds or r.get("kind") in decline_kinds]
    scores = np.array([np.nan if r["signals"].get(signal) is None else r["signals"][signal] for r in scope], float)
    scored = np.isfinite(scores)
    ids = [r["id"] for r in scope]
    result = (
        calibrate_signal(
            signal, scores[scored], _answer_mask(scope)[scored], ids=[i for i, ok in zip(ids, scored) if ok], **options
        )
        if scored.any()
        else None
    )
    return {
        "signal": signal,
        "decline_kinds": list(decline_kinds) or "all",
        "n": {ANSWER: sum(r["label"] == ANSWER for r in scope), DECLINE: sum(r["label"] != ANSWER for r in scope)},
        "result": result,
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


def calibrate(records: Sequence[Mapping], config: Mapping[str, Any]) -> dict[str, Any]:
    """The whole calibration.json for one eval set and config."""
    options = {
        "placement": config.get("placement", "tightest"),
        "min_per_label": config.get("min_per_label", 20),
        "coverage": config.get("promise_coverage", 0.99),
        "confidence": config.get("promise_confidence", 0.95),
    }
    names = _config_signals(config)
    matrix = _signal_matrix(records, names)
    column = {name: matrix[:, i] for i, name in enumerate(names)}
    is_answer = _answer_mask(records)

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
        gated = gating_scope(records, gating["signal"], config.get("gate_decline_kinds") or [], options)

    return {
        "n": {ANSWER: int(is_answer.sum()), DECLINE: int((~is_answer).sum())},
        "config": jsonable(dict(config)),
        "signals": signals,
        "pair": pair,
        "shipped": shipped,
        "gating": gated,
        "questions": _questions(records, names, matrix),
    }
