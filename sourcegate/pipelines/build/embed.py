"""Embed: chunk texts -> unit-norm float32 vectors, with a cache keyed by (text hash, model fingerprint).

A chunk whose text and model are unchanged since the previous run reuses its vector, so
a nightly run costs in proportion to what changed. The model is its fingerprint (a hash of
the weight files loaded, `models.fingerprint`) as well as its id: new weights, or another
`model_path` under the same id, re-embed everything.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sourcegate.pipelines import faults, models
from sourcegate.pipelines.batches import iter_batches, num_rows, read_rows, shard_range, write_batches

log = logging.getLogger(__name__)


class Embedder:
    """sentence-transformers bi-encoder on the CPU; normalised float32 output."""

    def __init__(self, model_id: str, model_path: str | None = None, batch_size: int = 32):
        from sentence_transformers import SentenceTransformer

        self.model_id = model_id
        self.path = models.embedding_model_path(model_path)
        self.batch_size = batch_size
        self.model = SentenceTransformer(str(self.path), device="cpu")
        self.dimension = int(
            self.model.get_embedding_dimension()
            if hasattr(self.model, "get_embedding_dimension")
            else self.model.get_sentence_embedding_dimension()
        )
        self.max_tokens = int(self.model.max_seq_length)

    @property
    def fingerprint(self) -> str:
        return models.fingerprint(self.path)

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vectors = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=progress,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_query(self, text: str) -> np.ndarray:
        return self.encode([text])[0]

    @property
    def tokenizer(self):
        return models.tokenizer(str(self.path))


@dataclass
class EmbedStats:
    encoded: int
    reused: int


CACHE_COLUMNS = ["text_hash", "model_id", "model_fingerprint", "embedding"]


def _has_fingerprints(chunks_parquet: str | Path | None) -> bool:
    return (
        bool(chunks_parquet)
        and Path(chunks_parquet).exists()
        and "model_fingerprint" in pq.read_schema(chunks_parquet).names
    )


def same_model(table: pa.Table, model_id: str, fingerprint: str) -> pa.ChunkedArray:
    """Rows encoded by this model: the same id and the same weights."""
    return pc.and_(pc.equal(table["model_id"], model_id), pc.equal(table["model_fingerprint"], fingerprint))


class VectorCache:
    """The vectors of an earlier run that one embed shard can hit, spilled to a memory-mapped file.

    Built in one pass over the earlier chunks.parquet, batch by batch: a row is kept only when its
    text hash is one of the shard's keys and its model is this one, so memory holds a batch and the
    shard's keys (Arrow strings), never the earlier run; the kept vectors go to `spill` and are read
    back memory-mapped.
    """

    def __init__(self, hashes: pa.Array, vectors: np.ndarray):
        self.hashes, self.vectors = hashes, vectors

    @classmethod
    def build(
        cls,
        chunks_parquet: str | Path | None,
        keys: pa.Array,
        model_id: str,
        fingerprint: str,
        spill: Path,
        dimension: int,
        rows: int | None = None,
    ) -> VectorCache:
        hashes, count = [], 0
        if _has_fingerprints(chunks_parquet) and len(keys):
            wanted = pa.array(pc.unique(keys))
            with open(spill, "wb") as fh:
                for t in iter_batches(chunks_parquet, CACHE_COLUMNS, rows):
                    t = t.filter(pc.and_(same_model(t, model_id, fingerprint), pc.is_in(t["text_hash"], wanted)))
                    if t.num_rows and t["embedding"].type.list_size == dimension:
                        fh.write(np.ascontiguousarray(embedding_matrix(t)).tobytes())
                        hashes.append(t["text_hash"].combine_chunks())
                        count += t.num_rows
        if not count:
            spill.unlink(missing_ok=True)
            return cls(pa.array([], pa.string()), np.zeros((0, dimension), np.float32))
        vectors = np.memmap(spill, dtype=np.float32, mode="r", shape=(count, dimension))
        return cls(pa.concat_arrays(hashes), vectors)

    def positions(self, hashes) -> np.ndarray:
        """Row of each hash in `vectors` (its first occurrence), -1 where the cache has none."""
        found = pc.index_in(hashes, value_set=self.hashes)
        return pc.fill_null(found, -1).to_numpy(zero_copy_only=False).astype(np.int64)


def embed_chunks(
    rows: list[dict], embedder, cache: dict[str, np.ndarray], progress: bool = False
) -> tuple[np.ndarray, EmbedStats]:
    """Vectors for `rows` in order; only texts missing from the cache are encoded (each once)."""
    todo = sorted({r["text_hash"]: r["text"] for r in rows if r["text_hash"] not in cache}.items())
    fresh = embedder.encode([text for _, text in todo], progress=progress)
    known = dict(cache)
    known.update({h: fresh[i] for i, (h, _) in enumerate(todo)})
    dim = embedder.dimension
    out = np.stack([known[r["text_hash"]] for r in rows]) if rows else np.zeros((0, dim), np.float32)
    return out.astype(np.float32), EmbedStats(encoded=len(todo), reused=len(rows) - len(todo))


CHUNK_FIELDS = ["chunk_id", "doc_id", "title", "section", "section_id", "body", "text", "text_hash", "ordinal"]


def embedding_matrix(table: pa.Table) -> np.ndarray:
    col = table["embedding"].combine_chunks()
    dim = col.type.list_size
    return col.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim).astype(np.float32, copy=False)


def chunks_schema(dimension: int) -> pa.Schema:
    """chunks.parquet: the chunk fields, the model that encoded each row, and its vector."""
    text = pa.string()
    fields = [(f, pa.int32() if f == "ordinal" else text) for f in CHUNK_FIELDS]
    fields += [("model_id", text), ("model_fingerprint", text), ("embedding", pa.list_(pa.float32(), dimension))]
    return pa.schema(fields)


def with_vectors(table: pa.Table, vectors: np.ndarray, model_id: str, fingerprint: str | None) -> pa.Table:
    """A batch of chunk rows (chunks.text columns) with its vectors, in the chunks.parquet schema."""
    n, dim = vectors.shape
    table = table.select(CHUNK_FIELDS).set_column(
        CHUNK_FIELDS.index("ordinal"), "ordinal", pc.cast(table["ordinal"], pa.int32())
    )
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1), pa.float32())
    table = table.append_column("model_id", pa.array([model_id] * n, pa.string()))
    table = table.append_column("model_fingerprint", pa.array([fingerprint] * n, pa.string()))
    return table.append_column("embedding", pa.FixedSizeListArray.from_arrays(flat, dim))


def embed_shard(
    chunks_text: str | Path,
    out: str | Path,
    embedder,
    *,
    shard: int = 0,
    shards: int = 1,
    cache_source: str | Path | None = None,
    progress: bool = False,
    rows: int | None = None,
) -> EmbedStats:
    """Embed rows [start, stop) of chunks.text (shard `shard` of `shards`, contiguous) into `out`.

    Reads only the shard's row groups and only the earlier run's vectors its text hashes can hit
    (`VectorCache`). Texts missing from the cache are encoded once each, in text-hash order, all in
    one call: the same vectors whatever the batch size. Memory: a batch, the shard's keys, and the
    texts to encode (what changed).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start, stop = shard_range(num_rows(chunks_text), shard, shards)
    keys = [t["text_hash"].combine_chunks() for t in read_rows(chunks_text, start, stop, ["text_hash"], rows)]
    keys = pa.concat_arrays(keys) if keys else pa.array([], pa.string())
    dim, fingerprint = embedder.dimension, embedder.fingerprint
    spill = out.with_name(f".{out.stem}.cache.tmp")
    cache = VectorCache.build(cache_source, keys, embedder.model_id, fingerprint, spill, dim, rows)
    try:
        todo: dict[str, str] = {}
        for t in read_rows(chunks_text, start, stop, ["text_hash", "text"], rows):
            miss = t.filter(pc.equal(pc.fill_null(pc.index_in(t["text_hash"], value_set=cache.hashes), -1), -1))
            todo.update(zip(miss["text_hash"].to_pylist(), miss["text"].to_pylist()))
        todo_sorted = sorted(todo.items())
        fresh = embedder.encode([text for _, text in todo_sorted], progress=progress)
        fresh_row = {h: i for i, (h, _) in enumerate(todo_sorted)}
        faults.reached("embed:encoded")

        def tables():
            for t in read_rows(chunks_text, start, stop, rows=rows):
                vectors = np.empty((t.num_rows, dim), np.float32)
                found = cache.positions(t["text_hash"])
                hit = found >= 0
                vectors[hit] = cache.vectors[found[hit]]
                for i in np.flatnonzero(~hit):
                    vectors[i] = fresh[fresh_row[t["text_hash"][int(i)].as_py()]]
                yield with_vectors(t, vectors, embedder.model_id, fingerprint)

        write_batches(tables(), out, chunks_schema(dim))
    finally:
        spill.unlink(missing_ok=True)  # a mapping stays readable until dropped; the name goes now
    return EmbedStats(encoded=len(todo), reused=stop - start - len(todo))


def merge_shards(chunks_text: str | Path, shard_files: list[Path], out: str | Path) -> int:
    """chunks.parquet: the shards' rows in shard order, checked batch by batch against chunks.text's order."""
    order = pq.read_table(chunks_text, columns=["chunk_id"])["chunk_id"].combine_chunks()  # ids only: Arrow

    def tables():
        done = 0
        for path in shard_files:
            for t in iter_batches(path):
                if not t["chunk_id"].combine_chunks().equals(order.slice(done, t.num_rows)):
                    _raise_unmerged(order, shard_files)
                done += t.num_rows
                yield t
        if done != len(order):
            _raise_unmerged(order, shard_files)

    if not shard_files:
        _raise_unmerged(order, shard_files)
    # the schema the shards were written with (read back, a list's values are renamed): one shard's merge is
    # then the shard byte for byte, and shares its stored copy on an object store (versions/segments.py)
    schema = chunks_schema(pq.read_schema(shard_files[0]).field("embedding").type.list_size)
    return write_batches(tables(), out, schema)


def _raise_unmerged(order: pa.Array, shard_files: list[Path]):
    """The error for shards that do not add up to chunks.text: name what is missing."""
    ids = [pq.read_table(p, columns=["chunk_id"])["chunk_id"] for p in shard_files]
    have = pa.chunked_array([c for t in ids for c in t.chunks], pa.string()).combine_chunks()
    missing = order.filter(pc.invert(pc.is_in(order, have)))
    if len(missing):
        raise RuntimeError(f"{len(missing)} chunks have no embedding (first: {missing[0].as_py()})")
    raise RuntimeError("the embed shards are not in chunk order (were they cut for another shard count?)")
