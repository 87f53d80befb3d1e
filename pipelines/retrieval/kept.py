"""Values kept across nights: rows of float32 keyed by a text hash, under a model fingerprint.

What depends on a text alone (a question's or a sentence's bi-encoder vector, a question-passage
pair's cross-encoder logit) need not be computed again the next night, as the chunk cache does for
chunk vectors (pipelines/build/embed.py). One Parquet file per kind: `key`, `model_fingerprint`,
`values` (a fixed-size list of float32, or float64 for logits), written atomically.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

log = logging.getLogger(__name__)


def text_key(*texts: str) -> str:
    """SHA-256 of the texts, NUL-separated (a pair's key is its two texts')."""
    return hashlib.sha256("\0".join(texts).encode("utf-8", "surrogatepass")).hexdigest()


def save(path: Path, fingerprint: str | None, rows: Mapping[str, np.ndarray], width: int, dtype=np.float32) -> int:
    """Write `rows` (key -> `width` numbers of `dtype`) under `fingerprint`, sorted by key; returns the rows written."""
    keys = sorted(rows)
    flat = np.array([np.asarray(rows[k], dtype).reshape(width) for k in keys], dtype).reshape(-1)
    table = pa.table(
        {
            "key": pa.array(keys, pa.string()),
            "model_fingerprint": pa.array([fingerprint] * len(keys), pa.string()),
            "values": pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.from_numpy_dtype(dtype)), width),
        }
    )
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return len(keys)


def load(path: Path | None, fingerprint: str | None, width: int, dtype=np.float32) -> dict[str, np.ndarray]:
    """The rows an earlier night kept under this fingerprint and width (as `dtype`, the type they were saved in).

    A missing file (or no fingerprint to match) is nothing kept; a file that cannot be read is
    logged and ignored (its values are computed again, to the same numbers), never trusted half-read.
    """
    if path is None or fingerprint is None or not Path(path).exists():
        return {}
    try:
        table = pq.read_table(path, columns=["key", "model_fingerprint", "values"])
        table = table.filter(pc.equal(table["model_fingerprint"], fingerprint))
        if table.num_rows == 0:  # another model's values: nothing of this one's kept (whatever their width)
            return {}
        col = table["values"].combine_chunks()
        if col.type.list_size != width:
            log.warning("%s holds rows of %d values, not %d: not reused", path, col.type.list_size, width)
            return {}
    except (OSError, KeyError, ValueError, AttributeError, pa.ArrowException) as exc:
        log.warning("%s unreadable, computing again: %s", path, exc)
        return {}
    values = col.flatten().to_numpy(zero_copy_only=False).reshape(-1, width).astype(dtype)
    return dict(zip(table["key"].to_pylist(), values))
