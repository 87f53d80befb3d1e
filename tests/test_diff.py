"""sourcegate.evals.diff: the per-question join of two runs' questions.jsonl."""

import json
import shutil

import pytest

from sourcegate.evals.diff import diff_runs, format_diff
from sourcegate.pipelines.app.cli import main


def row(qid, score, mode, rank=1, kind="single", label="answer", set_="calibration"):
    return {
        "set": set_,
        "id": qid,
        "kind": kind,
        "label": label,
        "question": f"question {qid} <b>?",
        "gating_signal": "rerank_top",
        "gating_score": score,
        "mode": mode,
        "labelled_rank": rank,
        "signals": {"rerank_top": score},
    }


def write_run(folder, rows):
    folder.mkdir()
    (folder / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture
def runs(tmp_path):
    a = write_run(
        tmp_path / "a",
        [
            row("q1", 0.9, "sourced"),
            row("q2", 0.3, "adjacent"),
            row("q3", 0.6, "sourced", rank=2),
            row("d1", 0.001, "decline", rank=None, kind="off_topic", label="decline"),
            row("q1", 0.9, "sourced", set_="precision"),
        ],
    )
    b = write_run(
        tmp_path / "b",
        [
            row("q1", 0.9, "sourced"),  # unchanged
            row("q2", 0.1, "decline"),  # crossed the adjacent threshold
            row("q3", 0.6, "sourced", rank=1),  # rank moved only
            row("d1", 0.002, "decline", rank=None, kind="off_topic", label="decline"),  # score moved
            row("q1", 0.9, "sourced", set_="precision"),
        ],
    )
    return a, b


def test_diff_lists_exactly_the_moved_questions_crossed_first(runs):
    d = diff_runs(*runs)
    assert d["n"] == 5
    assert [(r["set"], r["id"]) for r in d["moved"]] == [
        ("calibration", "q2"),  # crossed
        ("calibration", "d1"),  # |delta| 0.001
        ("calibration", "q3"),  # delta 0, rank 2 -> 1
    ]
    assert [r["id"] for r in d["crossed"]] == ["q2"]
    q2 = d["crossed"][0]
    assert q2["delta"] == pytest.approx(-0.2) and (q2["mode_a"], q2["mode_b"]) == ("adjacent", "decline")
    assert d["by_kind"]["calibration/single"] == {
        "n": 3,
        "moved": 2,
        "crossed": 1,
        "mean_delta": pytest.approx(-0.2 / 3),
        "min_delta": pytest.approx(-0.2),
        "max_delta": 0.0,
    }
    text = format_diff(d)
    assert text.index("calibration/q2") < text.index("calibration/d1") < text.index("calibration/q3")


def test_diff_cli(runs, capsys):
    assert main(["diff", str(runs[0]), str(runs[1])]) == 0
    out = capsys.readouterr().out
    assert "3 of 5 questions moved" in out and "crossed a threshold (answer mode changed): 1" in out
    assert main(["diff", str(runs[0]), str(runs[1]), "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)["crossed"]] == ["q2"]
    artifacts = runs[0].parent / "artifacts"  # with a local --artifacts, two run ids (or the folders a night printed)
    for run in runs:
        shutil.copytree(run, artifacts / "runs" / run.name)
    assert main(["diff", "a", f"{artifacts}/runs/b", "--artifacts", str(artifacts)]) == 0
    assert "3 of 5 questions moved" in capsys.readouterr().out


def test_diff_without_questions_file_says_so(tmp_path, runs, capsys):
    (tmp_path / "old").mkdir()
    assert main(["diff", str(tmp_path / "old"), str(runs[1])]) == 2
    assert "no per-question records" in capsys.readouterr().err


def test_report_section_since_the_live_version_escapes_and_lists_crossed_first(runs):
    from sourcegate.evals.report import render_report

    diff = {**diff_runs(*runs), "live": "20261130-000001"}
    calibration = {"n": {"answer": 3, "decline": 1}, "signals": {}}
    page = render_report(calibration, None, {"passed": True, "checks": []}, {}, diff)
    assert "Since the live version 20261130-000001" in page
    assert "3 of 5 questions moved; 1 crossed a threshold" in page
    assert "question q2 &lt;b&gt;?" in page and "<b>?" not in page
    assert page.index("calibration/q2") < page.index("calibration/d1")


def test_scores_of_two_gating_signals_are_never_subtracted(tmp_path, capsys):
    """Under `answer.signal: auto` a night may gate on another signal than the night before: its scores are on
    another scale, so only modes and ranks are compared, and the diff and the report say the signal changed."""
    from sourcegate.evals.report import render_report

    a = write_run(tmp_path / "a", [row("q1", 0.9, "sourced"), row("q2", 0.4, "adjacent")])
    later = [row("q1", 0.31, "sourced"), row("q2", 0.2, "decline")]
    b = write_run(tmp_path / "b", [{**r, "gating_signal": "cosine_top"} for r in later])
    d = diff_runs(a, b)
    assert d["signal_changed"] and d["signals"] == {"a": ["rerank_top"], "b": ["cosine_top"]}
    assert [r["id"] for r in d["moved"]] == ["q2"]  # q1: same mode and rank; 0.9 and 0.31 are not comparable
    assert d["moved"][0]["delta"] is None and d["by_kind"]["calibration/single"]["mean_delta"] is None
    text = format_diff(d)
    assert "gating signal changed: rerank_top -> cosine_top" in text
    assert "score rerank_top 0.4 -> cosine_top 0.2 (-)" in text
    page = render_report({"n": {"answer": 2, "decline": 0}, "signals": {}}, None, {"passed": True, "checks": []}, {}, d)
    assert "The gating signal changed: rerank_top → cosine_top" in page
