"""`sourcegate runs`: one row per run folder, from run.json and gate.json, by SQL."""

import json

from sourcegate.pipelines.app.cli import main
from sourcegate.pipelines.app.run_table import list_runs


def write_run(artifacts, name, info=None, gate=None, raw=None):
    folder = artifacts / "runs" / name
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(raw if raw is not None else json.dumps(info))
    if gate is not None:
        (folder / "gate.json").write_text(json.dumps(gate))


def test_rows_carry_verdict_counts_and_total_time_oldest_first(tmp_path):
    write_run(
        tmp_path,
        "night-2",
        {
            "started_at": "2026-01-02T02:00:00+00:00",
            "backend": "opensearch",
            "counts": {"ingest": {"documents": 47}, "chunks": 231, "embedded": 3, "eval_questions": 209},
            "timings_s": {"ingest": 1.25, "embed": 10.0, "evaluate": 100.5},
        },
        gate={"passed": False, "reasons": ["threshold_in_gap"]},
    )
    write_run(
        tmp_path,
        "night-1",
        {"started_at": "2026-01-01T02:00:00+00:00", "backend": "embedded", "promoted": {"version": "night-1"}},
        gate={"passed": True},
    )
    write_run(tmp_path, "crashed", raw='{"run_id": "crashed", ')  # half-written
    write_run(tmp_path, "building", {"started_at": "2026-01-03T02:00:00+00:00"})  # no gate yet

    rows = {r["run"]: r for r in list_runs(tmp_path)}
    assert [r["run"] for r in list_runs(tmp_path)] == ["crashed", "night-1", "night-2", "building"]
    assert rows["night-2"] == {
        "run": "night-2",
        "started": "2026-01-02T02:00:00+00:00",
        "backend": "opensearch",
        "verdict": "failed",
        "promoted": False,
        "documents": 47,
        "chunks": 231,
        "embedded": 3,
        "questions": 209,
        "seconds": 111.8,
        "stopped": None,
        "judged": None,
        "live": False,
    }
    assert rows["night-1"]["verdict"] == "passed" and rows["night-1"]["promoted"] is True
    assert rows["night-1"]["seconds"] is None  # no timings recorded
    assert rows["crashed"]["verdict"] == "unreadable"
    assert rows["building"]["verdict"] == "no verdict"


def test_runs_without_any_gate_and_no_runs_at_all(tmp_path, capsys):
    assert list_runs(tmp_path) == []
    assert main(["runs", "--artifacts", str(tmp_path / "typo"), "--json"]) == 2  # not an empty list a gate would pass
    assert "no artifacts folder at" in capsys.readouterr().err
    write_run(tmp_path, "only", {"counts": {"chunks": 5}})
    assert [(r["run"], r["verdict"], r["chunks"]) for r in list_runs(tmp_path)] == [("only", "no verdict", 5)]


def test_cli_prints_a_table_or_json(tmp_path, capsys):
    write_run(tmp_path, "night-1", {"backend": "embedded", "counts": {"chunks": 7}}, gate={"passed": True})
    assert main(["runs", "--artifacts", str(tmp_path)]) == 0
    header, line = capsys.readouterr().out.splitlines()
    assert header.split() == [
        "run",
        "started",
        "backend",
        "verdict",
        "promoted",
        "documents",
        "chunks",
        "embedded",
        "questions",
        "seconds",
    ]
    assert line.split() == ["night-1", "embedded", "passed", "false", "7"]
    assert main(["runs", "--artifacts", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["verdict"] == "passed"


def test_promoted_comes_from_the_promotions_log_when_given(tmp_path):
    """run.json's `promoted` can lag a crash after the log write: the log is the truth."""
    write_run(tmp_path, "live", {"started_at": "2026-01-01T02:00:00+00:00"}, gate={"passed": True})
    write_run(tmp_path, "other", {"started_at": "2026-01-02T02:00:00+00:00", "promoted": {}}, gate={"passed": True})
    by_log = {r["run"]: r["promoted"] for r in list_runs(tmp_path, {"live"})}
    assert by_log == {"live": True, "other": False}
    assert {r["run"]: r["promoted"] for r in list_runs(tmp_path)} == {"live": False, "other": True}


def test_sourcegate_runs_reads_the_promotions_log(tmp_path, capsys):
    from sourcegate.pipelines.versions.promotions import append_record, promotion_record

    write_run(tmp_path, "live", {"started_at": "2026-01-01T02:00:00+00:00"}, gate={"passed": True})
    recal = {"started_at": "2026-01-02T02:00:00+00:00", "evaluated_version": "live"}  # judged LIVE, builds nothing
    write_run(tmp_path, "recal-20260102-020000", recal, gate={"passed": True})
    append_record(promotion_record("live", None, "sha256:g", "cli"), tmp_path / "promotions.jsonl")
    assert main(["runs", "--artifacts", str(tmp_path), "--json"]) == 0
    row, recal = json.loads(capsys.readouterr().out)
    assert row["promoted"] is True and row["live"] is False  # logged, but LIVE names another version (rolled back)
    assert (recal["verdict"], recal["promoted"], recal["judged"]) == ("passed", False, "live")  # not one to promote
    (tmp_path / "LIVE").write_text("live\n")
    assert main(["runs", "--artifacts", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["live"] is True


def test_a_night_that_stopped_says_where_and_why_in_its_folder_and_in_the_listing(tmp_path):
    """A night stopped by an error (a preflight refusal, a node down) left a folder with no verdict: `runs` said
    "no verdict", as for a night still building. It now records the step and the error's start (one line, a URL's
    password masked) and is listed as stopped there."""
    from sourcegate.artifact_io.run_folder import RunFolder
    from sourcegate.evals.preflight import PreflightError
    from sourcegate.pipelines.app.steps import STOP_CHARS, record_stop
    from sourcegate.pipelines.release.lock import mark_step

    run = RunFolder(tmp_path, "20260105-020000")
    record_stop(run, RuntimeError("no folder yet"))  # a night stopped before its folder: nothing to say it in
    assert not run.exists()
    write_run(tmp_path, run.run_id, {"started_at": "2026-01-05T02:00:00+00:00"})
    refused = PreflightError("the night cannot be judged as configured:\n  - the fit set fit.jsonl: 3 label(s) …")
    mark_step(refused, "preflight")
    record_stop(run, refused)
    stopped = run.info()["stopped"]
    assert stopped == {
        "step": "preflight",
        "error": "PreflightError: the night cannot be judged as configured: - the fit set fit.jsonl: 3 label(s) …",
    }
    assert {r["run"]: r["verdict"] for r in list_runs(tmp_path)} == {run.run_id: "stopped: preflight"}
    assert list_runs(tmp_path)[0]["stopped"] == stopped["error"]  # `runs --json` says why
    import xml.etree.ElementTree as ET

    suites = ET.parse(run / "junit.xml").getroot()  # a release gate reading junit.xml sees why
    assert (suites.get("tests"), suites.get("errors")) == ("1", "1")
    error = suites.find("testsuite/testcase[@name='night']/error")
    assert error.get("type") == "PreflightError" and error.get("message") == "stopped during preflight"
    assert error.text == stopped["error"]
    record_stop(run, ConnectionError("cannot reach https://admin:hunter2@search.internal:9200/_bulk " + "x" * 400))
    error = run.info()["stopped"]["error"]
    assert "hunter2" not in error and "https://admin:***@search.internal" in error
    assert len(error) == STOP_CHARS and error.endswith("…") and run.info()["stopped"]["step"] == "run"
    record_stop(run, ConnectionError("cannot reach http://u:p@ss@h:9200/"))  # an @ in the password: masked whole
    error = run.info()["stopped"]["error"]
    assert "u:***@h:9200" in error and "ss@" not in error
    (run / "gate.json").write_text(json.dumps({"passed": True}))  # a passed gate, then a stop (e.g. at promote):
    assert list_runs(tmp_path)[0]["verdict"] == "passed" and list_runs(tmp_path)[0]["stopped"] == error  # still said
    (run / "gate.json").write_text(json.dumps({"passed": "true"}))  # a string is no pass (promote refuses it too)
    assert list_runs(tmp_path)[0]["verdict"] == "failed"
    (run / "gate.json").unlink()
    record_stop(run, None)  # rerun (or a retried task) got past it: no longer stopped
    assert run.info()["stopped"] is None and list_runs(tmp_path)[0]["verdict"] == "no verdict"
    assert not (run / "junit.xml").exists()
    (run / "gate.json").write_text(json.dumps({"passed": False, "checks": []}))
    (run / "junit.xml").write_text("<the gate's own/>")
    record_stop(run, RuntimeError("promote: the node went away"))  # after its gate: the gate's junit.xml stays
    assert (run / "junit.xml").read_text() == "<the gate's own/>" and run.info()["stopped"]["step"] == "run"
