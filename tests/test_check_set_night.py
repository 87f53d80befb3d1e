"""Issue #28 against the real models: a check-set should-answer question the shipped threshold declines
fails the gate with exit 1, named with its score."""

import json
from pathlib import Path

import pytest

from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.evals import check_log
from sourcegate.pipelines.app.cli import main
from tests.promotable import PROMOTABLE, promotable_args

pytestmark = pytest.mark.models


def test_a_declined_check_question_fails_with_exit_1_naming_it(demo_index, tmp_path, capsys):
    cfg, run_id, _ = demo_index

    # labelled should-answer, yet about nothing in the corpus: the real cross-encoder scores it far
    # below the shipped threshold, as it would a rider's question the articles do not word
    check = tmp_path / "check.jsonl"
    row = {"id": "chk-1", "question": "What is the melting point of tungsten in kelvin?", "label": "answer"}
    check.write_text(json.dumps({**row, "expected": ["fares-and-passes#day-passes"], "kind": "single"}) + "\n")
    out = tmp_path / "cal"
    # a fit set the gate passes on (tests/promotable.py), so the check set is the night's only failure
    argv = [*promotable_args(), "--set", f"evals.check_set={check}", "--set", f"artifacts={cfg.artifacts}"]
    argv += [
        "calibrate",
        "--index",
        str(RunFolder(cfg.artifacts, run_id).path),
        "--questions",
        PROMOTABLE["evals.calibration_set"],
    ]
    code = main(argv + ["--out", str(out), "--quiet"])
    gate = json.loads((out / "gate.json").read_text())
    check_result = next(c for c in gate["checks"] if c["name"] == "check_set")
    assert code == 1 and not gate["passed"] and not check_result["passed"]
    assert [c["name"] for c in gate["checks"] if not c["passed"]] == ["check_set"], gate["reasons"]
    lost = check_result["data"]["wrongly_declined"][0]
    score, rank = lost["score"], lost["source_rank"]
    assert score < cfg.answer.adjacent
    where = "its source not among the candidates" if rank is None else f"its source at rank {rank}"
    assert f"chk-1 ({score:.4g}, {where})" in check_result["detail"] and check_result["detail"] in gate["reasons"]
    # the check set's shortlist recall is measured like the fit set's
    check_recall = json.loads((out / "calibration.json").read_text())["check"]["shortlist_recall"]
    assert check_recall["n"] == 1 and check_recall["missed"] == ([] if check_recall["recall"] == 1 else ["chk-1"])
    assert "chk-1" in capsys.readouterr().out
    # a calibration's look at the check set is logged and paid for, as a night's is
    [look] = [r for r in check_log.read(Path(cfg.artifacts) / check_log.LOG) if r["run"] == "cal"]
    assert look["check_set"] == str(check) and look["designs_scored"] == 1 and look["passed"] is False
