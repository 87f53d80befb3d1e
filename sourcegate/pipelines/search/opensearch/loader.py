"""Building one version on OpenSearch: a full bulk load, or a clone of the live version plus the night's
delta; then the completion mark (`_count` and ids checked against the Parquet, the manifest in `_meta`).

A version is promotable only after its load marked it complete: a half-built index is never served.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from sourcegate.pipelines.batches import open_parquet
from sourcegate.pipelines.search import delta as delta_mod
from sourcegate.pipelines.search.base import refuse_rebuilding_live
from sourcegate.pipelines.search.delta import Delta
from sourcegate.pipelines.search.opensearch import content
from sourcegate.pipelines.search.opensearch.bulk import BulkLoader, embedding_dimension
from sourcegate.pipelines.search.opensearch.mapping import REQUIRED_COLUMNS, ids_checksum, index_body, indexed_columns
from sourcegate.pipelines.versions import manifest as mf

log = logging.getLogger(__name__)


class VersionWriter(Protocol):
    """What building a version needs of the OpenSearch store (OpenSearchStore is one). The loader depends on
    this, not on the store, so the store can call the loader without the two importing each other."""

    client: Any  # opensearchpy.OpenSearch
    bulk: BulkLoader
    prefix: str
    shards: int
    replicas: int

    def index_name(self, version: str) -> str: ...

    def live(self) -> str | None: ...

    def meta(self, index: str) -> dict | None: ...

    def set_meta(self, index: str, meta: dict) -> None: ...

    def verify(self, version: str, hashes: bool = True) -> dict: ...

    def ids_checksum(self, index: str) -> str: ...


@dataclass
class _Night:
    """One load: what it reads, and its ``build`` record (mode, reason, delta counts, wall per step)."""

    chunks_parquet: str
    rows: int
    dim: int
    columns: list[str]
    inputs: Mapping
    body_sha256: str
    build: dict = field(default_factory=lambda: {"mode": "full", "reason": None, "from": None, "steps_s": {}})

    def full(self, reason: str) -> None:
        self.build.update({"mode": "full", "reason": reason, "from": None})
        return None

    @contextmanager
    def step(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.build["steps_s"][name] = round(time.perf_counter() - start, 3)


def load_version(
    store: VersionWriter,
    version: str,
    chunks_parquet: str,
    inputs: Mapping | None = None,
    *,
    base_chunks: str | Path | None = None,
) -> int:
    """Build `version`, or reuse it when it is complete and built from `inputs` (never rebuild it).

    With `base_chunks`, the Parquet the live version was loaded from, the version is built from the
    live one when it can (`_load_delta`: clone + the night's delta); else by a full bulk load. The
    manifest's ``build`` says which, why, the delta's counts and the wall time of each step.
    """
    from opensearchpy import ConnectionError as OSConnectionError

    index = store.index_name(version)
    pf = open_parquet(chunks_parquet)
    names = set(pf.schema_arrow.names)
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise ValueError(f"{chunks_parquet}: missing column(s) {missing}")
    columns = indexed_columns(names)
    rows = pf.metadata.num_rows
    dim = embedding_dimension(pf)
    body_sha256 = mf.sha256_json(index_body(dim, shards=store.shards))

    try:
        refuse_rebuilding_live(store, version)
        reused = reuse_or_clear(store, index, version, inputs)
        if reused is not None:
            return reused
        meta = {
            "prefix": store.prefix,
            "version": version,
            "status": "loading",
            "source": str(chunks_parquet),
            "rows": rows,
            "dimension": dim,
        }
        night = _Night(chunks_parquet, rows, dim, columns, inputs or {}, body_sha256)
        delta = plan(store, night, base_chunks)
        log.info("%s: %s load (%s)", index, night.build["mode"], night.build["reason"])
        if delta is None:
            count = load_full(store, version, index, meta, pf, night)
        else:
            count = load_delta(store, version, index, meta, pf, night, delta)
    except OSConnectionError as e:
        raise RuntimeError(
            f"lost the connection to OpenSearch while loading {index} from {chunks_parquet}: {e}. "
            f"The index is incomplete and will not be promoted; rerun the load."
        ) from e
    log.info("loaded %s: %d chunks", index, count)
    return count


def reuse_or_clear(store: VersionWriter, index: str, version: str, inputs: Mapping | None) -> int | None:
    """The row count of a complete `index` built from `inputs` (reused); else clear what is there."""
    existing = store.meta(index)
    if existing is None:
        return None
    if existing.get("version") not in (None, version):
        raise ValueError(
            f"index {index} already holds version {existing.get('version')!r}, "
            f"not {version!r} (names collide after sanitising)"
        )
    done = existing.get("manifest") if existing.get("status") == "complete" else None
    if done is not None:
        refusal = mf.conflict(version, done, inputs or {})
        if refusal:
            raise refusal
        log.info("index %s is complete and built from the same inputs: reused", index)
        return int(done["rows"])
    log.warning("index %s exists (status %s); deleting it to rebuild", index, existing.get("status"))
    store.client.indices.delete(index=index)
    return None


def plan(store: VersionWriter, night: _Night, base_chunks: str | Path | None) -> Delta | None:
    """The delta from the live version, or None for a full load; `night.build` says why."""
    live = store.live()
    if live is None:
        return night.full("no previous version")
    if base_chunks is None:
        return night.full("full load requested")
    try:
        live_manifest = store.verify(live)  # in full: a delta never copies an edited version
    except mf.IntegrityError as exc:
        return night.full(f"the live version {live} failed its check ({exc})")
    reason = delta_mod.full_load_reason(live_manifest, night.inputs, night.body_sha256)
    if reason:
        return night.full(reason)
    base = Path(base_chunks)
    if not base.is_file():
        return night.full(f"the live version's Parquet {base} is missing")
    if indexed_columns(pq.ParquetFile(base).schema_arrow.names) != night.columns:
        return night.full("the indexed columns changed since the live version")
    with night.step("delta"):
        base_ids = pq.read_table(base, columns=["chunk_id"])["chunk_id"].to_pylist()
        if ids_checksum(base_ids) != live_manifest.get("ids_sha256"):
            return night.full(f"{base} does not hold the live version {live}'s chunk ids")
        delta = delta_mod.compute_delta(base, night.chunks_parquet, night.columns)
    night.build.update(delta.counts())
    if delta.fraction > delta_mod.MAX_DELTA_FRACTION:
        return night.full(
            f"the night touches {delta.fraction:.0%} of the live version's chunks "
            f"(over {delta_mod.MAX_DELTA_FRACTION:.0%}: a full load is as fast and leaves no deleted documents)"
        )
    night.build.update({"mode": "delta", "reason": f"built from the live version {live}", "from": live})
    return delta


def load_full(store: VersionWriter, version: str, index: str, meta: dict, pf: pq.ParquetFile, night: _Night) -> int:
    store.client.indices.create(index=index, body=index_body(night.dim, shards=store.shards, meta=meta))
    log.info("loading %d chunks (dim %d) from %s into %s", night.rows, night.dim, night.chunks_parquet, index)
    try:
        with night.step("bulk"):
            store.bulk.load(index, pf, night.columns, night.dim, night.rows)
        return complete(store, version, index, meta, night, check_ids=False)
    except Exception as exc:
        from opensearchpy import ConnectionError as OSConnectionError

        if not isinstance(exc, OSConnectionError):  # best effort; "loading" is not promotable either
            with contextlib.suppress(Exception):
                store.set_meta(index, {**meta, "status": "failed"})
        raise


def load_delta(
    store: VersionWriter, version: str, index: str, meta: dict, pf: pq.ParquetFile, night: _Night, delta: Delta
) -> int:
    """Clone the live index to `index`, apply `delta`, verify it against the Parquet.

    Any failure deletes the clone (best effort: without a connection it stays "loading", never
    promotable, and the next load of this version deletes it); the alias never moved.
    """
    live_index = store.index_name(night.build["from"])
    # `_clone` needs a write block on its source. The live index is immutable once promoted (no
    # step writes to a version after its load; promotion and rollback only move the alias), so
    # the block is harmless: it keeps serving reads, and it stays set.
    with night.step("write_block"):
        store.client.indices.put_settings(index=live_index, body={"index": {"blocks": {"write": True}}})
    try:
        with night.step("clone"):
            settings = {"index.number_of_replicas": 0, "index.refresh_interval": "-1"}
            store.client.indices.clone(index=live_index, target=index, body={"settings": settings})
            # the clone carries the live index's _meta (see `_own_meta`) and write block until here
            store.set_meta(index, {**meta, "built_from": night.build["from"]})
            store.client.indices.put_settings(index=index, body={"index": {"blocks": {"write": None}}})
        with night.step("delete"):
            for start in range(0, len(delta.removed), store.bulk.chunk_size):
                ids = delta.removed[start : start + store.bulk.chunk_size]
                store.bulk.send([{"_op_type": "delete", "_index": index, "_id": c} for c in ids])
        with night.step("bulk"):
            # an `index` action on an id the clone holds replaces that document: changed chunks
            # need no delete of their own
            only = pa.array(delta.upserts, pa.string())
            store.bulk.load(index, pf, night.columns, night.dim, len(delta.upserts), only=only)
        return complete(store, version, index, meta, night, check_ids=True)
    except Exception:
        with contextlib.suppress(Exception):
            store.client.indices.delete(index=index)
        raise


def complete(store: VersionWriter, version: str, index: str, meta: dict, night: _Night, *, check_ids: bool) -> int:
    """Refresh, check `_count` (and with `check_ids` the ids the index holds) against the Parquet, set
    the write block, then write the manifest (content digest, shards' max_seq_no) with the complete mark,
    in one request: the completion mark."""
    with night.step("refresh"):
        store.client.indices.put_settings(
            index=index, body={"index": {"refresh_interval": "1s", "number_of_replicas": store.replicas}}
        )
        store.client.indices.refresh(index=index)
    with night.step("verify"):
        count = int(store.client.count(index=index)["count"])
        if count != night.rows:
            raise RuntimeError(
                f"index {index}: _count is {count} after the {night.build['mode']} load, but "
                f"{night.chunks_parquet} has {night.rows} rows (duplicate chunk_id?); not promotable"
            )
        ids = pq.read_table(night.chunks_parquet, columns=["chunk_id"])["chunk_id"].to_pylist()
        ids_sha256 = ids_checksum(ids)
        if check_ids and store.ids_checksum(index) != ids_sha256:
            raise RuntimeError(
                f"index {index}: after the {night.build['mode']} load its chunk ids differ from "
                f"{night.chunks_parquet}'s (same count {count}); not promotable"
            )
    with night.step("digest"):
        content_sha256 = content.content_checksum(
            content.parquet_digests(open_parquet(night.chunks_parquet), night.columns, night.dim)
        )
    # immutable from here on (G1): the block is set before the complete mark, so no complete version
    # lacks it, and the shards' max_seq_no recorded after it is what opening the version checks
    store.client.indices.put_settings(index=index, body={"index": {"blocks": {"write": True}}})
    manifest = mf.build_manifest(
        version,
        rows=count,
        dimension=night.dim,
        inputs=night.inputs or None,
        backend="opensearch",
        index=index,
        source=str(night.chunks_parquet),
        ids_sha256=ids_sha256,
        content_sha256=content_sha256,
        max_seq_no=content.max_seq_nos(store.client, index),
        index_body_sha256=night.body_sha256,
        build=night.build,
    )
    store.set_meta(index, {**meta, "status": "complete", "count": count, "manifest": manifest})
    return count
