"""Atomic file writes: a reader never sees a half-written artifact."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def _atomic(path: Path, write) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_parquet(table: pa.Table, path: Path) -> Path:
    return _atomic(path, lambda tmp: pq.write_table(table, tmp))


def write_text(text: str, path: Path) -> Path:
    return _atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_json(obj, path: Path) -> Path:
    return write_text(json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n", path)


def read_json(path: Path):
    return json.loads(Path(path).read_text(encoding="utf-8"))
