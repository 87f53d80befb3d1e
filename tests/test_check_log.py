"""Every scoring of a check set is logged, and a check set scored under several designs promises less
(sourcegate/evals/check_log.py): the check figure at Bonferroni confidence over the designs that looked at its content."""

from sourcegate.evals.check_log import account, append, design_hash, designs_scored, read
from sourcegate.evals.placement import exact_lower_bound

COVERAGE = {
    "figures": [
        {"name": "in_sample", "value": 0.996, "assumes": "..."},
        {"name": "check", "value": exact_lower_bound(45, 45, 0.95), "kept": 45, "n": 45, "confidence": 0.95,
         "bound": "lower end of the exact (Clopper-Pearson) two-sided interval", "assumes": "..."},
    ],
}  # fmt: skip


def test_one_design_keeps_the_bound_and_four_designs_pay_for_the_choice():
    one = account(COVERAGE, 1)
    assert one["figures"][1]["value"] == COVERAGE["figures"][1]["value"] and one["headline"]["name"] == "check"
    four = account(COVERAGE, 4)
    check = four["figures"][1]
    assert check["value"] == exact_lower_bound(45, 45, 1 - 0.05 / 4) < one["figures"][1]["value"]
    assert check["designs_scored"] == 4 and "scored under 4 designs" in check["bound"]
    assert four["headline"] == check


def test_the_log_counts_distinct_designs_per_check_content_and_a_rerun_is_not_a_new_look(tmp_path):
    log = tmp_path / "check_scorings.jsonl"
    a, b = design_hash({"signal": "x", "threshold": 0.1}), design_hash({"signal": "x", "threshold": 0.2})
    assert a == design_hash({"threshold": 0.1, "signal": "x"}) != b  # key order does not matter
    assert append(log, {"run": "r1", "check_sha256": "c1", "design_sha256": a, "passed": True})
    assert not append(log, {"run": "r1", "check_sha256": "c1", "design_sha256": a, "passed": True})
    assert append(log, {"run": "r2", "check_sha256": "c1", "design_sha256": a, "passed": True})
    assert append(log, {"run": "r3", "check_sha256": "c2", "design_sha256": b, "passed": False})
    rows = read(log)
    assert len(rows) == 3
    assert designs_scored(rows, "c1", a) == [a]  # the same design every night: one look
    assert designs_scored(rows, "c1", b) == [a, b]  # a second design on the same content: two
    assert designs_scored(rows, "c3", b) == [b]  # a fresh check set starts at one


def check_set(path, questions):
    path.write_text(
        "".join(
            f'{{"id": "q{i}", "question": "{q}", "label": "answer", "expected": ["d"]}}\n'
            for i, q in enumerate(questions)
        )
    )
    return path


def test_a_run_gated_again_under_another_design_is_another_look_and_under_the_same_is_not(tmp_path):
    """A run folder re-gated with thresholds 0.50, 0.45, 0.40 looked at its check set three times."""
    from sourcegate.evals.harness import check_scoring
    from sourcegate.pipelines import config
    from sourcegate.pipelines.app.factories import judging

    check = check_set(tmp_path / "check.jsonl", ["Is it open?", "How late?"])
    judge = judging(config.load("config/pipeline.yaml", {"evals.check_set": str(check)}))
    evaluated = {"eval_sets": {str(judge.evals.check_set): "c1"}}
    log, seen = [], []
    for threshold in (0.5, 0.45, 0.4, 0.4):
        calibration = {"check": {"shipped": {"signal": "answer_support", "threshold": threshold}}, "shipped": {}}
        scoring = check_scoring(judge, log, "r1", calibration, evaluated)
        log.append({"run": "r1", "check_sha256": "c1", "design_sha256": scoring["design_sha256"]})
        seen.append(scoring["designs_scored"])
    assert seen == [1, 2, 3, 3]


def test_a_check_set_reordered_reformatted_or_grown_is_not_a_fresh_one():
    """Each question counts the designs that saw it; the set pays for the most any question has seen. A set of
    new questions is fresh. Rows logged without keys count by the file's hash."""
    log = [
        {"run": "r1", "check_sha256": "f1", "design_sha256": "A", "question_keys": ["k1", "k2"]},
        {"run": "r2", "check_sha256": "f1", "design_sha256": "B", "question_keys": ["k1", "k2"]},
    ]
    assert designs_scored(log, "f1", "C", ["k1", "k2"]) == ["A", "B", "C"]
    assert designs_scored(log, "f2", "C", ["k2", "k1"]) == ["A", "B", "C"]  # reformatted: another file hash
    assert designs_scored(log, "f3", "C", ["k1", "k2", "k3"]) == ["A", "B", "C"]  # grown by one question
    assert designs_scored(log, "f4", "C", ["k8", "k9"]) == ["C"]  # a fresh set
    legacy = [{"run": "r0", "check_sha256": "f1", "design_sha256": "Z"}]
    assert designs_scored(legacy, "f1", "C", ["k1"]) == ["Z", "C"] and designs_scored(legacy, "f9", "C", ["k1"]) == [
        "C"
    ]
    assert designs_scored(legacy, "f1", "C") == ["Z", "C"]  # no keys known
