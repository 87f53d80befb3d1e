"""Run folders over time: their creation order, and retention of whole folders.

Versions are ordered by when they were created, never by name (`--run-id manual` is not "newest").
Retention keeps the last `backend.retention` promoted versions, the live one and the newest rollback
target, and failed or never-promoted runs for `backend.keep_failed_days` (for inspection); everything
else goes as a whole folder (documents, chunks, embed shards, index), not only its index. It also
clears what crashed writers left behind. Callers hold the writer lock (sourcegate/pipelines/release/lock.py), so no
other writer is mid-way through anything this deletes.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sourcegate.artifact_io import read_json
from sourcegate.artifact_io import run_folder as rf
from sourcegate.pipelines.versions.manifest import read_manifest

log = logging.getLogger(__name__)
DAY_S = 86_400.0
DELETING = ".deleting-"  # a folder being removed: renamed first, so a crash never leaves half a run that looks whole
LEFTOVER_FILES = (".*.tmp",)  # artifact_io.atomic_write's temp files
LEFTOVER_DIRS = ("index.tmp",)  # EmbeddedStore.load's half-built index


def created_at(folder: Path) -> float:
    """When the run in `folder` was created (epoch seconds): its index version's manifest `created`, else
    run.json's `started_at` (a run that never loaded, or an OpenSearch version), else the folder's mtime."""
    manifest = read_manifest(folder / "index") if (folder / "index").is_dir() else None
    if manifest and manifest.get("created"):
        return datetime.fromisoformat(manifest["created"]).timestamp()
    started = _info(folder).get("started_at")
    if started:
        return datetime.fromisoformat(started).timestamp()
    return folder.stat().st_mtime if folder.exists() else 0.0


def _info(folder: Path) -> dict:
    try:
        return read_json(folder / rf.RUN_INFO)
    except (OSError, ValueError):
        return {}


@dataclass(frozen=True)
class Run:
    name: str
    created: float
    promoted: bool


def list_runs(runs_dir: Path, promoted: set[str] | None = None) -> list[Run]:
    """Every run folder, oldest first (by creation time; name breaks ties). `promoted`: the versions the
    promotions log names (the truth: run.json's `promoted` can lag a crash); None reads run.json."""
    if not runs_dir.is_dir():
        return []
    found = [
        Run(p.name, created_at(p), p.name in promoted if promoted is not None else "promoted" in _info(p))
        for p in runs_dir.iterdir()
        if p.is_dir() and not p.name.startswith(".")
    ]
    return sorted(found, key=lambda r: (r.created, r.name))


def doomed_runs(runs: list[Run], live: str | None, keep: int, keep_failed_days: float, now: float) -> list[str]:
    """The run folders retention deletes (pure: `runs` oldest first)."""
    promoted = [r for r in runs if r.promoted]
    newest = [r.name for r in promoted[::-1][: max(keep, 0)]]
    rollback = next((r.name for r in reversed(promoted) if r.name != live), None)
    kept = {live, rollback, *newest}
    doomed = []
    for r in runs:
        if r.name in kept:
            continue
        if r.promoted or now - r.created > keep_failed_days * DAY_S:
            doomed.append(r.name)
    return doomed


def leftovers(runs_dir: Path, before: float) -> list[Path]:
    """Temporary files and folders of crashed writers, last modified before `before`."""
    if not runs_dir.is_dir():
        return []
    found = [p for p in runs_dir.iterdir() if p.name.startswith(DELETING)]
    for pattern in LEFTOVER_FILES:
        found += runs_dir.parent.glob(pattern)  # LIVE's and the lock record's
        found += runs_dir.glob(f"*/{pattern}")
        found += runs_dir.glob(f"*/*/{pattern}")  # embed/, index/
    for name in LEFTOVER_DIRS:
        found += runs_dir.glob(f"*/{name}")
    return sorted(p for p in found if p.lstat().st_mtime < before)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def retain_runs(
    runs_dir: Path, store, keep: int, keep_failed_days: float, now: float | None = None, before: float | None = None
) -> dict:
    """Apply retention to `runs_dir` and `store` (its index versions); returns what was deleted."""
    now = time.time() if now is None else now
    live = store.live()
    promoted = {r["version"] for r in store.promotions()}
    doomed = doomed_runs(list_runs(runs_dir, promoted), live, keep, keep_failed_days, now)
    indexed = set(store.versions())
    for name in doomed:
        if name in indexed:
            store.drop(name)  # the index first: a crash in between leaves a folder the next retention deletes
        folder = runs_dir / name
        if folder.exists():
            trash = folder.with_name(DELETING + name)
            folder.rename(trash)
            shutil.rmtree(trash)
        log.info("retention: deleted run %s", name)
    cleaned = [str(p) for p in leftovers(runs_dir, now if before is None else before)]
    for path in cleaned:
        remove(Path(path))
        log.info("retention: removed leftover %s", path)
    return {"runs": doomed, "leftovers": cleaned}
