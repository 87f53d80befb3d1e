"""`answer.signal: auto`: the gating signal chosen per corpus by the written rule (sourcegate/evals/signal_choice.py), the gate
holding an answer model to the corpus it learned (sourcegate/evals/gate.py `answer_model_corpus`), on hand-made records."""

import numpy as np

from sourcegate.evals.calibration import calibrate
from sourcegate.evals.gate import evaluate_gate
from sourcegate.evals.signal_choice import AUTO, choose, resolve

OPTIONS = {"placement": "tightest", "min_per_label": 5, "coverage": 0.99, "confidence": 0.95}


def records(columns: dict[str, tuple[list[float], list[float]]], decline_kind: str = "off_topic") -> list[dict]:
    """Should-answer then should-decline questions, each signal's scores given per label."""
    first = next(iter(columns.values()))
    n_answer, n_decline = len(first[0]), len(first[1])
    rows = []
    for i in range(n_answer):
        signals = {name: a[i] for name, (a, _) in columns.items()}
        rows.append({"id": f"a-{i}", "question": f"q{i}", "label": "answer", "kind": "single", "signals": signals})
    for i in range(n_decline):
        signals = {name: d[i] for name, (_, d) in columns.items()}
        rows.append({"id": f"d-{i}", "question": f"o{i}", "label": "decline", "kind": decline_kind, "signals": signals})
    return rows


ANSWER = np.linspace(0.5, 0.9, 25).tolist()
WIDE = (ANSWER, np.linspace(0.0, 0.2, 20).tolist())  # a gap, held out too
NARROW = ([0.21, *ANSWER[1:]], np.linspace(0.0, 0.2, 20).tolist())  # a gap resting on one should-answer question
OVERLAP = (ANSWER, [*np.linspace(0.0, 0.2, 19).tolist(), 0.7])  # no gap, AUC high


def test_the_rule_picks_the_widest_gap_relative_to_each_signals_own_spread():
    # NARROW's raw gap (0.01) is wider than WIDE's once WIDE is scaled down 1000 times (0.0003), but relative to each
    # signal's own spread WIDE's gap is the wider: the rule does not depend on a signal's units
    small = ([a / 1000 for a in WIDE[0]], [d / 1000 for d in WIDE[1]])
    choice = choose(records({"narrow": NARROW, "wide": small}), ["narrow", "wide"], ["off_topic"], OPTIONS)
    rows = {r["signal"]: r for r in choice["candidates"]}
    assert rows["narrow"]["has_gap"] and rows["wide"]["has_gap"]
    assert rows["narrow"]["gap"] > rows["wide"]["gap"] and rows["narrow"]["relative_gap"] < rows["wide"]["relative_gap"]
    assert choice["signal"] == "wide" and choice["threshold"] == 0.0005  # tightest: the lowest should-answer score


def test_ties_go_to_the_earlier_candidate_and_no_gap_falls_back_to_auc():
    tie = choose(records({"x": WIDE, "y": WIDE}), ["y", "x"], [], OPTIONS)
    assert tie["signal"] == "y"
    none = choose(records({"x": OVERLAP, "z": ([0.5] * 25, [0.5] * 20)}), ["z", "x"], [], OPTIONS)
    assert none["signal"] == "x" and "no candidate has a gap" in none["why"]


def test_an_excluded_or_unscored_candidate_is_named_with_why_and_never_picked():
    recs = records({"cosine_top": NARROW, "answer_support": WIDE})
    recs[0]["signals"]["rerank_top"] = 0.9  # scored on one question only (the reranker failed on the rest)
    choice = choose(
        recs, ["rerank_top", "answer_support", "cosine_top"], [], OPTIONS, excluded={"answer_support": "learned 0%"}
    )
    rows = {r["signal"]: r for r in choice["candidates"]}
    assert rows["answer_support"] == {"signal": "answer_support", "order": 1, "eligible": False, "why": "learned 0%"}
    assert not rows["rerank_top"]["eligible"] and "scored on 1 of the 45" in rows["rerank_top"]["why"]
    assert choice["signal"] == "cosine_top"


def test_only_the_gated_decline_kinds_decide_the_gap():
    recs = records({"s": WIDE}) + records({"s": ([], [0.95])}, decline_kind="near_topic")
    recs[-1]["id"] = "near-0"
    assert choose(recs, ["s"], ["off_topic"], OPTIONS)["candidates"][0]["has_gap"]
    assert not choose(recs, ["s"], [], OPTIONS)["candidates"][0]["has_gap"]


def config(signal: str, **extra) -> dict:
    gating = {"signal": signal, "adjacent": 0.99, "strong": 0.5, "strong_signal": "rerank_top", "below": "decline"}
    return {"signals": ["cosine_top", "rerank_top"], "gating": gating, "gate_decline_kinds": ["off_topic"]} | {
        "placement": "tightest",
        "min_per_label": 5,
        "candidates": ["rerank_top", "cosine_top"],
        **extra,
    }


def test_auto_resolves_to_the_pick_and_its_threshold_and_an_explicit_signal_is_left_alone():
    recs = records({"cosine_top": WIDE, "rerank_top": OVERLAP})
    resolved, choice = resolve(recs, config(AUTO))
    assert choice["signal"] == "cosine_top" and resolved["gating"]["signal"] == "cosine_top"
    assert resolved["gating"]["adjacent"] == 0.5 == choice["threshold"]
    assert resolve(recs, config("rerank_top")) == (config("rerank_top"), None)


def test_a_night_on_auto_gates_on_the_pick_and_the_gate_says_so():
    recs = records({"cosine_top": WIDE, "rerank_top": OVERLAP})
    resolved, choice = resolve(recs, config(AUTO))
    calibration = {**calibrate(recs, resolved), "signal_choice": choice}
    gate = evaluate_gate(calibration, None, None, gating_signal=choice["signal"])
    names = {c["name"]: c for c in gate["checks"]}
    assert gate["gating_signal"] == "cosine_top" and gate["signal_choice"]["signal"] == "cosine_top"
    assert names["threshold_gap"]["passed"] and names["threshold_in_gap"]["passed"]
    assert names["answer_coverage"]["passed"]


def corpus(enough: bool, scope: str = "corpus") -> dict:
    share = {"sections": 1.0 if enough else 0.0, "chunks": 1.0 if enough else 0.0, "n_sections": 40, "n_chunks": 90}
    share |= {"new_sections": 0 if enough else 40, "changed_sections": 0, "learned_version": "r1"}
    return {"scope": scope, "path": "models/x", "share": share, "min_share": 0.9, "enough": enough}


def corpus_check(calibration: dict, signal: str) -> dict:
    gate = evaluate_gate(calibration, None, None, gating_signal=signal)
    return next(c for c in gate["checks"] if c["name"] == "answer_model_corpus") | {"gate": gate}


def test_an_answer_model_that_learned_another_corpus_never_gates_silently():
    # explicit answer_support on a model that learned none of this corpus: the gate fails, naming the share
    failed = corpus_check({"answer_model_corpus": corpus(False)}, "answer_support")
    assert not failed["passed"] and "0% of today's 40 sections" in failed["detail"]
    assert "answer.signal: auto" in failed["detail"] and failed["gate"]["answer_model_corpus"]["enough"] is False
    # the same model under auto: left out of the choice, said so; gating on another signal: it does not gate
    auto = corpus_check({"answer_model_corpus": corpus(False), "signal_choice": {"signal": "cosine_top"}}, "cosine_top")
    assert auto["passed"] and "left out of the choice" in auto["detail"]
    other = corpus_check({"answer_model_corpus": corpus(False)}, "rerank_top")
    assert other["passed"] and "it does not gate (rerank_top does)" in other["detail"]
    # enough of this corpus, or a generic model: it may gate
    assert corpus_check({"answer_model_corpus": corpus(True)}, "answer_support")["passed"]
    generic = corpus_check({"answer_model_corpus": {"scope": "generic", "path": "models/answer_support"}}, "x")
    assert generic["passed"] and "generic" in generic["detail"]


def test_a_model_that_records_no_corpus_it_learned_may_not_gate():
    unrecorded = {"scope": "corpus", "path": "models/old", "share": None, "min_share": 0.9, "enough": False}
    check = corpus_check({"answer_model_corpus": unrecorded}, "answer_support")
    assert not check["passed"] and "records no corpus it learned" in check["detail"]
