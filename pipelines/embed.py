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
import pyarrow.parquet as pq

from pipelines import models

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


def load_cache(chunks_parquet: str | Path | None, model_id: str, fingerprint: str) -> dict[str, np.ndarray]:
    """text_hash -> vector from a previous run's chunks.parquet, for the same model (id AND weights) only.

    A file from before fingerprints were recorded has no `model_fingerprint` column: nothing is reused.
    """
    if not chunks_parquet or not Path(chunks_parquet).exists():
        return {}
    if "model_fingerprint" not in pq.read_schema(chunks_parquet).names:
        return {}
    t = pq.read_table(chunks_parquet, columns=["text_hash", "model_id", "model_fingerprint", "embedding"])
    keys = zip(t["text_hash"].to_pylist(), t["model_id"].to_pylist(), t["model_fingerprint"].to_pylist())
    vectors = embedding_matrix(t)
    return {h: vectors[i] for i, (h, m, f) in enumerate(keys) if m == model_id and f == fingerprint}


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


def chunks_table(rows: list[dict], vectors: np.ndarray, model_id: str, fingerprint: str | None = None) -> pa.Table:
    dim = vectors.shape[1]
    cols = {f: [r[f] for r in rows] for f in CHUNK_FIELDS}
    table = pa.table(
        {
            **cols,
            "ordinal": pa.array(cols["ordinal"], pa.int32()),
            "model_id": [model_id] * len(rows),
            "model_fingerprint": pa.array([fingerprint] * len(rows), pa.string()),
        }
    )
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1), pa.float32())
    return table.append_column("embedding", pa.FixedSizeListArray.from_arrays(flat, dim))


def embedding_matrix(table: pa.Table) -> np.ndarray:
    col = table["embedding"].combine_chunks()
    dim = col.type.list_size
    return col.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim).astype(np.float32, copy=False)
