"""Per-question regression against the accepted baseline: paired wins and losses and an
exact one-sided McNemar test, instead of a rate tolerance that one question can cross.

An outcome is a boolean per question (hit@k for precision, declined for a should-decline
question). A loss is a question that passed in the baseline and fails now; a win the
reverse. Under "no change", each discordant question is a loss with probability 1/2, so
the losses among the w + l discordant ones are Binomial(w + l, 1/2) and
P(X >= l) is the exact one-sided p-value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scipy.stats import binomtest


def binomial_tail(losses: int, discordant: int) -> float:
    """P(X >= losses) for X ~ Binomial(discordant, 1/2): the exact one-sided McNemar p-value."""
    if not 0 <= losses <= discordant:
        raise ValueError(f"need 0 <= losses <= discordant, got {losses}, {discordant}")
    if discordant == 0:
        return 1.0  # no question changed: nothing to test
    return float(binomtest(losses, discordant, 0.5, alternative="greater").pvalue)


def paired(
    baseline: Mapping[str, Mapping[str, Any]], current: Mapping[str, Mapping[str, Any]], key: str
) -> dict[str, Any]:
    """Wins, losses and unchanged questions of one boolean outcome, matched by question id.

    Both sides map question id -> {"kind": ..., key: bool}. Questions only in one side are
    listed (`new`, `missing`) and not compared: a changed eval set is not a regression.
    """
    common = sorted(set(baseline) & set(current))
    wins = [q for q in common if current[q][key] and not baseline[q][key]]
    losses = [q for q in common if baseline[q][key] and not current[q][key]]
    return {
        "n": len(common),
        "wins": wins,
        "losses": losses,
        "unchanged": len(common) - len(wins) - len(losses),
        "new": sorted(set(current) - set(baseline)),
        "missing": sorted(set(baseline) - set(current)),
    }


def _verdict(comparison: Mapping[str, Any], alpha: float, max_losses: int | None) -> dict[str, Any]:
    w, lost = len(comparison["wins"]), len(comparison["losses"])
    p = binomial_tail(lost, w + lost)
    significant = lost > w and p < alpha
    too_many = max_losses is not None and lost > max_losses
    return {**comparison, "p_value": p, "significant": significant, "too_many": too_many}


def compare(
    baseline: Mapping[str, Mapping[str, Any]],
    current: Mapping[str, Mapping[str, Any]],
    key: str,
    *,
    alpha: float,
    max_losses: int,
    min_kind_questions: int,
) -> dict[str, Any]:
    """Overall and per-kind paired comparison; `failed` when the overall losses significantly
    exceed the wins or exceed max_losses, or a kind with >= min_kind_questions compared
    questions significantly lost. Smaller kinds are reported and never gate."""
    overall = _verdict(paired(baseline, current, key), alpha, max_losses)
    kinds: dict[str, Any] = {}
    for kind in sorted({str(row.get("kind")) for row in [*baseline.values(), *current.values()]}):
        sub = {q: r for q, r in baseline.items() if str(r.get("kind")) == kind}
        cur = {q: r for q, r in current.items() if str(r.get("kind")) == kind}
        result = _verdict(paired(sub, cur, key), alpha, None)
        result["gates"] = result["n"] >= min_kind_questions
        kinds[kind] = result
    failed_kinds = [k for k, r in kinds.items() if r["gates"] and r["significant"]]
    # A comparison that matched none of the baseline's questions (their ids changed, another corpus's baseline) says
    # nothing: it fails rather than pass unread. A set that shares any question with it compares those.
    overall["too_few"] = overall["n"] == 0 and bool(baseline)
    return {
        "outcome": key,
        "alpha": alpha,
        "max_losses": max_losses,
        "min_kind_questions": min_kind_questions,
        "overall": overall,
        "by_kind": kinds,
        "failed_kinds": failed_kinds,
        "failed": overall["significant"] or overall["too_many"] or overall["too_few"] or bool(failed_kinds),
    }


def describe(result: Mapping[str, Any], what: str) -> str:
    """One sentence: wins, losses, p-value, the flipped ids and why it failed (if it did)."""
    o = result["overall"]
    text = (
        f"{what}: {len(o['wins'])} won, {len(o['losses'])} lost, {o['unchanged']} unchanged of {o['n']} "
        f"questions matched with the baseline (one-sided exact McNemar p = {o['p_value']:.3g}, alpha "
        f"{result['alpha']:g}; at most {result['max_losses']} losses allowed)"
    )
    if o["losses"]:
        text += f"; lost: {', '.join(o['losses'][:20])}{' …' if len(o['losses']) > 20 else ''}"
    if o["wins"]:
        text += f"; won: {', '.join(o['wins'][:20])}{' …' if len(o['wins']) > 20 else ''}"
    reasons = []
    if o["significant"]:
        reasons.append("losses significantly exceed wins")
    if o["too_many"]:
        reasons.append(f"more than {result['max_losses']} losses")
    if o.get("too_few"):
        reasons.append(
            f"none of the baseline's {len(o['missing'])} questions matched by id, so nothing was compared (renamed "
            "questions, or another set's baseline): accept a new baseline (sourcegate accept RUN) once the set is right"
        )
    for kind in result["failed_kinds"]:
        k = result["by_kind"][kind]
        reasons.append(f"kind {kind!r} lost {len(k['losses'])} and won {len(k['wins'])} (p = {k['p_value']:.3g})")
    small = [k for k, r in result["by_kind"].items() if not r["gates"] and (r["losses"] or r["wins"])]
    if small:
        text += f"; kinds under {result['min_kind_questions']} questions reported, not gated: {', '.join(small)}"
    if reasons:
        text += f" — regressed: {'; '.join(reasons)}"
    if o["missing"]:
        text += f"; {len(o['missing'])} baseline questions not in this run"
    return text


def baseline_from(precision: Mapping[str, Any], calibration: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The accepted baseline: per-question outcomes (what the checks pair), and rates for reading."""
    shipped = calibration.get("shipped") or {}
    if precision.get("per_question") is None or shipped.get("per_question") is None:
        raise ValueError(f"{source} has no per-question outcomes (evaluated by an older version): re-run it first")
    return {
        "accepted_from": source,
        "threshold": {"signal": shipped["signal"], "adjacent": shipped["threshold"]},
        "questions": {
            "precision": {
                q: {"kind": r["kind"], "reranked_rank": r["reranked_rank"]}
                for q, r in sorted(precision["per_question"].items())
            },
            "decline": {
                q: {"kind": r["kind"], "label": r["label"], "declined": r["declined"]}
                for q, r in sorted(shipped["per_question"].items())
            },
        },
        # rates, for a maintainer reading the file; no check reads them
        "reranked": {
            "overall": precision["overall"]["reranked"],
            "by_kind": {k: v["reranked"] for k, v in sorted(precision["by_kind"].items())},
        },
        "decline_recall_by_kind": {k: v["recall"] for k, v in shipped.get("decline_recall_by_kind", {}).items()},
    }


class BaselineError(ValueError):
    """An accepted baseline that cannot be compared against: an error (exit 2), never a pass."""


def check_baseline(baseline: Any, source: str) -> Mapping[str, Any]:
    """The baseline as `accept` writes it: per-question precision and decline outcomes, each a mapping."""
    if not isinstance(baseline, Mapping) or not baseline:
        raise BaselineError(f"{source}: the accepted baseline is empty or not a JSON object; {ACCEPT_HINT}")
    questions = baseline.get("questions")
    for part in ("precision", "decline"):
        outcomes = questions.get(part) if isinstance(questions, Mapping) else None
        if not isinstance(outcomes, Mapping) or not outcomes:
            raise BaselineError(f"{source}: the accepted baseline has no per-question {part} outcomes; {ACCEPT_HINT}")
        bad = [q for q, row in outcomes.items() if not isinstance(row, Mapping)]
        if bad:
            raise BaselineError(f"{source}: malformed {part} outcomes for {', '.join(sorted(bad)[:5])}; {ACCEPT_HINT}")
    return baseline


ACCEPT_HINT = "re-accept a run you trust with `sourcegate accept RUN_DIR`"
