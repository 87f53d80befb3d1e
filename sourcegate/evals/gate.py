"""The release gate: one verdict from the calibration and precision artifacts.

The gate fails the run (and so blocks promotion) when the gating signal has no
threshold gap, when the shipped threshold is not inside that gap or declines any
should-answer question, when reranked hits or declines lost significantly more
questions than they won against the accepted baseline (paired per question, exact
McNemar) or more than a set count, or when the eval sets themselves were invalid.
`write_gate` writes the verdict as gate.json and, serialised by sourcegate/evals/junit.py, junit.xml.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sourcegate.artifact_io import jsonable, write_json, write_text
from sourcegate.artifact_io import run_folder as rf
from sourcegate.evals.acceptance import decision_acceptance
from sourcegate.evals.coverage import headline_text
from sourcegate.evals.junit import junit_xml
from sourcegate.evals.regression import compare, describe


def _check(name: str, passed: bool, detail: str, **data: Any) -> dict[str, Any]:
    return {"name": name, "passed": bool(passed), "detail": detail, "data": data}


def _n(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _lost(q: Mapping) -> str:
    """A lost should-answer question, its score, and where its labelled passage stood when the run knows it."""
    if "source_rank" not in q:
        return f"{q['id']} ({_n(q['score'])})"
    rank = q["source_rank"]
    where = "its source not among the candidates" if rank is None else f"its source at rank {rank}"
    return f"{q['id']} ({_n(q['score'])}, {where})"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def check_threshold_gap(calibration: Mapping, signal: str) -> dict[str, Any]:
    """The gating signal must separate the labels: min(answer) > max(decline)."""
    gating = calibration.get("gating") or {}
    if gating.get("signal") != signal:
        gating = {}
    scope = gating.get("decline_kinds", "all")
    result = gating.get("result") if gating else (calibration.get("signals") or {}).get(signal)
    scope_note = "" if scope == "all" else f" (should-decline kinds held to the gap: {', '.join(scope)})"
    if not result:
        return _check("threshold_gap", False, f"The gating signal {signal} was not calibrated.")
    if result.get("skipped"):
        return _check("threshold_gap", False, f"The gating signal {signal} was {result['note']}.")
    if result.get("gap") is None:
        return _check("threshold_gap", False, f"The gating signal {signal}: {result['verdict']}.")
    answer_min, decline_max = result["answer_band"][0], result["decline_band"][1]
    facts = {"gap": result["gap"], "promise": result.get("promise"), "fragility": result.get("fragility")}
    if result["has_gap"]:
        return _check(
            "threshold_gap",
            True,
            f"{signal} separates: gap {_n(result['gap'])} between the lowest should-answer "
            f"score {_n(answer_min)} and the highest should-decline score {_n(decline_max)}{scope_note}"
            f"{gap_promise_text(result)}.",
            **facts,
        )
    return _check(
        "threshold_gap",
        False,
        f"{signal} has no threshold gap: the lowest should-answer score {_n(answer_min)} is not "
        f"above the highest should-decline score {_n(decline_max)}{scope_note} (overlap {_n(abs(result['gap']))}; "
        f"{result['verdict']}){gap_promise_text(result)}.",
        **facts,
    )


def gap_promise_text(result: Mapping) -> str:
    """The bound and the fragility in words, for a gap check's detail (empty for old artifacts)."""
    promised, fragile = result.get("promise"), result.get("fragility")
    if not promised or not fragile:
        return ""
    text = (
        f"; in sample, a new should-answer question LIKE THE FIT SET'S is kept with probability >= "
        f"{promised['keep_new_answer']:.3f} (n={promised['n_answer']}; {promised['coverage']:.0%} at "
        f"{promised['confidence']:.0%} confidence needs n >= {promised['n_needed']}; the headline promise, "
        "the lowest of three figures, is under `coverage`)"
    )
    without = ", ".join(f"{_n(g)} without {k}" for k, g in fragile["gap_without"].items() if g is not None)
    if without:
        text += f"; gap {without} extreme question(s) per side"
    deciding = fragile["deciding"]
    if fragile["gap"] > 0:
        text += f"; decided by {', '.join(deciding['answer'] + deciding['decline'])}"
    elif fragile["to_open"] is not None:
        text += f"; removing {fragile['to_open']} question(s) would open it ({', '.join(fragile['opening'][:10])})"
    if fragile["one_question"]:
        text += "; DECIDED BY ONE QUESTION"
    return text


def _gating_result(calibration: Mapping, signal: str) -> Mapping | None:
    gating = calibration.get("gating") or {}
    if gating.get("signal") == signal:
        return gating.get("result")
    return (calibration.get("signals") or {}).get(signal)


def check_threshold_in_gap(calibration: Mapping, signal: str) -> dict[str, Any]:
    """The shipped threshold must lie in the gating signal's gap: above the highest gated
    should-decline score and at or below the lowest should-answer score."""
    shipped = calibration.get("shipped") or {}
    result = _gating_result(calibration, signal)
    if not shipped or shipped.get("signal") != signal:
        return _check("threshold_in_gap", False, f"No shipped {signal} threshold to place in the gap.")
    if not result or result.get("skipped") or result.get("gap") is None:
        return _check("threshold_in_gap", False, f"{signal} has no bands to place the shipped threshold in.")
    threshold = shipped["threshold"]
    answer_band, decline_band = result["answer_band"], result["decline_band"]
    bands = (
        f"should-answer band {_n(answer_band[0])} – {_n(answer_band[1])}, gated should-decline band "
        f"{_n(decline_band[0])} – {_n(decline_band[1])}"
    )
    data = {"threshold": threshold, "answer_band": answer_band, "decline_band": decline_band}
    if decline_band[1] < threshold <= answer_band[0]:
        return _check(
            "threshold_in_gap",
            True,
            f"The shipped {signal} threshold {_n(threshold)} lies in the gap ({bands}).",
            **data,
        )
    where = (
        "at or below the highest should-decline score"
        if threshold <= decline_band[1]
        else "above the lowest should-answer score"
    )
    return _check(
        "threshold_in_gap",
        False,
        f"The shipped {signal} threshold {_n(threshold)} is not in the gap: it is {where} ({bands}).",
        **data,
    )


def check_answer_coverage(calibration: Mapping, signal: str) -> dict[str, Any]:
    """The shipped threshold must keep every should-answer question."""
    shipped = calibration.get("shipped")
    if not shipped:
        return _check("answer_coverage", False, "No shipped threshold was checked against the eval set.")
    if shipped["signal"] != signal:
        return _check(
            "answer_coverage", False, f"The shipped threshold is on {shipped['signal']} but the gate gates on {signal}."
        )
    if not shipped["available"]:
        return _check(
            "answer_coverage", False, f"No question has a {signal} score, so the shipped threshold cannot be checked."
        )
    threshold, coverage = shipped["threshold"], shipped["coverage"]
    missed = shipped["wrongly_declined"]
    unscored = [q for q in shipped["unscored"] if q in _answer_ids(calibration)]
    n_unscored = len(shipped["unscored"])
    unscored_note = (
        f" {n_unscored} question(s) had no {signal} score and count as declined, as at runtime." if n_unscored else ""
    )
    if coverage == 1.0:
        return _check(
            "answer_coverage",
            True,
            f"The shipped {signal} threshold {_n(threshold)} keeps all {shipped['n']['answer']} "
            f"should-answer questions and declines {_pct(shipped['decline_recall'])} of should-decline.{unscored_note}",
            coverage=coverage,
            unscored=shipped["unscored"],
        )
    listed = ", ".join(_lost(q) for q in missed)
    if unscored:
        listed += (", " if listed else "") + ", ".join(f"{q} (no score)" for q in unscored)
    full = shipped["max_threshold_for_full_coverage"]
    return _check(
        "answer_coverage",
        False,
        f"The shipped {signal} threshold {_n(threshold)} declines {len(missed) + len(unscored)} of "
        f"{shipped['n']['answer']} should-answer questions (coverage {_n(coverage)}): {listed}. "
        f"A threshold of at most {_n(full)} keeps them all.{unscored_note}",
        coverage=coverage,
        wrongly_declined=missed,
        unscored=unscored,
    )


def check_check_set(calibration: Mapping, signal: str) -> dict[str, Any]:
    """The shipped threshold on questions that chose nothing: every should-answer one kept, every
    should-decline one of a gated kind declined (the fit set's gap, held on unseen questions)."""
    check = calibration.get("check")
    if not check:
        return _check("check_set", False, "No check set was evaluated (evals.check_set): coverage is unchecked.")
    shipped = check["shipped"]
    if shipped["signal"] != signal:
        return _check("check_set", False, f"The check set was scored on {shipped['signal']}, not {signal}.")
    missed = shipped["wrongly_declined"] + [
        {"id": q, "score": None} for q in shipped["unscored"] if q in _check_answer_ids(check)
    ]
    answered = shipped["wrongly_answered"]
    n, threshold = shipped["n"], _n(shipped["threshold"])
    repeats = [r["id"] for r in check.get("repeats_fit") or ()]
    data = {"path": check.get("path"), "n": n, "wrongly_declined": missed, "wrongly_answered": answered}
    data["repeats_fit"] = repeats  # fit questions asked again: held to the check, not counted as unseen
    again = (
        f" {len(repeats)} of its questions ask a fit question again ({_some(repeats)}): held to the check, but not "
        "counted as unseen in its coverage figure."
        if repeats
        else ""
    )
    kinds = check.get("decline_kinds", "all")
    declines = f"should-decline ({', '.join(kinds)})" if kinds != "all" else "should-decline"
    # a check set that holds none of one side tests nothing there: it would pass having compared nothing
    sides = {"answer": "should-answer", "decline": f"gated {declines}"}
    empty = [f"holds no {what} question" for side, what in sides.items() if not n[side]]
    if not missed and not answered and not empty:
        return _check(
            "check_set",
            True,
            f"The shipped {signal} threshold {threshold} keeps all {n['answer']} should-answer questions of the "
            f"check set {check.get('path')} and declines all {n['decline']} of its gated {declines} questions." + again,
            **data,
        )
    parts = list(empty)
    if missed:
        listed = ", ".join(_lost(q) for q in missed)
        parts.append(f"declines {len(missed)} of {n['answer']} should-answer questions: {listed}")
    if answered:
        listed = ", ".join(f"{q['id']} ({_n(q['score'])})" for q in answered)
        parts.append(f"answers {len(answered)} of {n['decline']} gated {declines} questions: {listed}")
    return _check(
        "check_set",
        False,
        f"On the check set {check.get('path')} (questions that chose nothing), the shipped {signal} threshold "
        f"{threshold} {'; and '.join(parts)}." + again,
        **data,
    )


def _some(ids: list[str], most: int = 10) -> str:
    return ", ".join(ids[:most]) + (f" and {len(ids) - most} more" if len(ids) > most else "")


def check_answer_model_unseen(calibration: Mapping, gating_signal: str = "answer_support") -> dict[str, Any]:
    """The answer-support model never trained on a question of the fit or the check set it gates: its scores on its
    own training questions are in-sample, and the coverage figures would claim what it has only memorised. A model
    that does not gate (another signal does) claims nothing, and is reported only."""
    seen = calibration.get("answer_model_trained_on") or {}
    named = {part: ids for part, ids in seen.items() if ids}
    if not named:
        return _check("answer_model_unseen", True, "The answer-support model trained on no fit or check question.")
    listed = "; ".join(f"{len(ids)} of the {part} set ({_some(ids)})" for part, ids in named.items())
    if gating_signal != "answer_support":
        return _check(
            "answer_model_unseen",
            True,
            f"The answer-support model was trained on {listed}, but it does not gate ({gating_signal} does): "
            "its in-sample scores decide nothing.",
            **named,
        )
    return _check(
        "answer_model_unseen",
        False,
        f"The answer-support model (answerability.answer_model_path) was trained on {listed}, or on the same ask "
        "in other words: its scores on them are in-sample. Train it on other labelled sets (recipe.json lists "
        "what it saw; sourcegate train-in-domain --drop-judged leaves such questions out).",
        **named,
    )


def unseen_check_questions(check: Mapping | None) -> dict[str, int] | None:
    """Per label, the check questions that chose nothing: all of them but those asking a fit question again."""
    if not check:
        return None
    repeats = {r["id"] for r in check.get("repeats_fit") or ()}
    labels = [q["label"] for q in check.get("questions") or () if q["id"] not in repeats]
    return {label: labels.count(label) for label in ("answer", "decline")}


def _check_answer_ids(check: Mapping) -> set[str]:
    return {q["id"] for q in check.get("questions", ()) if q["label"] == "answer"}


def _pct_share(share: Mapping) -> str:
    new = f", {share['new_sections']} new and {share['changed_sections']} changed section(s)"
    return (
        f"{share['sections']:.0%} of today's {share['n_sections']} sections and {share['chunks']:.0%} of its "
        f"{share['n_chunks']} distinct chunk texts{new if share['new_sections'] or share['changed_sections'] else ''}"
    )


def check_answer_model_corpus(calibration: Mapping, gating_signal: str) -> dict[str, Any]:
    """A corpus-specific answer model gates only the corpus it learned, and only while it has seen enough of it
    (`answerability.min_corpus_share` of today's sections): never another corpus, silently."""
    corpus = calibration.get("answer_model_corpus") or {}
    if corpus.get("scope") != "corpus":
        what = "is generic (it learned no corpus of ours)" if corpus.get("scope") == "generic" else "is not used"
        return _check("answer_model_corpus", True, f"The answer-support model {what}.", **corpus)
    share, minimum = corpus.get("share"), corpus["min_share"]
    learned = "records no corpus it learned" if share is None else f"learned {_pct_share(share)}"
    detail = f"The answer-support model {corpus.get('path')} {learned} (answerability.min_corpus_share {minimum:.0%})"
    if corpus["enough"]:
        return _check("answer_model_corpus", True, detail + ".", **corpus)
    if calibration.get("signal_choice"):
        left_out = ": left out of the choice of the gating signal (answer.signal: auto)."
        return _check("answer_model_corpus", True, detail + left_out, **corpus)
    if gating_signal != "answer_support":
        return _check("answer_model_corpus", True, detail + f": it does not gate ({gating_signal} does).", **corpus)
    return _check(
        "answer_model_corpus",
        False,
        detail
        + ": it does not gate this corpus. Retrain it on this night's version: trigger the sourcegate_recalibrate "
        "DAG (it retrains by the model's recipe on the newest night that failed for this, judges the new model and "
        "ships it through accept), or `sourcegate retrain MODEL --index RUN_DIR --out DIR`, then `calibrate` and "
        "`accept` it; or set answer.signal: auto (the gating signal is then chosen by rule from the fit set among the "
        "others).",
        **corpus,
    )


def check_decline_set_size(calibration: Mapping) -> dict[str, Any]:
    """The gated should-decline set must hold at least `min_per_label` questions: a gap over fewer
    claims more than its n supports (G6)."""
    gating = calibration.get("gating") or {}
    need = (calibration.get("config") or {}).get("min_per_label", 20)
    total = (gating.get("n") or {}).get("decline", 0)
    have = ((gating.get("result") or {}).get("n") or {}).get("decline", 0)  # the gap rests on the scored ones only
    kinds = gating.get("decline_kinds", "all")
    what = "should-decline" if kinds == "all" else f"gated should-decline ({', '.join(kinds)})"
    passed = have >= need
    verb = "holds" if passed else "holds only"
    unscored = f" with a score ({total - have} without one)" if total > have else ""
    detail = f"The {what} set {verb} {have} questions{unscored} (calibration.min_per_label: {need})."
    return _check("decline_set_size", passed, detail, n=have, min_per_label=need)


def _answer_ids(calibration: Mapping) -> set[str]:
    return {q["id"] for q in calibration.get("questions", ()) if q["label"] == "answer"}


REACCEPT = "re-accept a run you trust: `sourcegate accept RUN_DIR` writes per-question outcomes"
DEFAULT_REGRESSION = {"alpha": 0.05, "max_losses": 3, "min_kind_questions": 10, "hit_k": 1}


def precision_outcomes(per_question: Mapping[str, Mapping], k: int) -> dict[str, dict[str, Any]]:
    """hit@k per question from the rank of its first relevant passage."""
    return {
        q: {"kind": r.get("kind"), "hit": r.get("reranked_rank") is not None and r["reranked_rank"] <= k}
        for q, r in per_question.items()
    }


def decline_outcomes(per_question: Mapping[str, Mapping]) -> dict[str, dict[str, Any]]:
    """Declined or not, per should-decline question."""
    return {
        q: {"kind": r.get("kind"), "declined": bool(r["declined"])}
        for q, r in per_question.items()
        if r.get("label") == "decline"
    }


def _accepted_outcomes(name: str, baseline: Mapping | None, part: str) -> tuple[Mapping | None, dict | None]:
    """The baseline's per-question outcomes for `part`, or the check's verdict when there are none:
    passed when nothing was ever accepted, failed (with how to re-accept) when the baseline predates them."""
    if not baseline:
        return None, _check(name, True, "No accepted baseline to compare against yet.")
    accepted = (baseline.get("questions") or {}).get(part)
    if accepted is None:
        return None, _check(
            name, False, f"The accepted baseline has no per-question {part} outcomes to compare with; {REACCEPT}."
        )
    return accepted, None


def check_precision_regression(
    precision: Mapping | None, baseline: Mapping | None, regression: Mapping | None = None
) -> dict[str, Any]:
    """hit@k per question against the accepted baseline: paired wins/losses, exact McNemar."""
    cfg = {**DEFAULT_REGRESSION, **(regression or {})}
    accepted, refusal = _accepted_outcomes("precision_regression", baseline, "precision")
    if refusal:
        return refusal
    if not precision or precision.get("per_question") is None:
        return _check("precision_regression", False, "No per-question precision results to compare with the baseline.")
    if precision.get("set") == "other":  # `calibrate --questions`: not the set the baseline's outcomes are of
        return _check(
            "precision_regression",
            True,
            "Not compared: the precision questions are calibrate's --questions, not the configured precision set "
            "whose outcomes the baseline holds (a night compares those).",
        )
    k = cfg["hit_k"]
    result = compare(
        precision_outcomes(accepted, k),
        precision_outcomes(precision["per_question"], k),
        "hit",
        alpha=cfg["alpha"],
        max_losses=cfg["max_losses"],
        min_kind_questions=cfg["min_kind_questions"],
    )
    return _check("precision_regression", not result["failed"], describe(result, f"Reranked hit@{k}") + ".", **result)


def check_decline_regression(
    calibration: Mapping, baseline: Mapping | None, regression: Mapping | None = None
) -> dict[str, Any]:
    """Declined or not per should-decline question at the shipped threshold, against the baseline."""
    cfg = {**DEFAULT_REGRESSION, **(regression or {})}
    accepted, refusal = _accepted_outcomes("decline_regression", baseline, "decline")
    if refusal:
        return refusal
    current = (calibration.get("shipped") or {}).get("per_question")
    if current is None:
        return _check("decline_regression", False, "No per-question decline results to compare with the baseline.")
    result = compare(
        decline_outcomes(accepted),
        decline_outcomes(current),
        "declined",
        alpha=cfg["alpha"],
        max_losses=cfg["max_losses"],
        min_kind_questions=cfg["min_kind_questions"],
    )
    return _check(
        "decline_regression",
        not result["failed"],
        describe(result, "Should-decline questions declined at the shipped threshold") + ".",
        **result,
    )


def check_eval_sets_valid(eval_errors: Iterable[str]) -> dict[str, Any]:
    errors = [str(e) for e in eval_errors]
    if not errors:
        return _check("eval_sets_valid", True, "The eval sets are valid.")
    return _check("eval_sets_valid", False, f"The eval sets are invalid: {'; '.join(errors)}.", errors=errors)


def evaluate_gate(
    calibration: Mapping,
    precision: Mapping | None,
    baseline: Mapping | None,
    *,
    gating_signal: str,
    regression: Mapping | None = None,
    eval_errors: Iterable[str] = (),
) -> dict[str, Any]:
    """gate.json: passed, the reasons it did not, and every check."""
    checks = [
        check_threshold_gap(calibration, gating_signal),
        check_threshold_in_gap(calibration, gating_signal),
        check_answer_coverage(calibration, gating_signal),
        check_check_set(calibration, gating_signal),
        check_answer_model_unseen(calibration, gating_signal),
        check_answer_model_corpus(calibration, gating_signal),
        check_decline_set_size(calibration),
        check_precision_regression(precision, baseline, regression),
        check_decline_regression(calibration, baseline, regression),
        check_eval_sets_valid(eval_errors),
    ]
    signal = (
        (calibration.get("gating") or {}).get("result") or (calibration.get("signals") or {}).get(gating_signal) or {}
    )
    shipped = calibration.get("shipped") or {}
    fragile = signal.get("fragility") or {}
    return jsonable(
        {
            "passed": all(c["passed"] for c in checks),
            "gap_decided_by_one_question": bool(fragile.get("one_question")),
            "unscored": {"signal": gating_signal, "count": len(shipped.get("unscored") or [])},
            "gap_deciding_questions": fragile.get("deciding"),
            "coverage": calibration.get("coverage"),
            "promise": headline_text(calibration["coverage"]) if calibration.get("coverage") else None,
            "unseen_check_questions": unseen_check_questions(calibration.get("check")),
            "decision_accepted": decision_acceptance(calibration, baseline),
            "reasons": [c["detail"] for c in checks if not c["passed"]],
            "checks": checks,
            "gating_signal": gating_signal,
            "signal_choice": calibration.get("signal_choice"),  # the rule's table when answer.signal is auto
            "answer_model_corpus": calibration.get("answer_model_corpus"),
            "regression": {**DEFAULT_REGRESSION, **(regression or {})},
            "flipped": {
                c["name"]: {"lost": c["data"]["overall"]["losses"], "won": c["data"]["overall"]["wins"]}
                for c in checks
                if c["name"] in ("precision_regression", "decline_regression") and "overall" in c["data"]
            },
            "thresholds": {
                "shipped": shipped.get("threshold"),
                "strong": shipped.get("strong_threshold"),
                "recommended": signal.get("recommended_threshold"),
                "max_for_full_coverage": shipped.get("max_threshold_for_full_coverage"),
            },
        }
    )


def gating_signal_text(gate: Mapping) -> str:
    """One line for the night's summary: which signal gated, at what threshold, and whether the rule chose it
    (`answer.signal: auto`) and why, so a first night on a new corpus says what it decided without gate.json."""
    signal, threshold = gate.get("gating_signal"), (gate.get("thresholds") or {}).get("shipped")
    at = "" if threshold is None else f" at {_n(threshold)}"
    choice = gate.get("signal_choice")
    if not choice:
        return f"signal: {signal}{at} (set by answer.signal)"
    if choice.get("signal") is None:
        return "signal: none (answer.signal: auto): no candidate was eligible; each one's reason is in gate.json's signal_choice"
    return f"signal: {signal}{at}, chosen by rule on the fit set (answer.signal: auto): {choice.get('why')}"


def write_gate(gate: Mapping, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write gate.json and junit.xml into out_dir, each atomically."""
    out = Path(out_dir)
    return {"gate": write_json(gate, out / rf.GATE), "junit": write_text(junit_xml(gate), out / rf.JUNIT)}
