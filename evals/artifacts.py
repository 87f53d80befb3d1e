"""Writing eval artifacts: JSON-safe values and atomic file writes.

A reader (the gate, a maintainer's browser, the Airflow plugin) must never see
a half-written file, so every write goes to a temp file beside the target and
is moved into place with os.replace.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
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


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write text so that readers see either the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would hide artifacts from other readers
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """Write obj as indented JSON (strict: no NaN tokens) atomically."""
    text = json.dumps(jsonable(obj), indent=2, allow_nan=False, ensure_ascii=False)
    return write_text_atomic(path, text + "\n")
