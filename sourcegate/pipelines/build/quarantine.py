"""quarantine.jsonl: every input a run set aside, with the step that set it aside and why.

Ingest, chunk and validate each own their rows (`stage`); a step rewrites only its own rows,
so rerunning a step (an Airflow retry, a cleared task) never duplicates or loses a reason.
"""

from __future__ import annotations

import json
from pathlib import Path

from sourcegate.artifact_io import run_folder as rf
from sourcegate.artifact_io import write_text
from sourcegate.pipelines.build.doc_ids import HostileName, id_from_path

FILE = rf.QUARANTINE


def read(folder: str | Path) -> list[dict]:
    path = Path(folder) / FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_stage(folder: str | Path, stage: str, rows: list[dict]) -> Path:
    """Replace `stage`'s rows in the run's quarantine file with `rows` (other stages' rows kept, in order)."""
    kept = [r for r in read(folder) if r.get("stage", "ingest") != stage]
    lines = kept + [{**r, "stage": stage} for r in rows]
    return write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in lines), Path(folder) / FILE)


def documents(rows: list[dict]) -> dict[str, str]:
    """{doc id: reason} of the set-aside documents whose id is known: recorded (chunk, duplicates) or made from a
    corpus file's path as ingest makes it (a front-matter id of a document that could not be read stays unknown)."""
    found = {}
    for r in rows:
        doc_id = r.get("doc_id")
        if doc_id is None and r.get("source") and ":" not in Path(r["source"]).name:  # not a BEIR file:line
            try:
                doc_id = id_from_path(Path(r["source"]).as_posix())
            except HostileName:
                continue
        if doc_id:
            found.setdefault(doc_id, r["reason"])
    return found


def reason_counts(rows: list[dict]) -> dict:
    """{reason kind: count}; the kind is the reason up to its first ':' or ' (' (details vary per row)."""
    out: dict[str, int] = {}
    for r in rows:
        key = r["reason"].split(" (")[0].split(":")[0]
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def summary(folder: str | Path) -> dict:
    """What run.json records: the total, per stage and per reason kind."""
    rows = read(folder)
    stages: dict[str, int] = {}
    for r in rows:
        stages[r.get("stage", "ingest")] = stages.get(r.get("stage", "ingest"), 0) + 1
    return {"total": len(rows), "by_stage": dict(sorted(stages.items())), "by_reason": reason_counts(rows)}
