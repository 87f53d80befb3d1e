"""Retention on whole run folders, by creation time (not name), and crashed writers' leftovers."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

from sourcegate.artifact_io import write_json
from sourcegate.pipelines.release.runs import DAY_S, Run, doomed_runs, list_runs, retain_runs
from sourcegate.pipelines.search.embedded import EmbeddedStore
from sourcegate.pipelines.versions.manifest import build_manifest, write_manifest

NOW = datetime(2026, 6, 1, tzinfo=UTC).timestamp()


def make_run(runs_dir, name, days_ago, promoted=False, index=True):
    folder = runs_dir / name
    (folder / "embed").mkdir(parents=True)
    (folder / "embed" / "shard-0000.parquet").write_bytes(b"x")
    (folder / "chunks.parquet").write_bytes(b"x")
    created = datetime.fromtimestamp(NOW - days_ago * DAY_S, UTC).isoformat()
    if index:  # a complete (if empty) version: promote verifies it against its manifest
        write_manifest(folder / "index", build_manifest(name, rows=0, dimension=0, created=created))
    info = {"started_at": created}
    if promoted:
        info["promoted"] = {"version": name}
    write_json(info, folder / "run.json")
    return folder


def test_manual_run_id_is_ordered_by_creation_not_name():
    runs = [Run("manual", 1.0, True), Run("20260102-000000", 2.0, True), Run("20260103-000000", 3.0, True)]
    # keep 2: the two newest by creation; "manual" sorts last by name but is the oldest
    assert doomed_runs(runs, live="20260103-000000", keep=2, keep_failed_days=7, now=10) == ["manual"]


def test_keeps_k_promoted_the_live_and_the_newest_rollback_target():
    runs = [Run(f"p{i}", float(i), True) for i in range(5)]
    # live rolled back to p1: kept, as are the newest K=1 (p4) and the newest rollback target other than live (p4)
    assert doomed_runs(runs, live="p1", keep=1, keep_failed_days=7, now=10) == ["p0", "p2", "p3"]
    # keep=0 still keeps the live one and one version to roll back to
    assert doomed_runs(runs, live="p4", keep=0, keep_failed_days=7, now=10) == ["p0", "p1", "p2"]


def test_failed_runs_are_kept_for_days_and_do_not_count_as_promoted():
    runs = [
        Run("failed-old", NOW - 10 * DAY_S, False),
        Run("p1", NOW - 9 * DAY_S, True),
        Run("failed-new", NOW - 1 * DAY_S, False),
        Run("p2", NOW - 0.5 * DAY_S, True),
    ]
    assert doomed_runs(runs, live="p2", keep=2, keep_failed_days=7, now=NOW) == ["failed-old"]
    assert doomed_runs(runs, live="p2", keep=2, keep_failed_days=0.5, now=NOW) == ["failed-old", "failed-new"]


def test_retain_runs_deletes_whole_folders_and_never_the_live_one(tmp_path):
    runs_dir = tmp_path / "runs"
    make_run(runs_dir, "manual", days_ago=30, promoted=True)
    make_run(runs_dir, "20260501-020000", days_ago=20, promoted=True)
    make_run(runs_dir, "20260520-020000", days_ago=10, promoted=False)  # failed, past 7 days
    make_run(runs_dir, "20260530-020000", days_ago=2, promoted=False)  # failed, recent
    make_run(runs_dir, "20260531-020000", days_ago=1, promoted=True)
    make_run(runs_dir, "recal-20260531-030000", days_ago=1, index=False)  # a recalibration: kept for days
    store = EmbeddedStore(runs_dir, tmp_path / "LIVE")
    store.promote("manual")  # rolled back to the oldest
    assert store.versions()[0] == "manual"  # by creation time, not name
    out = retain_runs(runs_dir, store, keep=1, keep_failed_days=7, now=NOW)
    assert out["runs"] == ["20260501-020000", "20260520-020000"]
    assert sorted(p.name for p in runs_dir.iterdir()) == [
        "20260530-020000",
        "20260531-020000",
        "manual",
        "recal-20260531-030000",
    ]
    assert store.live() == "manual"


def test_leftovers_of_crashed_writers_are_removed_but_not_newer_files(tmp_path):
    runs_dir = tmp_path / "runs"
    folder = make_run(runs_dir, "r1", days_ago=0, promoted=True)
    store = EmbeddedStore(runs_dir, tmp_path / "LIVE")
    store.promote("r1")
    old = [
        folder / ".chunks.parquet.abc.tmp",
        folder / "embed" / ".shard-0001.parquet.x.tmp",
        tmp_path / ".LIVE.q.tmp",
        folder / "index.tmp",
        runs_dir / ".deleting-r0",
    ]
    for p in old:
        if p.suffix == ".tmp" and p.name.startswith("."):
            p.write_bytes(b"half")
        else:
            (p / "sub").mkdir(parents=True)
    lock_start = time.time()
    for p in old:
        os.utime(p, (lock_start - 60, lock_start - 60))
    fresh = folder / ".run.json.new.tmp"  # written after the lock holder started: not a leftover
    fresh.write_bytes(b"x")
    out = retain_runs(runs_dir, store, keep=3, keep_failed_days=7, before=lock_start)
    assert out["runs"] == []
    assert sorted(out["leftovers"]) == sorted(str(p) for p in old)
    assert not any(p.exists() for p in old)
    assert fresh.exists() and (folder / "index").is_dir() and (folder / "embed" / "shard-0000.parquet").exists()


def test_list_runs_falls_back_to_folder_mtime_without_run_json(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    os.utime(tmp_path / "a", (NOW, NOW))
    os.utime(tmp_path / "b", (NOW - 100, NOW - 100))
    assert [r.name for r in list_runs(tmp_path)] == ["b", "a"]


def test_a_version_is_ordered_by_its_manifest_creation_time(tmp_path):
    from sourcegate.pipelines.release.runs import created_at
    from sourcegate.pipelines.versions.manifest import MANIFEST_FILE

    folder = make_run(tmp_path, "manual", days_ago=1, index=False)  # run.json says: a day ago
    assert created_at(folder) == NOW - DAY_S
    (folder / "index").mkdir()
    write_json({"created": datetime.fromtimestamp(NOW - 3 * DAY_S, UTC).isoformat()}, folder / "index" / MANIFEST_FILE)
    assert created_at(folder) == NOW - 3 * DAY_S  # the manifest, once the version has one, decides


def test_a_night_whose_gate_failed_still_runs_retention_and_a_dry_run_does_not(tmp_path, monkeypatch):
    """A streak of failed nights kept every version until the next pass (retention ran only after a promotion): a
    week of failures on a large corpus is a week of full indexes. Retention now follows every judged night that may
    promote; `--no-promote` (a dry run) changes nothing beyond its own folder. (The steps are stand-ins: what is
    tested is when retention is asked for; retention itself is tested above.)"""
    from types import SimpleNamespace

    from sourcegate.artifact_io.run_folder import RunFolder
    from sourcegate.pipelines.app import run as night

    calls = []
    counts = {k: 0 for k in ("documents", "added", "changed", "deleted", "unchanged")}
    monkeypatch.setattr(
        night, "build", lambda *a, **k: {"ingest": counts, "encoded": 0, "indexed": 0, "quarantined": 0}
    )
    monkeypatch.setattr(night.steps, "evaluate_step", lambda *a, **k: None)
    monkeypatch.setattr(night.steps, "gate_step", lambda *a, **k: {"passed": False, "reasons": ["no gap"]})
    monkeypatch.setattr(night.steps, "promote_step", lambda *a, **k: calls.append("promote"))
    monkeypatch.setattr(night.steps, "cleanup_step", lambda *a, **k: calls.append("cleanup"))
    monkeypatch.setattr(night, "gating_signal_text", lambda gate: "")
    monkeypatch.setattr(night.factories, "open_store", lambda *a: SimpleNamespace(live=lambda: None))
    run = RunFolder(tmp_path, "20260106-020000")
    assert night._night(run, None, progress=False, promote=True)["passed"] is False
    assert calls == ["cleanup"]
    calls.clear()
    night._night(run, None, progress=False, promote=False)
    assert calls == []
