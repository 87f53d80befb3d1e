"""Values kept across nights: rows of float32 keyed by a text hash, under a binding.

What depends on a text alone (a question's or a sentence's bi-encoder vector, a question-passage
pair's cross-encoder logit) need not be computed again the next night, as the chunk cache does for
chunk vectors (sourcegate/pipelines/build/embed.py). One Parquet file per kind: `key`, `binding`, `values` (a
fixed-size list of float32, or float64 for logits), written atomically.

A value is a function of more than its text and the model's files: the code that turns the text (or the
pair) into model inputs (truncation length, how a pair is assembled, how the model graph is put together)
and the runtime that runs it (onnxruntime, tokenizers, torch...). `binding` hashes all of them, so a row
kept under any other recipe or runtime is computed again, never reused.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

log = logging.getLogger(__name__)


# The packages whose code computes a kept value (tokenising, the forward pass, pooling): a new version of any of
# them may move a value, so it is part of every binding.
RUNTIME = ("numpy", "onnxruntime", "tokenizers", "torch", "transformers", "sentence-transformers")


def runtime_versions(packages: tuple[str, ...] = RUNTIME) -> dict[str, str | None]:
    """The installed version of each package (None when it is not installed)."""
    found = {}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def source_digest(*parts) -> str:
    """SHA-256 of the source of functions or classes (the code that builds a model's input from a text); one
    whose source cannot be read (built at run time) is named by its qualified name."""
    texts = []
    for part in parts:
        try:
            texts.append(inspect.getsource(part))
        except (OSError, TypeError):
            texts.append(f"{getattr(part, '__module__', '?')}.{getattr(part, '__qualname__', repr(part))}")
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()


def binding(fingerprint: str | None, recipe: Mapping) -> str | None:
    """What a kept value is a function of besides its text: the model files' fingerprint, the `recipe` (settings
    and code digests that build the model's input) and the runtime's versions. None without a fingerprint
    (nothing can be kept for a model that cannot be identified)."""
    if fingerprint is None:
        return None
    facts = {"model": fingerprint, "recipe": dict(recipe), "runtime": runtime_versions()}
    return "sha256:" + hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def text_key(*texts: str) -> str:
    """SHA-256 of the texts, NUL-separated (a pair's key is its two texts')."""
    return hashlib.sha256("\0".join(texts).encode("utf-8", "surrogatepass")).hexdigest()


def save(path: Path, bound: str | None, rows: Mapping[str, np.ndarray], width: int, dtype=np.float32) -> int:
    """Write `rows` (key -> `width` numbers of `dtype`) under the binding `bound`, sorted by key; returns the rows
    written."""
    keys = sorted(rows)
    flat = np.array([np.asarray(rows[k], dtype).reshape(width) for k in keys], dtype).reshape(-1)
    table = pa.table(
        {
            "key": pa.array(keys, pa.string()),
            "binding": pa.array([bound] * len(keys), pa.string()),
            "values": pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.from_numpy_dtype(dtype)), width),
        }
    )
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return len(keys)


def load(path: Path | None, bound: str | None, width: int, dtype=np.float32) -> dict[str, np.ndarray]:
    """The rows an earlier night kept under the binding `bound` and width (as `dtype`, the type they were saved in).

    A missing file (or no binding to match) is nothing kept; a file that cannot be read, or that was kept
    before rows were bound (no `binding` column), is logged and ignored (its values are computed again),
    never trusted half-read.
    """
    if path is None or bound is None or not Path(path).exists():
        return {}
    try:
        table = pq.read_table(path, columns=["key", "binding", "values"])
        table = table.filter(pc.equal(table["binding"], bound))
        if table.num_rows == 0:  # another model's, recipe's or runtime's values: none of them reused
            log.info("%s: no rows kept under this binding: computing again", path)
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
