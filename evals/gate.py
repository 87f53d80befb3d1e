"""The release gate: one verdict from the calibration and precision artifacts.

The gate fails the run (and so blocks promotion) when the gating signal has no
threshold gap, when the shipped threshold declines any should-answer question,
when reranked precision fell below the accepted baseline beyond tolerance, or
when the eval sets themselves were invalid.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pipelines.io import jsonable, write_json, write_text

# Float slack for ">= baseline - tolerance": 0.7 - 0.1 must not fail 0.6.
EPSILON = 1e-9
# Characters XML 1.0 cannot carry even escaped (question text may hold them).
_XML_ILLEGAL = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _check(name: str, passed: bool, detail: str, **data: Any) -> dict[str, Any]:
    return {"name": name, "passed": bool(passed), "detail": detail, "data": data}


def _n(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


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
        f"; a new should-answer question is kept with probability >= {promised['keep_new_answer']:.3f} "
        f"(n={promised['n_answer']}; {promised['coverage']:.0%} at {promised['confidence']:.0%} confidence "
        f"needs n >= {promised['n_needed']})"
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
    if coverage == 1.0:
        return _check(
            "answer_coverage",
            True,
            f"The shipped {signal} threshold {_n(threshold)} keeps all {shipped['n']['answer']} "
            f"should-answer questions and declines {_pct(shipped['decline_recall'])} of should-decline.",
            coverage=coverage,
        )
    listed = ", ".join(f"{q['id']} ({_n(q['score'])})" for q in missed)
    if unscored:
        listed += (", " if listed else "") + ", ".join(f"{q} (no score)" for q in unscored)
    full = shipped["max_threshold_for_full_coverage"]
    return _check(
        "answer_coverage",
        False,
        f"The shipped {signal} threshold {_n(threshold)} declines {len(missed) + len(unscored)} of "
        f"{shipped['n']['answer']} should-answer questions (coverage {_n(coverage)}): {listed}. "
        f"A threshold of at most {_n(full)} keeps them all.",
        coverage=coverage,
        wrongly_declined=missed,
        unscored=unscored,
    )


def _answer_ids(calibration: Mapping) -> set[str]:
    return {q["id"] for q in calibration.get("questions", ()) if q["label"] == "answer"}


def _regressions(scope: str, current: Mapping | None, accepted: Mapping, tolerance: float) -> list[dict]:
    found = []
    for metric, base in accepted.items():
        value = (current or {}).get(metric)
        if value is None or value + EPSILON < base - tolerance:
            found.append({"kind": scope, "metric": metric, "baseline": base, "value": value})
    return found


def check_precision_regression(precision: Mapping | None, baseline: Mapping | None, tolerance: float) -> dict[str, Any]:
    """Reranked precision, overall and per kind, must be >= baseline - tolerance."""
    accepted = (baseline or {}).get("reranked") or {}
    if not accepted:
        return _check("precision_regression", True, "No accepted baseline to compare against yet.")
    if not precision or not precision.get("overall"):
        return _check("precision_regression", False, "No precision results to compare with the baseline.")
    found = _regressions("overall", precision["overall"]["reranked"], accepted.get("overall", {}), tolerance)
    by_kind = precision.get("by_kind", {})
    for kind, metrics in sorted(accepted.get("by_kind", {}).items()):
        found += _regressions(kind, (by_kind.get(kind) or {}).get("reranked"), metrics, tolerance)
    if not found:
        return _check(
            "precision_regression",
            True,
            f"Reranked precision is within {tolerance:g} of the accepted baseline everywhere.",
        )
    lines = [
        f"{r['metric']} for {'all questions' if r['kind'] == 'overall' else 'kind ' + repr(r['kind'])} "
        + (
            f"is {_n(r['value'])}, below baseline {_n(r['baseline'])} - tolerance {tolerance:g}"
            if r["value"] is not None
            else "is missing from this run"
        )
        for r in found
    ]
    return _check(
        "precision_regression", False, f"Reranked precision regressed: {'; '.join(lines)}.", regressions=found
    )


def check_decline_regression(calibration: Mapping, baseline: Mapping | None, tolerance: float) -> dict[str, Any]:
    """Decline recall per should-decline kind at the shipped threshold must not fall below the baseline."""
    accepted = (baseline or {}).get("decline_recall_by_kind") or {}
    if not accepted:
        return _check("decline_regression", True, "No accepted decline-recall baseline to compare against yet.")
    current = (calibration.get("shipped") or {}).get("decline_recall_by_kind") or {}
    found = [
        {"kind": k, "baseline": base, "value": (current.get(k) or {}).get("recall")}
        for k, base in sorted(accepted.items())
        if (current.get(k) or {}).get("recall") is None or current[k]["recall"] + EPSILON < base - tolerance
    ]
    summary = ", ".join(f"{k} {v['declined']}/{v['n']}" for k, v in current.items())
    if not found:
        return _check(
            "decline_regression",
            True,
            f"Decline recall per kind is within {tolerance:g} of the accepted baseline ({summary}).",
        )
    lines = [
        f"kind {r['kind']!r} declines {_pct(r['value'])}, below baseline {_pct(r['baseline'])} - "
        f"tolerance {tolerance:g}"
        for r in found
    ]
    return _check("decline_regression", False, f"Decline recall regressed: {'; '.join(lines)}.", regressions=found)


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
    tolerance: float,
    eval_errors: Iterable[str] = (),
) -> dict[str, Any]:
    """gate.json: passed, the reasons it did not, and every check."""
    checks = [
        check_threshold_gap(calibration, gating_signal),
        check_threshold_in_gap(calibration, gating_signal),
        check_answer_coverage(calibration, gating_signal),
        check_precision_regression(precision, baseline, tolerance),
        check_decline_regression(calibration, baseline, tolerance),
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
            "gap_deciding_questions": fragile.get("deciding"),
            "reasons": [c["detail"] for c in checks if not c["passed"]],
            "checks": checks,
            "gating_signal": gating_signal,
            "tolerance": tolerance,
            "thresholds": {
                "shipped": shipped.get("threshold"),
                "strong": shipped.get("strong_threshold"),
                "recommended": signal.get("recommended_threshold"),
                "max_for_full_coverage": shipped.get("max_threshold_for_full_coverage"),
            },
        }
    )


def _xml_text(text: Any) -> str:
    return _XML_ILLEGAL.sub("\ufffd", str(text))


def junit_xml(gate: Mapping) -> str:
    """One <testcase> per check in one <testsuite name="sourcegate-gate">."""
    checks = gate["checks"]
    failures = sum(not c["passed"] for c in checks)
    suites = ET.Element("testsuites", tests=str(len(checks)), failures=str(failures))
    suite = ET.SubElement(
        suites,
        "testsuite",
        name="sourcegate-gate",
        tests=str(len(checks)),
        failures=str(failures),
        errors="0",
        skipped="0",
    )
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname="sourcegate.gate", name=_xml_text(c["name"]))
        if c["passed"]:
            ET.SubElement(case, "system-out").text = _xml_text(c["detail"])
        else:
            failure = ET.SubElement(case, "failure", message=_xml_text(c["detail"]), type="GateCheckFailed")
            failure.text = _xml_text(c["detail"])
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def write_gate(gate: Mapping, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write gate.json and junit.xml into out_dir, each atomically."""
    out = Path(out_dir)
    return {"gate": write_json(gate, out / "gate.json"), "junit": write_text(junit_xml(gate), out / "junit.xml")}
