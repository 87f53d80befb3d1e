"""The OpenSearch backend: one index per version behind an alias.

- index ``<prefix>-<version>`` (the version lower-cased, characters OpenSearch forbids in index
  names replaced by ``-``; the exact version string is kept in the mapping's ``_meta``), alias
  ``<prefix>`` pointing at the live one;
- ``chunk_id``/``doc_id`` keywords; ``title``, ``section`` and ``text`` analysed text fields.
  BM25 queries search ``text``, which (like the embedded backend's BM25) already holds title +
  section + body, analysed by ``sourcegate_en`` (the embedded backend's analyser, pipelines/search/analyzer.py)
  and scored with its k1/b, so the two backends rank alike; ``embedding`` a ``knn_vector`` (HNSW, engine ``lucene``,
  ``cosinesimil``). The lucene engine is the only one that runs without the k-NN plugin's
  native libraries (and faiss is the 2.19 default), so every mapping names it.

A version is promotable only after ``load`` has checked ``_count`` against the Parquet row
count and marked the index complete in ``_meta``: a half-built index is never served. The
complete mark carries the version's manifest (``pipelines.manifest``: rows, dimension, model
fingerprint, the inputs it was built from, a SHA-256 of its sorted chunk ids), so a complete
version is reused or refused, never rebuilt, and opening it checks ``_count`` against it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines import manifest as mf
from pipelines import verdict
from pipelines.batches import open_parquet
from pipelines.search import delta as delta_mod
from pipelines.search.analyzer import opensearch_analysis
from pipelines.search.base import (
    STORED_FIELDS,
    Hit,
    HybridResult,
    ScoreDistribution,
    oldest_first,
    refuse_dropping_live,
    refuse_rebuilding_live,
)
from pipelines.search.bm25 import K1 as BM25_K1
from pipelines.search.bm25 import B as BM25_B
from pipelines.search.delta import Delta

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "sourcegate"
REQUIRED_COLUMNS = ("chunk_id", "doc_id", "title", "section", "text", "embedding")
# Optional parquet columns indexed when present (for inspection; not searched).
OPTIONAL_COLUMNS = {"section_id": "keyword", "text_hash": "keyword", "ordinal": "long", "model_id": "keyword"}
HNSW = {
    "name": "hnsw",
    "engine": "lucene",
    "space_type": "cosinesimil",
    "parameters": {"ef_construction": 128, "m": 16},
}

_PREFIX_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_FORBIDDEN_IN_INDEX = re.compile(r"[^a-z0-9._-]")
_META_KEY = "sourcegate"
_FILTER_BATCH = 8192  # Parquet rows read per batch when only a night's delta is indexed


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
        mappings["_meta"] = {_META_KEY: meta}
    return {
        "settings": {
            "index": {
                "knn": True,
                "number_of_shards": shards,
                "number_of_replicas": 0,
                "refresh_interval": "-1",
                # the embedded backend's BM25 parameters and analyser (pipelines/search/bm25.py, analyzer.py)
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


def _own_meta(meta: dict, index: str) -> dict:
    """An index's own ``_meta``: a clone carries its source's (manifest of another index) until its load
    writes its own, and is then an incomplete version, never the source's copy."""
    source = (meta.get("manifest") or {}).get("index")
    if source not in (None, index):
        return {"status": f"clone of {source} interrupted before its own _meta"}
    return meta


def _copy(d: dict) -> dict:
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in d.items()}


def _retryable(status: Any) -> bool:
    return isinstance(status, int) and (status == 429 or 500 <= status < 600)


def _embedding_dimension(pf: pq.ParquetFile) -> int:
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


class OpenSearchSearcher:
    """Read side of one index (or of the alias, which follows promotions)."""

    def __init__(
        self,
        client,
        index: str,
        *,
        distribution_size: int = 1000,
        ef_search: int | None = 100,
        manifest: Mapping | None = None,
    ):
        self.client = client
        self.index = index
        self.manifest = manifest
        self.distribution_size = distribution_size
        self.ef_search = ef_search

    def _search(self, body: dict) -> dict:
        return self.client.search(index=self.index, body=body)

    @staticmethod
    def _match(query: str) -> dict:
        return {"match": {"text": {"query": query}}}

    def _knn_query(self, vector: np.ndarray, k: int) -> dict:
        knn: dict[str, Any] = {"vector": np.asarray(vector, dtype=np.float32).ravel().tolist(), "k": k}
        if self.ef_search and self.ef_search > k:
            knn["method_parameters"] = {"ef_search": self.ef_search}
        return {"knn": {"embedding": knn}}

    def bm25(self, query: str, k: int) -> list[Hit]:
        if k <= 0:
            return []
        resp = self._search({"size": k, "_source": False, "query": self._match(query)})
        return [Hit(h["_id"], float(h["_score"])) for h in resp["hits"]["hits"]]

    def knn(self, vector: np.ndarray, k: int) -> list[Hit]:
        if k <= 0:
            return []
        resp = self._search({"size": k, "_source": False, "query": self._knn_query(vector, k)})
        # Lucene's cosine score is (1 + cos) / 2; give back the cosine itself.
        return [Hit(h["_id"], 2.0 * float(h["_score"]) - 1.0) for h in resp["hits"]["hits"]]

    def best_cosine(self, vector: np.ndarray) -> float:
        hits = self.knn(vector, 1)
        return hits[0].score if hits else 0.0

    def bm25_distribution(self, query: str) -> ScoreDistribution:
        resp = self._search(
            {"size": self.distribution_size, "_source": False, "track_total_hits": True, "query": self._match(query)}
        )
        scores = np.array([h["_score"] for h in resp["hits"]["hits"]], dtype=np.float64)
        matched = int(resp["hits"]["total"]["value"])
        total = int(self.client.count(index=self.index)["count"])
        return ScoreDistribution(scores=scores, matched=matched, total=total)

    @staticmethod
    def _count(word: str) -> dict:
        """A search counting the chunks that hold every BM25 term of `word` (analysed by the node like a
        BM25 query; no term, no hit). ``size: 0`` with exact totals: no scoring, no fetch."""
        return {"size": 0, "track_total_hits": True, "query": {"match": {"text": {"query": word, "operator": "and"}}}}

    def document_frequencies(self, words: Sequence[str]) -> tuple[int, dict[str, int]]:
        """The index size and each word's count, in one ``_msearch`` (see `hybrid`, which folds them in)."""
        words = list(words)
        searches = [{"size": 0, "track_total_hits": True}] + [self._count(w) for w in words]
        totals = self._totals(searches)
        return totals[0], dict(zip(words, totals[1:]))

    def _totals(self, searches: list[dict]) -> list[int]:
        resp = self.client.msearch(
            body=[line for s in searches for line in ({"index": self.index}, s)],
            filter_path=["responses.hits.total.value", "responses.error"],
        )
        return [int(r["hits"]["total"]["value"]) for r in self._responses(resp)]

    def _responses(self, resp: dict) -> list[dict]:
        responses = resp["responses"]
        for r in responses:
            if "error" in r:
                raise RuntimeError(f"OpenSearch search of {self.index} failed: {r['error']}")
        return responses

    def hybrid(
        self, query: str, vector: np.ndarray, bm25_k: int, knn_k: int, terms: Sequence[str] = ()
    ) -> HybridResult:
        """A whole hybrid query in one ``_msearch`` round trip (the searches the node runs together):

        1. BM25 top-``bm25_k`` with the stored fields, ``track_total_hits`` for the matched count, and an
           ``extended_stats`` aggregation over ``_score``: the exact sum and sum of squares over every
           matching chunk, so the z-score needs no truncated score list (benchmark 6 measures the error
           a top-``distribution_size`` list would make);
        2. kNN top-``max(knn_k, 1)`` with the stored fields; its first hit is ``best_cosine`` (HNSW's
           top-1, as ``best_cosine`` gives);
        3. ``size: 0`` with ``track_total_hits``: the index size (on the alias, the version serving now);
        4. one ``size: 0`` count per word of ``terms`` (`_count`): its document frequency over the whole
           index, for the answerability signal's rarity weights. Folded in rather than sent as a second
           ``_msearch``: no extra round trip, and the counts read the very index version the lists do
           (the alias may move between two requests). A count of live documents, unlike Lucene's term
           statistics, which keep a delta night's deleted chunks until a merge.

        ``filter_path`` keeps ids, scores, sources, totals, the aggregation and errors, nothing else.
        """
        source = list(STORED_FIELDS)
        header = {"index": self.index}
        knn = self._knn_query(vector, max(knn_k, 1))
        searches = [
            {
                "size": max(bm25_k, 0),
                "_source": source,
                "track_total_hits": True,
                "query": self._match(query),
                "aggs": {"bm25": {"extended_stats": {"script": {"source": "_score", "lang": "painless"}}}},
            },
            {"size": max(knn_k, 1), "_source": source, "query": knn},
            {"size": 0, "track_total_hits": True},
            *(self._count(w) for w in terms),
        ]
        resp = self.client.msearch(
            body=[line for s in searches for line in (header, s)],
            filter_path=[
                "responses.hits.hits._id",
                "responses.hits.hits._score",
                "responses.hits.hits._source",
                "responses.hits.total.value",
                "responses.aggregations.bm25.count",
                "responses.aggregations.bm25.sum",
                "responses.aggregations.bm25.sum_of_squares",
                "responses.aggregations.bm25.max",
                "responses.error",
            ],
        )
        responses = self._responses(resp)
        bm25_hits, knn_hits = (r.get("hits", {}).get("hits", []) for r in responses[:2])
        stored = {h["_id"]: {f: h["_source"].get(f) for f in STORED_FIELDS} | {"chunk_id": h["_id"]} for h in bm25_hits}
        stored.update(
            {h["_id"]: {f: h["_source"].get(f) for f in STORED_FIELDS} | {"chunk_id": h["_id"]} for h in knn_hits}
        )
        bm25 = [Hit(h["_id"], float(h["_score"])) for h in bm25_hits]
        knn_all = [Hit(h["_id"], 2.0 * float(h["_score"]) - 1.0) for h in knn_hits]  # Lucene: (1 + cos) / 2
        stats = responses[0].get("aggregations", {}).get("bm25", {})
        matched = int(responses[0]["hits"]["total"]["value"])
        top = [h.score for h in bm25] or ([float(stats["max"])] if matched else [])
        distribution = ScoreDistribution(
            scores=np.array(top, dtype=np.float64),
            matched=matched,
            total=int(responses[2]["hits"]["total"]["value"]),
            moments=(float(stats.get("sum") or 0.0), float(stats.get("sum_of_squares") or 0.0)),
        )
        return HybridResult(
            bm25=bm25,
            knn=knn_all[: max(knn_k, 0)],
            stored=stored,
            distribution=distribution,
            best_cosine=knn_all[0].score if knn_all else 0.0,
            document_frequencies={w: int(r["hits"]["total"]["value"]) for w, r in zip(terms, responses[3:])},
        )

    def chunks(self, chunk_ids: Sequence[str]) -> list[dict]:
        ids = list(chunk_ids)
        if not ids:
            return []
        resp = self.client.mget(index=self.index, body={"ids": sorted(set(ids))}, _source_includes=list(STORED_FIELDS))
        found = {d["_id"]: d["_source"] for d in resp["docs"] if d.get("found")}
        missing = [c for c in ids if c not in found]
        if missing:
            raise KeyError(f"{len(missing)} chunk id(s) not in {self.index}: {missing[:5]}")
        return [{f: found[c].get(f) for f in STORED_FIELDS} | {"chunk_id": c} for c in ids]


class OpenSearchStore:
    """Write side: versions ``<prefix>-<version>`` behind the alias ``<prefix>``."""

    def __init__(
        self,
        client=None,
        prefix: str = DEFAULT_PREFIX,
        *,
        chunk_size: int = 500,
        max_retries: int = 5,
        initial_backoff: float = 2.0,
        max_backoff: float = 60.0,
        shards: int = 1,
        replicas: int = 0,
        progress: bool = True,
        distribution_size: int = 1000,
        ef_search: int | None = 100,
    ):
        if not _PREFIX_RE.match(prefix):
            raise ValueError(f"index prefix must be lower-case [a-z0-9._-] and start alphanumeric, got {prefix!r}")
        if client is None:
            from pipelines.search.opensearch_client import client_from_env

            client = client_from_env()
        self.client = client
        self.prefix = prefix
        self.alias = prefix
        self.chunk_size = chunk_size
        self.max_retries = max_retries
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.shards = shards
        self.replicas = replicas
        self.progress = progress
        self.distribution_size = distribution_size
        self.ef_search = ef_search

    @classmethod
    def from_config(cls, cfg: dict, client=None, **kwargs: Any) -> OpenSearchStore:
        """A store from the pipeline config's ``backend.opensearch`` section.

        ``client`` defaults to the section's Airflow connection if it names one (the DAGs'), else
        to the ``OPENSEARCH_*`` environment (``opensearch_client.client_for``).
        """
        section = cfg["backend"]["opensearch"]
        if client is None:
            from pipelines.search.opensearch_client import client_for

            client = client_for(section)
        options = {
            "prefix": section.get("index_prefix", DEFAULT_PREFIX),
            "chunk_size": section.get("bulk_chunk_size", 500),
            "max_retries": section.get("max_retries", 5),
            "distribution_size": section.get("distribution_size", 1000),
        }
        options.update(kwargs)
        return cls(client, **options)

    # --- names --------------------------------------------------------------------------------

    def index_name(self, version: str) -> str:
        if not version or not version.strip():
            raise ValueError("empty index version")
        name = _FORBIDDEN_IN_INDEX.sub("-", version.lower())
        if name == verdict.PROMOTIONS_INDEX:
            raise ValueError(f"{version!r} is reserved for the promotions log")
        return f"{self.prefix}-{name}"

    @property
    def promotions_index(self) -> str:
        return f"{self.prefix}-{verdict.PROMOTIONS_INDEX}"

    def log_promotion(self, record: Mapping) -> None:
        """One document per promotion in ``<prefix>-_promotions`` (append only: new ids, never updates)."""
        if not self.client.indices.exists(index=self.promotions_index):
            keyword = {"type": "keyword"}
            fields = {k: keyword for k in ("version", "previous", "verdict_sha256", "manifest_sha256", "actor")}
            body = {"mappings": {"properties": {"time": {"type": "date"}, **fields}}}
            self.client.indices.create(index=self.promotions_index, body=body, ignore=400)  # a racing creator
        self.client.index(index=self.promotions_index, body=dict(record), refresh="wait_for")

    def promotions(self) -> list[dict]:
        """Every promotion and rollback, oldest first."""
        from opensearchpy import NotFoundError

        try:
            resp = self.client.search(
                index=self.promotions_index, body={"size": 10000, "query": {"match_all": {}}, "sort": [{"time": "asc"}]}
            )
        except NotFoundError:
            return []
        return [h["_source"] for h in resp["hits"]["hits"]]

    def _meta(self, index: str) -> dict | None:
        """The sourcegate ``_meta`` of one index, or None when the index does not exist."""
        from opensearchpy import NotFoundError

        try:
            resp = self.client.indices.get_mapping(index=index)
        except NotFoundError:
            return None
        mapping = resp.get(index, {}).get("mappings", {})
        return _own_meta((mapping.get("_meta") or {}).get(_META_KEY) or {}, index)

    def _set_meta(self, index: str, meta: dict) -> None:
        self.client.indices.put_mapping(index=index, body={"_meta": {_META_KEY: meta}})

    # --- IndexStore ---------------------------------------------------------------------------

    def manifest(self, version: str) -> dict | None:
        """The version's manifest, or None when it does not exist or is not complete."""
        meta = self._meta(self.index_name(version)) or {}
        return meta.get("manifest") if meta.get("status") == "complete" else None

    def load(
        self,
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

        index = self.index_name(version)
        pf = open_parquet(chunks_parquet)
        names = set(pf.schema_arrow.names)
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise ValueError(f"{chunks_parquet}: missing column(s) {missing}")
        columns = indexed_columns(names)
        rows = pf.metadata.num_rows
        dim = _embedding_dimension(pf)
        body_sha256 = mf.sha256_json(index_body(dim, shards=self.shards))

        try:
            refuse_rebuilding_live(self, version)
            reused = self._reuse_or_clear(index, version, inputs)
            if reused is not None:
                return reused
            meta = {
                "prefix": self.prefix,
                "version": version,
                "status": "loading",
                "source": str(chunks_parquet),
                "rows": rows,
                "dimension": dim,
            }
            night = _Night(chunks_parquet, rows, dim, columns, inputs or {}, body_sha256)
            delta = self._plan(night, base_chunks)
            log.info("%s: %s load (%s)", index, night.build["mode"], night.build["reason"])
            if delta is None:
                count = self._load_full(version, index, meta, pf, night)
            else:
                count = self._load_delta(version, index, meta, pf, night, delta)
        except OSConnectionError as e:
            raise RuntimeError(
                f"lost the connection to OpenSearch while loading {index} from {chunks_parquet}: {e}. "
                f"The index is incomplete and will not be promoted; rerun the load."
            ) from e
        log.info("loaded %s: %d chunks", index, count)
        return count

    def _reuse_or_clear(self, index: str, version: str, inputs: Mapping | None) -> int | None:
        """The row count of a complete `index` built from `inputs` (reused); else clear what is there."""
        existing = self._meta(index)
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
        self.client.indices.delete(index=index)
        return None

    def _plan(self, night: _Night, base_chunks: str | Path | None) -> Delta | None:
        """The delta from the live version, or None for a full load; `night.build` says why."""
        live = self.live()
        if live is None:
            return night.full("no previous version")
        if base_chunks is None:
            return night.full("full load requested")
        try:
            live_manifest = self.verify(live, hashes=False)
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

    def _load_full(self, version: str, index: str, meta: dict, pf: pq.ParquetFile, night: _Night) -> int:
        self.client.indices.create(index=index, body=index_body(night.dim, shards=self.shards, meta=meta))
        log.info("loading %d chunks (dim %d) from %s into %s", night.rows, night.dim, night.chunks_parquet, index)
        try:
            with night.step("bulk"):
                self._bulk_load(index, pf, night.columns, night.dim, night.rows)
            return self._complete(version, index, meta, night, check_ids=False)
        except Exception as exc:
            from opensearchpy import ConnectionError as OSConnectionError

            if not isinstance(exc, OSConnectionError):  # best effort; "loading" is not promotable either
                with contextlib.suppress(Exception):
                    self._set_meta(index, {**meta, "status": "failed"})
            raise

    def _load_delta(self, version: str, index: str, meta: dict, pf: pq.ParquetFile, night: _Night, delta: Delta) -> int:
        """Clone the live index to `index`, apply `delta`, verify it against the Parquet.

        Any failure deletes the clone (best effort: without a connection it stays "loading", never
        promotable, and the next load of this version deletes it); the alias never moved.
        """
        live_index = self.index_name(night.build["from"])
        # `_clone` needs a write block on its source. The live index is immutable once promoted (no
        # step writes to a version after its load; promotion and rollback only move the alias), so
        # the block is harmless: it keeps serving reads, and it stays set.
        with night.step("write_block"):
            self.client.indices.put_settings(index=live_index, body={"index": {"blocks": {"write": True}}})
        try:
            with night.step("clone"):
                settings = {"index.number_of_replicas": 0, "index.refresh_interval": "-1"}
                self.client.indices.clone(index=live_index, target=index, body={"settings": settings})
                # the clone carries the live index's _meta (see `_own_meta`) and write block until here
                self._set_meta(index, {**meta, "built_from": night.build["from"]})
                self.client.indices.put_settings(index=index, body={"index": {"blocks": {"write": None}}})
            with night.step("delete"):
                for start in range(0, len(delta.removed), self.chunk_size):
                    ids = delta.removed[start : start + self.chunk_size]
                    self._send([{"_op_type": "delete", "_index": index, "_id": c} for c in ids])
            with night.step("bulk"):
                # an `index` action on an id the clone holds replaces that document: changed chunks
                # need no delete of their own
                only = pa.array(delta.upserts, pa.string())
                self._bulk_load(index, pf, night.columns, night.dim, len(delta.upserts), only=only)
            return self._complete(version, index, meta, night, check_ids=True)
        except Exception:
            with contextlib.suppress(Exception):
                self.client.indices.delete(index=index)
            raise

    def _complete(self, version: str, index: str, meta: dict, night: _Night, *, check_ids: bool) -> int:
        """Refresh, check `_count` (and with `check_ids` the ids the index holds) against the Parquet,
        then write the manifest with the complete mark, in one request: the completion mark."""
        with night.step("refresh"):
            self.client.indices.put_settings(
                index=index, body={"index": {"refresh_interval": "1s", "number_of_replicas": self.replicas}}
            )
            self.client.indices.refresh(index=index)
        with night.step("verify"):
            count = int(self.client.count(index=index)["count"])
            if count != night.rows:
                raise RuntimeError(
                    f"index {index}: _count is {count} after the {night.build['mode']} load, but "
                    f"{night.chunks_parquet} has {night.rows} rows (duplicate chunk_id?); not promotable"
                )
            ids = pq.read_table(night.chunks_parquet, columns=["chunk_id"])["chunk_id"].to_pylist()
            ids_sha256 = ids_checksum(ids)
            if check_ids and self._ids_checksum(index) != ids_sha256:
                raise RuntimeError(
                    f"index {index}: after the {night.build['mode']} load its chunk ids differ from "
                    f"{night.chunks_parquet}'s (same count {count}); not promotable"
                )
        manifest = mf.build_manifest(
            version,
            rows=count,
            dimension=night.dim,
            inputs=night.inputs or None,
            backend="opensearch",
            index=index,
            ids_sha256=ids_sha256,
            index_body_sha256=night.body_sha256,
            build=night.build,
        )
        self._set_meta(index, {**meta, "status": "complete", "count": count, "manifest": manifest})
        return count

    def _actions(self, batch: pa.RecordBatch, columns: list[str], dim: int) -> list[dict]:
        vectors = _vectors(batch.column(batch.schema.get_field_index("embedding")), dim)
        fields = {c: batch.column(batch.schema.get_field_index(c)).to_pylist() for c in columns if c != "embedding"}
        actions = []
        for i in range(batch.num_rows):
            source = {c: fields[c][i] for c in fields}
            source["embedding"] = vectors[i].tolist()
            chunk_id = source["chunk_id"]
            if not chunk_id:
                raise ValueError("a chunk has an empty chunk_id")
            actions.append({"_index": None, "_id": chunk_id, "_source": source})
        return actions

    def _batches(
        self, pf: pq.ParquetFile, columns: list[str], dim: int, only: pa.Array | None = None
    ) -> Iterator[list[dict]]:
        """Bulk actions, `chunk_size` at a time; with `only`, for the rows whose chunk_id is in it."""
        pending: list[dict] = []
        for batch in pf.iter_batches(batch_size=self.chunk_size if only is None else _FILTER_BATCH, columns=columns):
            if only is not None:
                batch = batch.filter(pc.is_in(batch.column(batch.schema.get_field_index("chunk_id")), value_set=only))
            pending.extend(self._actions(batch, columns, dim))
            while len(pending) >= self.chunk_size:
                yield pending[: self.chunk_size]
                pending = pending[self.chunk_size :]
        if pending:
            yield pending

    def _bulk_load(
        self, index: str, pf: pq.ParquetFile, columns: list[str], dim: int, rows: int, only: pa.Array | None = None
    ) -> int:
        from tqdm import tqdm

        sent = 0
        with tqdm(total=rows, desc=f"load {index}", unit="chunk", disable=not self.progress, mininterval=2.0) as bar:
            for actions in self._batches(pf, columns, dim, only):
                for a in actions:
                    a["_index"] = index
                n = self._send(actions)
                sent += n
                bar.update(n)
        return sent

    def _send(self, actions: list[dict]) -> int:
        """One chunk through ``streaming_bulk``; 429/5xx (whole request or per item) retried with backoff."""
        from opensearchpy import ConnectionError as OSConnectionError
        from opensearchpy import TransportError
        from opensearchpy.helpers import streaming_bulk

        by_id = {a["_id"]: a for a in actions}
        pending = actions
        done = 0
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = min(self.max_backoff, self.initial_backoff * 2 ** (attempt - 1))
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

    def verify(self, version: str, hashes: bool = True) -> dict:
        """The manifest of a complete, intact version: ``_count`` (and with `hashes` the ids' SHA-256) match it.

        IntegrityError otherwise; FileNotFoundError when there is no such index.
        """
        index = self.index_name(version)
        meta = self._meta(index)
        if meta is None:
            raise FileNotFoundError(f"no index version {version} ({index})")
        manifest = meta.get("manifest")
        if meta.get("status") != "complete" or not manifest:
            raise mf.IntegrityError(
                f"index version {version} ({index}) is incomplete: its load is {meta.get('status', 'unknown')!r} "
                "and it has no manifest; it is never opened or promoted"
            )
        count = int(self.client.count(index=index)["count"])
        problems = (
            [] if count == manifest["rows"] else [f"{index}: _count is {count}, manifest says {manifest['rows']}"]
        )
        if hashes and not problems and self._ids_checksum(index) != manifest.get("ids_sha256"):
            problems.append(f"{index}: the chunk ids differ from the manifest's ids_sha256")
        if problems:
            raise mf.IntegrityError(f"index version {version} is corrupt: " + "; ".join(problems), problems)
        return manifest

    def _ids_checksum(self, index: str) -> str:
        """The ids' SHA-256 from a scroll over ``_id``, 10,000 a page (benchmarks/opensearch_night.py: 6-26%
        faster than 1,000). Reading ``chunk_id`` doc values is ~9x cheaper still, but checks the field,
        not the ``_id`` a search returns."""
        from opensearchpy.helpers import scan

        hits = scan(self.client, index=index, query={"_source": False, "query": {"match_all": {}}}, size=10_000)
        return ids_checksum(h["_id"] for h in hits)

    def promote(self, version: str) -> None:
        index = self.index_name(version)
        try:
            self.verify(version)
        except mf.IntegrityError as exc:
            raise mf.IntegrityError(f"refusing to promote {index}: {exc}") from exc
        current = self._alias_indices()
        actions: list[dict] = [{"remove": {"index": i, "alias": self.alias}} for i in current if i != index]
        actions.append({"add": {"index": index, "alias": self.alias}})
        # One request: OpenSearch applies all actions atomically.
        self.client.indices.update_aliases(body={"actions": actions})
        log.info("promoted %s (alias %s; was %s)", index, self.alias, current or "unset")

    def _alias_indices(self) -> list[str]:
        from opensearchpy import NotFoundError

        try:
            return sorted(self.client.indices.get_alias(name=self.alias).keys())
        except NotFoundError:
            return []

    def live(self) -> str | None:
        indices = self._alias_indices()
        if not indices:
            return None
        if len(indices) > 1:
            raise RuntimeError(f"alias {self.alias} points at several indices: {indices}")
        meta = self._meta(indices[0]) or {}
        return meta.get("version") or indices[0][len(self.prefix) + 1 :]

    def versions(self) -> list[str]:
        resp = self.client.indices.get_mapping(index=f"{self.prefix}-*")
        created = self.client.indices.get_settings(index=f"{self.prefix}-*", name="index.creation_date")
        found = []
        for name, body in resp.items():
            meta = _own_meta(((body.get("mappings") or {}).get("_meta") or {}).get(_META_KEY) or {}, name)
            if meta.get("prefix") == self.prefix and meta.get("version"):
                when = int(created.get(name, {}).get("settings", {}).get("index", {}).get("creation_date", 0))
                found.append((when, meta["version"]))
        return oldest_first(found)

    def drop(self, version: str) -> None:
        refuse_dropping_live(self, version)
        index = self.index_name(version)
        if self._meta(index) is None:
            log.warning("drop: no index %s", index)
            return
        self.client.indices.delete(index=index)
        log.info("dropped %s", index)

    def open(self, version: str | None = None) -> OpenSearchSearcher:
        """A searcher over ``version``, or over the alias (following later promotions) by default."""
        if version is None:
            live = self.live()
            if live is None:
                raise FileNotFoundError(f"no live index: alias {self.alias} is not set; promote a version first")
            manifest, index = self.verify(live, hashes=False), self.alias
        else:
            manifest, index = self.verify(version, hashes=False), self.index_name(version)
        return OpenSearchSearcher(
            self.client, index, distribution_size=self.distribution_size, ef_search=self.ef_search, manifest=manifest
        )
