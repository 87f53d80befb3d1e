"""The promotions log (G4): one append-only record per promotion and rollback, and rollback's default target.

The embedded backend keeps it as JSON Lines beside the LIVE pointer; OpenSearch as one document per record
in the index <prefix>-_promotions. Both backends write it through their store; this module holds the record
and the file format, and no gate policy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

PROMOTIONS_LOG = "promotions.jsonl"  # embedded: beside the LIVE pointer, in the artifacts folder
PROMOTIONS_INDEX = "_promotions"  # OpenSearch: the index <prefix>-_promotions (no version is named so)


def promotion_record(version: str, previous: str | None, verdict_sha256: str | None, actor: str, **extra) -> dict:
    """One line of the append-only promotions log."""
    return {
        "time": datetime.now(UTC).isoformat(timespec="microseconds"),
        "version": version,
        "previous": previous,
        "verdict_sha256": verdict_sha256,
        "actor": actor,
        **extra,
    }


def rollback_target(log: list[Mapping], live: str | None, present: set[str]) -> str | None:
    """The default rollback target: the newest promoted version other than the live one that still exists and that
    no rollback left since it was last promoted (a second rollback goes further back, never to the version the first
    one rolled back from)."""
    left = set()  # versions a rollback moved LIVE away from, newer than their last promotion
    for record in reversed(log):
        version = record["version"]
        if record.get("kind") == "rollback" and record.get("previous"):
            left.add(record["previous"])
        if version != live and version in present and version not in left:
            return version
    return None


def left_by_rollback(log: list[Mapping], version: str) -> str | None:
    """The rollback that moved LIVE away from `version` after its last promotion, as "<time> by <actor>"; None if
    none did."""
    for record in reversed(log):
        if record.get("kind") == "rollback" and record.get("previous") == version:
            return f"{record.get('time')} by {record.get('actor')}"
        if record["version"] == version:
            return None
    return None


def append_record(record: Mapping, path: str | Path) -> None:
    """Append one JSON line and fsync: the log only ever grows."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n"
    with open(path, "a+b") as fh:
        if fh.tell() > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":  # a line torn by a crash: start a fresh line, keep the torn one visible
                line = "\n" + line
        fh.write(line.encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())


def read_records(path: str | Path) -> list[dict]:
    """Every record of a promotions log, oldest first (a torn last line from a crash is skipped). Lines end at "\n"
    only: a record's text holds U+2028 or U+0085 unescaped (ensure_ascii=False), where str.splitlines() breaks."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records
