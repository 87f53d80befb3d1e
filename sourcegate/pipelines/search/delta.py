"""A night's change to the indexed chunks, and whether a version may be built from the previous one.

Pure Parquet and manifest work, no search engine: the OpenSearch store (sourcegate/pipelines/search/opensearch.py)
clones the live index and applies this delta instead of bulk-loading every chunk.

Each chunk row is reduced to (chunk_id, row hash), the hash over every column the index stores
(the embedding's float32 bytes included), so a chunk whose id stayed but whose stored fields or
vector moved is *changed*, not unchanged. The two tables are joined in Arrow (C++), so the Python
work is one hash per row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sourcegate.pipelines.batches import open_parquet

# A delta touching more than this share of the corpus is loaded whole: past it a full bulk load is
# about as fast, and it leaves no deleted documents in the segments (see `Delta.fraction`).
MAX_DELTA_FRACTION = 0.5
_READ_BATCH = 8192


@dataclass(frozen=True)
class Delta:
    """Chunk ids sorted; `unchanged` counts ids present in both with the same row hash."""

    added: list[str]
    changed: list[str]
    removed: list[str]
    unchanged: int

    @property
    def upserts(self) -> list[str]:
        """What the new version indexes (a bulk `index` of an existing id replaces its document)."""
        return self.added + self.changed

    @property
    def fraction(self) -> float:
        """The share of the previous version the night touches (removed and replaced documents)."""
        previous = self.unchanged + len(self.changed) + len(self.removed)
        touched = len(self.added) + len(self.changed) + len(self.removed)
        return touched / previous if previous else 1.0

    def counts(self) -> dict:
        return {
            "added": len(self.added),
            "changed": len(self.changed),
            "removed": len(self.removed),
            "unchanged": self.unchanged,
        }


def _row_hashes_of(batch: pa.RecordBatch, columns: Sequence[str]) -> list[bytes]:
    scalars = [batch.column(c).to_pylist() for c in columns if c != "embedding"]
    vectors = None
    if "embedding" in columns:
        column = batch.column("embedding")
        if column.null_count:
            raise ValueError(f"{column.null_count} chunk(s) have no embedding")
        flat = np.asarray(column.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
        vectors = flat.reshape(batch.num_rows, -1) if batch.num_rows else flat.reshape(0, 0)
    out = []
    # repr() quotes strings and escapes the separator, so the joined fields read back one way only
    for i, fields in enumerate(zip(*scalars)) if scalars else enumerate([()] * batch.num_rows):
        digest = hashlib.blake2b("\x1f".join(map(repr, fields)).encode("utf-8", "surrogatepass"), digest_size=16)
        if vectors is not None:
            digest.update(vectors[i].tobytes())
        out.append(digest.digest())
    return out


def row_hashes(chunks_parquet: str | Path, columns: Sequence[str]) -> pa.Table:
    """(chunk_id, row_hash) of every row, read in batches: the hash covers `columns`, in that order."""
    pf = open_parquet(chunks_parquet)
    missing = [c for c in ["chunk_id", *columns] if c not in pf.schema_arrow.names]
    if missing:
        raise ValueError(f"{chunks_parquet}: missing column(s) {missing}")
    ids, hashes = [], []
    for batch in pf.iter_batches(batch_size=_READ_BATCH, columns=list(dict.fromkeys(["chunk_id", *columns]))):
        ids.append(batch.column("chunk_id"))
        hashes.append(pa.array(_row_hashes_of(batch, columns), pa.binary(16)))
    return pa.table(
        {
            "chunk_id": pa.chunked_array(ids, pa.string()),
            "row_hash": pa.chunked_array(hashes, pa.binary(16)),
        }
    )


def _sorted_ids(table: pa.Table, mask: pa.ChunkedArray | pa.Array, column: str) -> list[str]:
    return sorted(table.filter(mask)[column].to_pylist())


def compute_delta(previous_parquet: str | Path, tonight_parquet: str | Path, columns: Sequence[str]) -> Delta:
    """What turns the version built from `previous_parquet` into one of `tonight_parquet`."""
    before = row_hashes(previous_parquet, columns).rename_columns(["id_before", "before"])
    after = row_hashes(tonight_parquet, columns).rename_columns(["id_after", "after"])
    joined = before.join(after, keys="id_before", right_keys="id_after", join_type="full outer", coalesce_keys=False)
    in_before, in_after = pc.is_valid(joined["before"]), pc.is_valid(joined["after"])
    both = pc.and_(in_before, in_after)
    same = pc.and_(both, pc.equal(joined["before"], joined["after"]))
    return Delta(
        added=_sorted_ids(joined, pc.invert(in_before), "id_after"),
        changed=_sorted_ids(joined, pc.and_(both, pc.invert(same)), "id_after"),
        removed=_sorted_ids(joined, pc.invert(in_after), "id_before"),
        unchanged=int(pc.sum(same.cast(pa.int64())).as_py() or 0),
    )


def full_load_reason(live: Mapping | None, inputs: Mapping, index_body_sha256: str) -> str | None:
    """Why tonight's version cannot be built from the live one (`live`: its manifest), or None when it can.

    The index body (mapping + settings: dimension, analyser, BM25 and HNSW parameters, shards) must be
    the same, and so must the model fingerprint and the chunker: their change touches every chunk.
    """
    if live is None:
        return "no previous version"
    if live.get("index_body_sha256") != index_body_sha256:
        if live.get("index_body_sha256") is None:
            return f"the live version {live.get('version')} records no index mapping/settings hash"
        return f"the index mapping/settings changed since the live version {live.get('version')}"
    before = live.get("inputs") or {}
    for key, what in (("model_fingerprint", "model fingerprint"), ("chunker", "chunker config")):
        if before.get(key) != inputs.get(key):
            return f"the {what} changed since the live version {live.get('version')}"
    return None
