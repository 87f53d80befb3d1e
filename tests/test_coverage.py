"""Placement rules, cross-fitted coverage, the exact bound, the check set in the gate, and `accept` retiring the
check set a new threshold has seen (its questions into the fit set, the next-check set in its place)."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.stats import beta, binomtest

from sourcegate.artifact_io import write_json
from sourcegate.evals.calibration import calibrate
from sourcegate.evals.check_set import move_to_fit, seen_check_questions
from sourcegate.evals.gate import evaluate_gate
from sourcegate.evals.placement import cross_fitted, exact_lower_bound, folds_of, place
from sourcegate.evals.precision import precision_eval
from sourcegate.evals.regression import BaselineError, baseline_from, check_baseline
from sourcegate.pipelines.app.cli import main

SIGNAL = "rerank_top"


def records(answer, decline, prefix="", decline_kind="off_topic"):
    rows = [
        {"id": f"{prefix}a-{i}", "question": f"q{i}?", "label": "answer", "kind": "single", "signals": {SIGNAL: s}}
        for i, s in enumerate(answer)
    ]
    return rows + [
        {"id": f"{prefix}d-{i}", "question": f"o{i}?", "label": "decline", "kind": decline_kind, "signals": {SIGNAL: s}}
        for i, s in enumerate(decline)
    ]


def config(adjacent, **extra):
    gating = {"signal": SIGNAL, "adjacent": adjacent, "strong": 0.5}
    return {"signals": [SIGNAL], "gating": gating, "gate_decline_kinds": ["off_topic"], **extra}


FIT = records(np.linspace(0.3, 0.9, 25).tolist(), np.linspace(0.0, 0.05, 20).tolist())


def test_placement_rules_by_hand():
    answer, decline = [0.2567, 0.8], [0.0019, 0.001]
    assert place(answer, decline, "tightest") == 0.2567
    assert place(answer, decline, "midpoint") == pytest.approx((0.2567 + 0.0019) / 2)
    # logit midpoint: the geometric mean of the odds, back to a probability
    odds = math.sqrt(0.2567 / 0.7433 * 0.0019 / 0.9981)
    assert place(answer, decline, "logit_midpoint") == pytest.approx(odds / (1 + odds))
    assert place(answer, decline, "logit_midpoint") == pytest.approx(0.0250, abs=1e-4)  # linear: 0.1293
    assert place([0.3], [0.5], "midpoint") == 0.3  # no gap: every rule is the tightest
    with pytest.raises(ValueError, match="placement must be one of"):
        place(answer, decline, "middle")


def test_cross_fitted_coverage_equals_a_hand_computation():
    # answers a0..a5 (input order), declines d0..d3; k = 2: round-robin folds per label
    answer = [0.9, 0.2, 0.8, 0.7, 0.3, 0.6]
    decline = [0.1, 0.25, 0.05, 0.15]
    scores, labels = answer + decline, [True] * 6 + [False] * 4
    assert folds_of(labels, 2).tolist() == [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
    # fold 0 = a0 a2 a4 (0.9 0.8 0.3), d0 d2 (0.1 0.05); trained on fold 1: a 0.2 0.7 0.6, d 0.25 0.15
    #   no gap there (0.2 <= 0.25): threshold 0.2 -> keeps all 3, declines d0 0.1 and d2 0.05
    # fold 1 = a1 a3 a5 (0.2 0.7 0.6), d1 d3 (0.25 0.15); trained on fold 0: a min 0.3, d max 0.1
    #   midpoint 0.2 -> keeps all 3 (0.2 >= 0.2), declines d3 0.15 but not d1 0.25
    mid = cross_fitted(scores, labels, "midpoint", 2)
    assert (mid["kept"], mid["n_answer"], mid["declined"], mid["n_decline"]) == (6, 6, 3, 4)
    assert mid["thresholds"] == pytest.approx([0.2, 0.2])
    # tightest: fold 0 threshold 0.2 (as above); fold 1 threshold 0.3 declines a1 (0.2), d1 and d3
    tight = cross_fitted(scores, labels, "tightest", 2)
    assert (tight["kept"], tight["declined"], tight["missed"]) == (5, 4, [1])
    assert tight["coverage"] == pytest.approx(5 / 6)


def test_exact_lower_bound_is_clopper_pearson():
    for kept, n in ((72, 72), (65, 72), (0, 10), (47, 48)):
        ours = exact_lower_bound(kept, n, 0.95)
        assert ours == pytest.approx(binomtest(kept, n).proportion_ci(0.95, method="exact").low)
        # the Clopper-Pearson lower end by its definition: the alpha/2 quantile of Beta(k, n - k + 1)
        assert ours == pytest.approx(beta.ppf(0.025, kept, n - kept + 1) if kept else 0.0)
    assert exact_lower_bound(72, 72, 0.95) == pytest.approx(0.025 ** (1 / 72))
    assert exact_lower_bound(0, 0, 0.95) is None


def test_three_coverage_figures_and_the_lowest_is_the_headline():
    check = records([0.5] * 40, [0.0] * 5, prefix="c-")
    cal = calibrate(FIT, config(0.1, cross_fit_folds=5), check, "check.jsonl")
    figures = {f["name"]: f for f in cal["coverage"]["figures"]}
    assert figures["in_sample"]["value"] == pytest.approx(25 / 26)
    assert "like the fit set's" in figures["in_sample"]["assumes"]
    assert figures["cross_fitted"]["value"] == pytest.approx(cross_fitted(*_gated(FIT), "tightest", 5)["coverage"])
    assert figures["check"]["value"] == pytest.approx(binomtest(40, 40).proportion_ci(0.95, method="exact").low)
    low = min(figures.values(), key=lambda f: f["value"])
    assert cal["coverage"]["headline"]["name"] == low["name"]
    gate = evaluate_gate(cal, None, None, gating_signal=SIGNAL)
    assert gate["coverage"]["headline"]["value"] == low["value"] and "lowest of 3" in gate["promise"]


def _gated(rows):
    return [r["signals"][SIGNAL] for r in rows], [r["label"] == "answer" for r in rows]


def failed(gate):
    return {c["name"] for c in gate["checks"] if not c["passed"]}


def test_a_declined_check_question_fails_the_gate_naming_it_and_its_score():
    check = records([0.5, 0.0047, 0.4], [0.0, 0.2], prefix="c-")
    gate = evaluate_gate(calibrate(FIT, config(0.1), check, "check.jsonl"), None, None, gating_signal=SIGNAL)
    assert not gate["passed"] and "check_set" in failed(gate)
    detail = next(c["detail"] for c in gate["checks"] if c["name"] == "check_set")
    assert "c-a-1 (0.0047)" in detail and "declines 1 of 3" in detail
    # an off-topic check question above the threshold is held to the gap like the fit set's
    assert "answers 1 of 2 gated should-decline (off_topic) questions: c-d-1 (0.2)" in detail


def test_near_topic_check_declines_are_not_held_to_the_gap():
    check = records([0.5], [0.3], prefix="c-", decline_kind="near_topic") + records([], [0.0], prefix="o-")
    gate = evaluate_gate(calibrate(FIT, config(0.1), check, "check.jsonl"), None, None, gating_signal=SIGNAL)
    assert "check_set" not in failed(gate)  # the near-topic one above the threshold; the off-topic one declined


def test_a_check_set_that_holds_nothing_the_gate_tests_fails_rather_than_pass_having_compared_nothing():
    only_near = records([], [0.3] * 5, prefix="c-", decline_kind="near_topic")  # no answer, no gated decline
    gate = evaluate_gate(calibrate(FIT, config(0.1), only_near, "check.jsonl"), None, None, gating_signal=SIGNAL)
    detail = next(c["detail"] for c in gate["checks"] if c["name"] == "check_set")
    assert "check_set" in failed(gate)
    assert "holds no should-answer question; and holds no gated should-decline (off_topic) question" in detail
    answers_only = records([0.5, 0.6], [], prefix="c-")
    gate = evaluate_gate(calibrate(FIT, config(0.1), answers_only, "check.jsonl"), None, None, gating_signal=SIGNAL)
    assert "check_set" in failed(gate)


def test_no_check_set_fails_the_gate():
    gate = evaluate_gate(calibrate(FIT, config(0.1)), None, None, gating_signal=SIGNAL)
    assert "check_set" in failed(gate)


def test_a_gated_decline_set_smaller_than_min_per_label_fails():
    small = records(np.linspace(0.3, 0.9, 25).tolist(), [0.0] * 14)
    check = records([0.5], [0.0], prefix="c-")
    gate = evaluate_gate(calibrate(small, config(0.1, min_per_label=20), check), None, None, gating_signal=SIGNAL)
    assert failed(gate) == {"decline_set_size"}
    assert "holds only 14 questions (calibration.min_per_label: 20)" in gate["reasons"][0]
    # 20 off-topic questions, 15 with no score (a signal that could not be computed): the gap rests on 5
    unscored = records(np.linspace(0.3, 0.9, 25).tolist(), [0.0] * 5 + [None] * 15)
    gate = evaluate_gate(calibrate(unscored, config(0.1, min_per_label=20), check), None, None, gating_signal=SIGNAL)
    assert "decline_set_size" in failed(gate)
    assert "holds only 5 questions with a score (15 without one)" in " ".join(gate["reasons"])


@pytest.mark.parametrize("bad", [{}, [], {"questions": {}}, {"questions": {"precision": {"q": 1}, "decline": {}}}])
def test_an_empty_or_malformed_baseline_is_an_error(bad):
    with pytest.raises(BaselineError, match="sourcegate accept"):
        check_baseline(bad, "precision.json")


def test_an_empty_baseline_file_stops_the_gate_with_an_error(tmp_path):
    """The gate step reads the baseline: `{}` raises BaselineError, a ValueError, which the CLI
    exits 2 on (sourcegate/pipelines/app/cli.py main); never a pass."""
    assert issubclass(BaselineError, ValueError)
    run = _run_folder(tmp_path, records([0.5], [0.0], prefix="c-"))
    (tmp_path / "empty.json").write_text("{}")
    cfg = [f"evals.baseline={tmp_path / 'empty.json'}"]
    from sourcegate.evals.harness import gate_for_dir
    from sourcegate.pipelines import config as config_mod
    from sourcegate.pipelines.app.factories import judging

    with pytest.raises(BaselineError):
        gate_for_dir(judging(config_mod.load("config/pipeline.yaml", _overrides(cfg))), run, {}, tmp_path / "log.jsonl")


def _overrides(items):
    return dict(item.split("=", 1) for item in items)


def _run_folder(tmp_path, check_rows, adjacent=0.1):
    """A run folder as a night leaves it: calibration.json (with its check set), precision.json, no errors."""
    run = tmp_path / "runs" / "20261201-000000"
    run.mkdir(parents=True)
    cal = calibrate(FIT, config(adjacent), check_rows, "check.jsonl")
    items = [{"id": "p-1", "kind": "single"}]
    precision = precision_eval(items, {"p-1": ["rel"]}, {"p-1": ["rel"]}, {"p-1": {"rel": 1}})
    write_json(cal, run / "calibration.json")
    write_json(precision, run / "precision.json")
    write_json({"errors": []}, run / "eval_errors.json")
    return run


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _evalset_rows(rows):
    return [
        {
            "id": r["id"],
            "question": r["question"],
            "label": r["label"],
            "kind": r["kind"],
            "expected": ["x#y"] if r["label"] == "answer" else [],
            "context": [],
        }
        for r in rows
    ]


ROLES = """# roles (comments kept)
sets:
  - file: fit.jsonl
    role: fit
    provenance: the fit set
  - file: check.jsonl
    role: check
    provenance: written blind
  - file: next.jsonl
    role: next-check
    provenance: written blind later; never scored
"""


def _accept_folder(tmp_path, check_rows, extra_check=()):
    """A run that scored `check_rows` under a new threshold (0.1; accepted: 0.14), and the eval sets it names."""
    run = _run_folder(tmp_path, check_rows, adjacent=0.1)
    evals = tmp_path / "evals"
    evals.mkdir()
    fit = _jsonl(evals / "fit.jsonl", _evalset_rows(FIT))
    check = _jsonl(evals / "check.jsonl", _evalset_rows(check_rows) + _evalset_rows(list(extra_check)))
    _jsonl(evals / "next.jsonl", _evalset_rows(records([0.8], [0.0], prefix="n-")))
    (evals / "sets.yaml").write_text(ROLES)
    baseline = tmp_path / "baseline.json"
    old = baseline_from(json.loads((run / "precision.json").read_text()), calibrate(FIT, config(0.14)), "old")
    write_json(old, baseline)
    return run, fit, check, baseline


def _ids(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_accept_retires_the_check_set_a_new_threshold_has_seen_and_the_next_check_set_takes_its_place(tmp_path, capsys):
    check_rows = records([0.5, 0.6], [0.0], prefix="c-")
    run, fit, check, baseline = _accept_folder(tmp_path, check_rows, records([0.7], [], "new-"))
    moves = tmp_path / "moves.jsonl"
    sets = [
        f"evals.calibration_set={fit}",
        f"evals.check_set={check}",
        f"evals.check_moves={moves}",
        "answerability.combiner=null",
    ]
    args = ["accept", str(run), "--out", str(baseline)]
    assert main([a for s in sets for a in ("--set", s)] + args) == 0
    moved = ["c-a-0", "c-a-1", "c-d-0"]
    fit_ids = _ids(fit)
    assert fit_ids[-3:] == moved and len(fit_ids) == len(FIT) + 3
    assert _ids(check) == []  # retired: what it scored is fit data, ...
    assert _ids(tmp_path / "evals" / "next.jsonl") == [
        "n-a-0",
        "n-d-0",
        "new-a-0",
    ]  # ... what it never scored is carried
    roles = {e["file"]: e["role"] for e in yaml.safe_load((tmp_path / "evals" / "sets.yaml").read_text())["sets"]}
    assert roles == {"fit.jsonl": "fit", "check.jsonl": "retired", "next.jsonl": "check"}
    assert (tmp_path / "evals" / "sets.yaml").read_text().startswith("# roles (comments kept)")
    log = [json.loads(line) for line in moves.read_text().splitlines()]
    assert log[0]["moved"] == moved and log[0]["previous_threshold"]["adjacent"] == 0.14
    assert log[0]["threshold"]["adjacent"] == 0.1 and log[0]["carried_to_next_check"] == ["new-a-0"]
    assert log[0]["next_check"] == str(tmp_path / "evals" / "next.jsonl")
    assert json.loads(baseline.read_text())["check_moved"]["moved"] == moved
    captured = capsys.readouterr()
    out = captured.out
    assert f"the check set {check} is retired" in out and "evals.check_set was given by --set" in out
    assert "did not pass its gate (no passed verdict)" in captured.err  # a run with no gate.json: said, not refused
    # accepting again with the same threshold moves nothing: the decision is the accepted one
    assert main([a for s in sets for a in ("--set", s)] + args) == 0
    assert len(moves.read_text().splitlines()) == 1


def test_accept_switches_the_config_files_check_set_and_keeps_its_comments(tmp_path, capsys):
    run, fit, check, baseline = _accept_folder(tmp_path, records([0.5], [0.0], prefix="c-"))
    config_file = tmp_path / "pipeline.yaml"
    text = Path("config/pipeline.yaml").read_text()
    text = text.replace("calibration_set: config/evals/calibration.jsonl", f"calibration_set: {fit}")
    text = re.sub(r"(?m)^(  check_set: )\S+", lambda m: m.group(1) + str(check), text, count=1)
    text = text.replace("check_moves: config/evals/check_moves.jsonl", f"check_moves: {tmp_path / 'moves.jsonl'}")
    text = text.replace("combiner: config/baselines/answerability_combiner.json", "combiner: null")
    config_file.write_text(text)
    assert main(["--config", str(config_file), "accept", str(run), "--out", str(baseline)]) == 0
    after = config_file.read_text()
    assert f"check_set: {tmp_path / 'evals' / 'next.jsonl'}" in after
    assert after.replace(f"check_set: {tmp_path / 'evals' / 'next.jsonl'}", f"check_set: {check}") == text  # one line
    assert f"{config_file}: evals.check_set switched" in capsys.readouterr().out


def test_without_a_next_check_set_the_check_set_keeps_only_what_the_decision_never_saw(tmp_path, capsys):
    run, fit, check, baseline = _accept_folder(tmp_path, records([0.5], [0.0], prefix="c-"))
    roles = tmp_path / "evals" / "sets.yaml"
    roles.write_text(ROLES.replace("role: next-check", "role: retired"))
    before = roles.read_bytes()
    moves = tmp_path / "moves.jsonl"
    sets = [f"evals.calibration_set={fit}", f"evals.check_set={check}", f"evals.check_moves={moves}"]
    args = [a for s in sets + ["answerability.combiner=null"] for a in ("--set", s)]
    assert main([*args, "accept", str(run), "--out", str(baseline)]) == 0
    assert _ids(check) == [] and _ids(fit)[-2:] == ["c-a-0", "c-d-0"]
    assert roles.read_bytes() == before  # no set to rotate in: the roles stay as they are
    assert "next_check" not in json.loads(moves.read_text().splitlines()[0])
    assert f"the check set is now empty: write new should-answer questions into {check}" in capsys.readouterr().out


def test_the_same_threshold_has_seen_no_check_question():
    cal = calibrate(FIT, config(0.1), records([0.5], [0.0], prefix="c-"), "check.jsonl")
    assert seen_check_questions(cal, {"threshold": {"signal": SIGNAL, "adjacent": 0.1}}) == []
    assert seen_check_questions(cal, {"threshold": {"signal": SIGNAL, "adjacent": 0.2}}) == ["c-a-0", "c-d-0"]


def test_a_move_that_would_clash_writes_nothing(tmp_path):
    fit = _jsonl(tmp_path / "fit.jsonl", _evalset_rows(records([0.5], [])))
    check = _jsonl(tmp_path / "check.jsonl", _evalset_rows(records([0.5], [])))
    before = fit.read_text(), check.read_text()
    with pytest.raises(ValueError, match="already have an id in the fit set"):
        move_to_fit(check, fit, ["a-0"])
    assert (fit.read_text(), check.read_text()) == before


def test_the_report_shows_the_three_figures_and_the_unseen_check_questions():
    from sourcegate.evals.report import render_report

    check = records([0.5] * 40, [0.0] * 5, prefix="c-")
    cal = calibrate(FIT, config(0.1), check, "check.jsonl")
    html = render_report(cal, None, evaluate_gate(cal, None, None, gating_signal=SIGNAL), {})
    assert "Coverage promise" in html and "Headline: a new should-answer question is kept" in html
    for name in ("in-sample", "cross-fitted", "check"):
        assert f"<td>{name}</td>" in html
    assert "40 should-answer and 5 should-decline questions remain unseen" in html


def test_check_questions_that_ask_a_fit_question_again_are_held_to_the_check_but_not_counted_unseen():
    from sourcegate.evals.report import render_report

    # 40 kept check answers, one of them (c-a-0) a repeat of fit question a-3; one declined answer, a repeat too
    check = records([0.5] * 40 + [0.05], [0.0] * 5, prefix="c-")
    repeats = [("c-a-0", "a-3", 0.93), ("c-a-40", "a-4", 0.88)]
    cal = calibrate(FIT, config(0.1), check, "check.jsonl", repeats)
    figure = next(f for f in cal["coverage"]["figures"] if f["name"] == "check")
    assert (figure["kept"], figure["n"], figure["repeats_left_out"]) == (39, 39, 2)
    assert figure["value"] == pytest.approx(binomtest(39, 39).proportion_ci(0.95, method="exact").low)
    gate = evaluate_gate(cal, None, None, gating_signal=SIGNAL)
    assert gate["unseen_check_questions"] == {"answer": 39, "decline": 5}
    held = next(c for c in gate["checks"] if c["name"] == "check_set")
    assert not held["passed"] and "c-a-40 (0.05" in held["detail"]  # a repeat still fails the check
    assert "2 of its questions ask a fit question again (c-a-0, c-a-40)" in held["detail"]
    html = render_report(cal, None, gate, {})
    assert "39 should-answer and 5 should-decline questions remain unseen" in html
    assert "2 more ask a fit question again (c-a-0 ~ a-3, c-a-40 ~ a-4)" in html


def test_accepting_a_first_night_says_the_check_set_is_now_empty(tmp_path, capsys):
    """A new corpus's first accepted threshold has seen every check question, so all of them move to the fit set;
    the next night refuses the empty check set, so accept must say to write a new one, not leave it to that night."""
    check_rows = records([0.5, 0.6], [0.0], prefix="c-")
    run = _run_folder(tmp_path, check_rows, adjacent=0.1)
    fit = _jsonl(tmp_path / "fit.jsonl", _evalset_rows(FIT))
    check = _jsonl(tmp_path / "check.jsonl", _evalset_rows(check_rows))
    sets = [
        f"evals.calibration_set={fit}",
        f"evals.check_set={check}",
        f"evals.check_moves={tmp_path / 'moves.jsonl'}",
        "answerability.combiner=null",
    ]
    args = ["accept", str(run), "--out", str(tmp_path / "baseline.json")]  # no baseline yet: the first accept
    assert main([a for s in sets for a in ("--set", s)] + args) == 0
    assert check.read_text().strip() == ""
    out = capsys.readouterr().out
    assert "0 unseen check questions remain" in out
    assert f"the check set is now empty: write new should-answer questions into {check}, blind" in out


def test_a_decision_edited_into_the_config_without_accept_is_named_in_the_gate_and_the_report():
    from sourcegate.evals.report import render_report

    cal = calibrate(FIT, config(0.1), records([0.5], [0.0], prefix="c-"), "check.jsonl")
    accepted = {"threshold": {"signal": SIGNAL, "adjacent": 0.14}, "accepted_from": "runs/old"}
    edited = evaluate_gate(cal, None, accepted, gating_signal=SIGNAL)["decision_accepted"]
    assert edited["accepted"] is False and edited["accepted_decision"]["adjacent"] == 0.14
    assert "rerank_top >= 0.1) was not accepted: the last accepted decision is rerank_top >= 0.14" in edited["note"]
    html = render_report(cal, None, evaluate_gate(cal, None, accepted, gating_signal=SIGNAL), {})
    assert "Decision not accepted." in html and "rerank_top &gt;= 0.14 (from runs/old)" in html

    same = evaluate_gate(
        cal, None, {**accepted, "threshold": {"signal": SIGNAL, "adjacent": 0.1}}, gating_signal=SIGNAL
    )
    assert same["decision_accepted"]["accepted"] is True
    assert "Decision not accepted." not in render_report(cal, None, same, {})
    assert evaluate_gate(cal, None, None, gating_signal=SIGNAL)["decision_accepted"]["accepted"] is False


def test_a_cross_fitted_headline_is_called_an_estimate_and_a_bound_a_probability():
    from sourcegate.evals.coverage import headline_text

    crossed = {"name": "cross_fitted", "value": 0.96, "assumes": "…", "claim": "at an estimated rate of"}
    check = {"name": "check", "value": 0.97, "assumes": "…", "claim": "with probability >="}
    assert "kept at an estimated rate of 0.960 (cross-fitted" in headline_text(
        {"figures": [crossed, check], "headline": crossed}
    )
    assert "kept with probability >= 0.970 (check" in headline_text({"figures": [crossed, check], "headline": check})
