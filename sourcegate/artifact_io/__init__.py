"""Artifact writes: JSON-safe values, and atomic files a reader never sees half-written.

Every write goes to a temp file beside the target and is moved into place with
os.replace, so the gate, a maintainer's browser or the Airflow plugin sees either the
old file or the whole new one.

The bottom layer: `sourcegate/pipelines/` and `sourcegate/evals/` both write their artifacts through it, and it
imports neither (tests/test_layers.py).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np


def jsonable(obj: Any) -> Any:
    """Plain-Python copy of obj: numpy scalars/arrays unwrapped, NaN/inf -> None."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        return value if math.isfinite(value) else None  # JSON has no NaN
    return obj


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call write(temp path) and move the result over `path` in one step."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would hide artifacts from other readers
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(text: str, path: str | os.PathLike) -> Path:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())

    return atomic_write(path, write)


def write_json(obj: Any, path: str | os.PathLike) -> Path:
    """Indented, key-sorted, strict JSON (no NaN tokens)."""
    return write_text(
        json.dumps(jsonable(obj), indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False) + "\n", path
    )


def write_jsonl(rows: Iterable[Any], path: str | os.PathLike) -> Path:
    """One JSON object per line (sorted keys, NaN as null), atomically."""
    text = "".join(
        json.dumps(jsonable(row), sort_keys=True, allow_nan=False, ensure_ascii=False) + "\n" for row in rows
    )
    return write_text(text, path)


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))
