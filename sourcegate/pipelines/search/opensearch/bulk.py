"""Bulk loading of chunk rows into an index: actions from Parquet batches, 429/5xx retried with backoff."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sourcegate.pipelines.search.opensearch.backoff import delays

log = logging.getLogger(__name__)
FILTER_BATCH = 8192  # Parquet rows read per batch when only a night's delta is indexed


def _retryable(status: Any) -> bool:
    return isinstance(status, int) and (status == 429 or 500 <= status < 600)


def embedding_dimension(pf: pq.ParquetFile) -> int:
    field = pf.schema_arrow.field("embedding")
    if pa.types.is_fixed_size_list(field.type):
        return field.type.list_size
    if pa.types.is_list(field.type) or pa.types.is_large_list(field.type):
        for batch in pf.iter_batches(batch_size=64, columns=["embedding"]):
            lengths = pc.list_value_length(batch.column(0)).drop_null()
            if len(lengths):
                return int(lengths[0].as_py())
        raise ValueError("chunks.parquet has no embeddings")
    raise ValueError(f"chunks.parquet 'embedding' must be a list of floats, got {field.type}")


def _vectors(column: pa.Array, dim: int) -> np.ndarray:
    if column.null_count:
        raise ValueError(f"{column.null_count} chunk(s) have no embedding")
    if not pa.types.is_fixed_size_list(column.type):
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        if (lengths != dim).any():
            raise ValueError(f"embeddings of mixed lengths (expected {dim})")
    return np.asarray(column.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, dim)


def document_sources(batch: pa.RecordBatch, columns: list[str], dim: int) -> list[dict]:
    """The `_source` of each row's document: what a load sends and what its content digest covers."""
    vectors = _vectors(batch.column(batch.schema.get_field_index("embedding")), dim)
    fields = {c: batch.column(batch.schema.get_field_index(c)).to_pylist() for c in columns if c != "embedding"}
    sources = []
    for i in range(batch.num_rows):
        source = {c: fields[c][i] for c in fields}
        source["embedding"] = vectors[i].tolist()
        if not source["chunk_id"]:
            raise ValueError("a chunk has an empty chunk_id")
        sources.append(source)
    return sources


class BulkLoader:
    """Sends a version's rows to one index; idempotent by chunk id, so a retried request is harmless."""

    def __init__(
        self, client, *, chunk_size: int, max_retries: int, initial_backoff: float, max_backoff: float, progress: bool
    ):
        self.client = client
        self.chunk_size = chunk_size
        self.max_retries = max_retries
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.progress = progress

    def _actions(self, batch: pa.RecordBatch, columns: list[str], dim: int) -> list[dict]:
        return [
            {"_index": None, "_id": src["chunk_id"], "_source": src} for src in document_sources(batch, columns, dim)
        ]

    def _batches(
        self, pf: pq.ParquetFile, columns: list[str], dim: int, only: pa.Array | None = None
    ) -> Iterator[list[dict]]:
        """Bulk actions, `chunk_size` at a time; with `only`, for the rows whose chunk_id is in it."""
        pending: list[dict] = []
        for batch in pf.iter_batches(batch_size=self.chunk_size if only is None else FILTER_BATCH, columns=columns):
            if only is not None:
                batch = batch.filter(pc.is_in(batch.column(batch.schema.get_field_index("chunk_id")), value_set=only))
            pending.extend(self._actions(batch, columns, dim))
            while len(pending) >= self.chunk_size:
                yield pending[: self.chunk_size]
                pending = pending[self.chunk_size :]
        if pending:
            yield pending

    def load(
        self, index: str, pf: pq.ParquetFile, columns: list[str], dim: int, rows: int, only: pa.Array | None = None
    ) -> int:
        from tqdm import tqdm

        sent = 0
        with tqdm(total=rows, desc=f"load {index}", unit="chunk", disable=not self.progress, mininterval=2.0) as bar:
            for actions in self._batches(pf, columns, dim, only):
                for a in actions:
                    a["_index"] = index
                n = self.send(actions)
                sent += n
                bar.update(n)
        return sent

    def send(self, actions: list[dict]) -> int:
        """One chunk through ``streaming_bulk``; 429/5xx (whole request or per item) retried with backoff."""
        from opensearchpy import ConnectionError as OSConnectionError
        from opensearchpy import TransportError
        from opensearchpy.helpers import streaming_bulk

        by_id = {a["_id"]: a for a in actions}
        pending = actions
        done = 0
        waits = [0.0, *delays(self.max_retries, self.initial_backoff, self.max_backoff)]
        for attempt, delay in enumerate(waits):
            if attempt:
                log.warning(
                    "bulk: retrying %d chunk(s) in %.1fs (attempt %d/%d)",
                    len(pending),
                    delay,
                    attempt,
                    self.max_retries,
                )
                time.sleep(delay)
            retry, failed = [], []
            try:
                for ok, item in streaming_bulk(
                    self.client,
                    pending,
                    chunk_size=len(pending),
                    raise_on_error=False,
                    raise_on_exception=True,
                    max_retries=0,
                    yield_ok=True,
                ):
                    info = next(iter(item.values()))
                    if ok:
                        done += 1
                    elif _retryable(info.get("status")):
                        retry.append(by_id[info["_id"]])
                    else:
                        failed.append(info)
            except OSConnectionError:
                raise
            except TransportError as e:
                if _retryable(e.status_code) and attempt < self.max_retries:
                    log.warning("bulk: HTTP %s from OpenSearch: %s", e.status_code, e.error)
                    continue  # the whole chunk again (ids make it idempotent)
                raise
            if failed:
                first = failed[0]
                raise RuntimeError(
                    f"{len(failed)} chunk(s) rejected by OpenSearch, e.g. {first.get('_id')}: {first.get('error')}"
                )
            if not retry:
                return done
            pending = retry
        raise RuntimeError(f"{len(pending)} chunk(s) still rejected (429/5xx) after {self.max_retries} retries")
