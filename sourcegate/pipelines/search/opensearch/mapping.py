"""An index version's settings and fields, its `_meta` key, and the checksum of the chunk ids it holds."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

from sourcegate.pipelines.config import OpenSearch
from sourcegate.pipelines.search.analyzer import opensearch_analysis
from sourcegate.pipelines.search.bm25 import K1 as BM25_K1
from sourcegate.pipelines.search.bm25 import B as BM25_B

DEFAULT_PREFIX = OpenSearch().index_prefix  # the config's default (sourcegate/pipelines/config.py)
REQUIRED_COLUMNS = ("chunk_id", "doc_id", "title", "section", "text", "embedding")
# Optional parquet columns indexed when present (for inspection; not searched).
OPTIONAL_COLUMNS = {"section_id": "keyword", "text_hash": "keyword", "ordinal": "long", "model_id": "keyword"}
HNSW = {
    "name": "hnsw",
    "engine": "lucene",
    "space_type": "cosinesimil",
    "parameters": {"ef_construction": 128, "m": 16},
}

PREFIX_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
FORBIDDEN_IN_INDEX = re.compile(r"[^a-z0-9._-]")
META_KEY = "sourcegate"


def index_body(dimension: int, *, shards: int = 1, meta: dict | None = None) -> dict:
    """Settings + mappings of one index version (``dimension`` = embedding length)."""
    if int(dimension) < 1:
        raise ValueError(f"embedding dimension must be positive, got {dimension}")
    properties: dict[str, Any] = {
        "chunk_id": {"type": "keyword"},
        "doc_id": {"type": "keyword"},
        "title": {"type": "text", "analyzer": "standard"},
        "section": {"type": "text", "analyzer": "standard"},
        "text": {"type": "text", "analyzer": "sourcegate_en", "similarity": "okapi"},
        **{name: {"type": kind} for name, kind in OPTIONAL_COLUMNS.items()},
        "embedding": {"type": "knn_vector", "dimension": int(dimension), "method": _copy(HNSW)},
    }
    mappings: dict[str, Any] = {"dynamic": "strict", "properties": properties}
    if meta is not None:
        mappings["_meta"] = {META_KEY: meta}
    return {
        "settings": {
            "index": {
                "knn": True,
                "number_of_shards": shards,
                "number_of_replicas": 0,
                "refresh_interval": "-1",
                # the embedded backend's BM25 parameters and analyser (sourcegate/pipelines/search/bm25.py, analyzer.py)
                "similarity": {"okapi": {"type": "BM25", "k1": BM25_K1, "b": BM25_B}},
                "analysis": opensearch_analysis(),
            }
        },
        "mappings": mappings,
    }


def ids_checksum(ids: Iterable[str]) -> str:
    """SHA-256 of the sorted chunk ids: what an index holds, independent of load order."""
    digest = hashlib.sha256()
    for chunk_id in sorted(ids):
        digest.update(chunk_id.encode("utf-8") + b"\n")
    return digest.hexdigest()


def indexed_columns(names: Iterable[str]) -> list[str]:
    """The Parquet columns a version indexes, in load order (the embedding last)."""
    present = set(names)
    return (
        [c for c in REQUIRED_COLUMNS if c != "embedding"]
        + [c for c in OPTIONAL_COLUMNS if c in present]
        + ["embedding"]
    )


def own_meta(meta: dict, index: str) -> dict:
    """An index's own ``_meta``: a clone carries its source's (manifest of another index) until its load
    writes its own, and is then an incomplete version, never the source's copy."""
    source = (meta.get("manifest") or {}).get("index")
    if source not in (None, index):
        return {"status": f"clone of {source} interrupted before its own _meta"}
    return meta


def _copy(d: dict) -> dict:
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in d.items()}
