"""evals.gate: each check fails for its reason, and the JUnit XML says so."""

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from evals.calibration import calibrate
from evals.gate import evaluate_gate, junit_xml, write_gate
from evals.precision import precision_eval

SIGNAL = "rerank_top"


def eval_records(answer_scores, decline_scores):
    recs = [
        {
            "id": f"a-{i:03d}",
            "question": f"how do I {i}?",
            "label": "answer",
            "kind": "howto",
            "signals": {SIGNAL: float(s)},
        }
        for i, s in enumerate(answer_scores)
    ]
    recs += [
        {
            "id": f"d-{i:03d}",
            "question": f"off topic {i}",
            "label": "decline",
            "kind": "offtopic",
            "signals": {SIGNAL: float(s)},
        }
        for i, s in enumerate(decline_scores)
    ]
    return recs


def calibration_for(answer_scores, decline_scores, shipped):
    config = {
        "signals": [SIGNAL],
        "gating": {"signal": SIGNAL, "adjacent": shipped, "strong": max(shipped, 0.6)},
    }
    return calibrate(eval_records(answer_scores, decline_scores), config)


def precision_for(p1_by_kind):
    """A precision.json shape with given reranked p@1 per kind."""

    def stats(p1):
        metrics = {"p@1": p1, "p@3": 0.5, "p@5": 0.4, "ndcg@10": 0.7, "recall@5": 0.8, "mrr": 0.75}
        return {"n": 10, "fused": metrics, "reranked": metrics, "delta": {k: 0.0 for k in metrics}}

    mean = sum(p1_by_kind.values()) / len(p1_by_kind)
    return {
        "ks": [1, 3, 5],
        "overall": stats(mean),
        "by_kind": {k: stats(v) for k, v in p1_by_kind.items()},
        "losses": [],
        "wins": 0,
        "ties": 20,
    }


BASELINE = {
    "reranked": {
        "overall": {"p@1": 0.7, "p@3": 0.5},
        "by_kind": {"howto": {"p@1": 0.7}, "fact": {"p@1": 0.7, "mrr": 0.7}},
    }
}
GOOD_CALIBRATION = calibration_for(np.linspace(0.3, 0.9, 30), np.linspace(0.0, 0.2, 30), shipped=0.25)
GOOD_PRECISION = precision_for({"howto": 0.7, "fact": 0.7})


def failed(gate):
    return {c["name"] for c in gate["checks"] if not c["passed"]}


def run_gate(calibration=GOOD_CALIBRATION, precision=GOOD_PRECISION, baseline=BASELINE, **kw):
    return evaluate_gate(calibration, precision, baseline, gating_signal=SIGNAL, tolerance=0.05, **kw)


def test_all_good_passes():
    gate = run_gate()
    assert gate["passed"] is True and gate["reasons"] == [] and failed(gate) == set()
    assert [c["name"] for c in gate["checks"]] == [
        "threshold_gap",
        "threshold_in_gap",
        "answer_coverage",
        "precision_regression",
        "decline_regression",
        "eval_sets_valid",
    ]
    assert gate["thresholds"]["shipped"] == 0.25
    assert gate["thresholds"]["max_for_full_coverage"] == pytest.approx(0.3)
    json.dumps(gate, allow_nan=False)


def test_safe_looking_high_threshold_cannot_sneak_through():
    calibration = calibration_for(np.linspace(0.3, 0.9, 30), np.linspace(0.0, 0.2, 30), shipped=0.99)
    gate = run_gate(calibration)
    assert gate["passed"] is False and failed(gate) == {"threshold_in_gap", "answer_coverage"}
    check = next(c for c in gate["checks"] if c["name"] == "answer_coverage")
    assert len(check["data"]["wrongly_declined"]) == 30
    assert "a-000 (0.3)" in check["detail"] and "declines 30 of 30" in check["detail"]
    assert len(gate["reasons"]) == 2 and all("0.99" in r for r in gate["reasons"])
    assert "above the lowest should-answer score" in gate["reasons"][0]


def test_overlapping_bands_fail_threshold_gap():
    calibration = calibration_for(np.linspace(0.3, 0.9, 30), np.linspace(0.0, 0.5, 30), shipped=0.3)
    gate = run_gate(calibration)
    assert failed(gate) == {"threshold_gap", "threshold_in_gap"}
    assert "no threshold gap" in gate["reasons"][0]


def test_precision_regression_names_kind_and_metric():
    gate = run_gate(precision=precision_for({"howto": 0.7, "fact": 0.6}))
    assert failed(gate) == {"precision_regression"}
    check = next(c for c in gate["checks"] if c["name"] == "precision_regression")
    # overall p@1 is 0.65 = 0.7 - 0.05: within tolerance; only "fact" regressed.
    assert check["data"]["regressions"] == [{"kind": "fact", "metric": "p@1", "baseline": 0.7, "value": 0.6}]
    assert "p@1 for kind 'fact' is 0.6, below baseline 0.7" in gate["reasons"][0]


def test_precision_exactly_at_tolerance_passes():
    gate = run_gate(precision=precision_for({"howto": 0.65, "fact": 0.65}))  # 0.7 - 0.05
    assert gate["passed"] is True


def test_missing_kind_is_a_regression():
    gate = run_gate(precision=precision_for({"howto": 0.9}))
    assert failed(gate) == {"precision_regression"}
    assert "kind 'fact' is missing" in gate["reasons"][0]


def test_no_baseline_yet_passes():
    assert run_gate(baseline=None)["passed"] is True


def test_precision_from_precision_eval_is_accepted():
    items = [{"id": "q1", "kind": "howto"}, {"id": "q2", "kind": "fact"}]
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}}
    precision = precision_eval(items, {"q1": ["a"], "q2": ["b"]}, {"q1": ["a"], "q2": ["x", "b"]}, qrels)
    gate = run_gate(precision=precision)
    assert failed(gate) == {"precision_regression"}
    assert "kind 'fact' is 0, below baseline 0.7" in gate["reasons"][0]


def test_invalid_eval_sets_fail_with_messages():
    gate = run_gate(eval_errors=["answer.jsonl: duplicate id a-003"])
    assert failed(gate) == {"eval_sets_valid"}
    assert "duplicate id a-003" in gate["reasons"][0]


def test_missing_gating_signal_fails():
    gate = evaluate_gate(GOOD_CALIBRATION, GOOD_PRECISION, BASELINE, gating_signal="cosine_top", tolerance=0.05)
    assert {"threshold_gap", "answer_coverage"} <= failed(gate)


def test_junit_has_a_failure_exactly_for_failed_checks(tmp_path):
    calibration = calibration_for(np.linspace(0.3, 0.9, 30), np.linspace(0.0, 0.5, 30), shipped=0.99)
    gate = run_gate(calibration, eval_errors=['bad <row> & "quote" \x01 in file'])
    paths = write_gate(gate, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gate.json", "junit.xml"]  # no temp files left
    assert json.loads(paths["gate"].read_text()) == gate
    root = ET.parse(paths["junit"]).getroot()
    suites = list(root.iter("testsuite"))
    assert len(suites) == 1 and suites[0].get("name") == "sourcegate-gate"
    cases = {c.get("name"): c for c in suites[0].iter("testcase")}
    assert set(cases) == {c["name"] for c in gate["checks"]}
    with_failure = {name for name, case in cases.items() if case.find("failure") is not None}
    assert with_failure == failed(gate) == {"threshold_gap", "threshold_in_gap", "answer_coverage", "eval_sets_valid"}
    assert suites[0].get("failures") == "4" and suites[0].get("tests") == "6"
    message = cases["eval_sets_valid"].find("failure").get("message")
    assert 'bad <row> & "quote"' in message


def test_junit_all_passing_has_no_failure():
    root = ET.fromstring(junit_xml(run_gate()).encode())
    assert root.find(".//failure") is None and len(root.findall(".//testcase")) == 6


def mixed_records():
    """Off-topic declines separate; near-topic ones overlap the should-answer band."""
    recs = eval_records(np.linspace(0.3, 0.9, 30), np.linspace(0.0, 0.1, 20))
    recs += [
        {
            "id": f"n-{i:03d}",
            "question": f"near {i}",
            "label": "decline",
            "kind": "near_topic",
            "signals": {SIGNAL: float(s)},
        }
        for i, s in enumerate(np.linspace(0.1, 0.95, 10))
    ]
    return recs


def test_gap_scope_holds_only_the_listed_decline_kinds_to_the_gap():
    base = {
        "signals": [SIGNAL],
        "gating": {"signal": SIGNAL, "adjacent": 0.25, "strong": 0.6},
    }
    everything = calibrate(mixed_records(), base)
    assert failed(run_gate(everything, baseline={})) == {"threshold_gap", "threshold_in_gap"}
    scoped = calibrate(mixed_records(), {**base, "gate_decline_kinds": ["offtopic"]})
    gate = run_gate(scoped, baseline={})
    assert gate["passed"], gate["reasons"]
    assert scoped["gating"]["n"] == {"answer": 30, "decline": 20}
    # the near-topic questions are still swept and reported, with their decline recall
    assert scoped["signals"][SIGNAL]["has_gap"] is False
    assert scoped["shipped"]["decline_recall_by_kind"]["near_topic"] == {"n": 10, "declined": 2, "recall": 0.2}


def test_decline_recall_regression_per_kind_fails_the_gate():
    scoped = calibrate(
        mixed_records(),
        {
            "signals": [SIGNAL],
            "gate_decline_kinds": ["offtopic"],
            "gating": {"signal": SIGNAL, "adjacent": 0.25, "strong": 0.6},
        },
    )
    ok = run_gate(scoped, baseline={"decline_recall_by_kind": {"near_topic": 0.2, "offtopic": 1.0}})
    assert ok["passed"], ok["reasons"]
    gate = run_gate(scoped, baseline={"decline_recall_by_kind": {"near_topic": 0.5}})
    assert failed(gate) == {"decline_regression"}
    assert "kind 'near_topic' declines 20%, below baseline 50%" in gate["reasons"][0]


def test_threshold_below_the_off_topic_band_fails_naming_both_bands():
    # Gap 0.2 .. 0.3, but the shipped threshold 0.15 would answer the should-decline 0.2.
    calibration = calibration_for(np.linspace(0.3, 0.9, 30), np.linspace(0.0, 0.2, 30), shipped=0.15)
    gate = run_gate(calibration)
    assert failed(gate) == {"threshold_in_gap"}
    (reason,) = gate["reasons"]
    assert "threshold 0.15 is not in the gap: it is at or below the highest should-decline score" in reason
    assert "should-answer band 0.3 – 0.9" in reason and "should-decline band 0 – 0.2" in reason


def test_threshold_at_the_lowest_answer_is_in_the_gap_and_at_the_highest_decline_is_not():
    at_answer = calibration_for(np.linspace(0.3, 0.9, 30), np.linspace(0.0, 0.2, 30), shipped=0.3)
    assert run_gate(at_answer)["passed"] is True
    at_decline = calibration_for(np.linspace(0.3, 0.9, 30), np.linspace(0.0, 0.2, 30), shipped=0.2)
    assert failed(run_gate(at_decline)) == {"threshold_in_gap"}


def test_gap_check_states_the_bound_and_flags_a_gap_decided_by_one_question():
    # One should-answer question (a-000 at 0.25) sits alone near the off-topic band.
    calibration = calibration_for([0.25, *np.linspace(0.6, 0.9, 29)], np.linspace(0.0, 0.2, 30), shipped=0.22)
    gate = run_gate(calibration)
    assert gate["passed"] is True and gate["gap_decided_by_one_question"] is True
    assert gate["gap_deciding_questions"] == {"answer": ["a-000"], "decline": ["d-029"]}
    check = next(c for c in gate["checks"] if c["name"] == "threshold_gap")
    assert "kept with probability >= 0.968 (n=30" in check["detail"]  # 30/31
    assert "needs n >= 299" in check["detail"] and "DECIDED BY ONE QUESTION" in check["detail"]
    assert check["data"]["fragility"]["gap_without"]["1"] == pytest.approx(0.6 - 0.2 * 28 / 29)
    assert run_gate()["gap_decided_by_one_question"] is False
