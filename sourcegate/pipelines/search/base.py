"""The one search interface every backend implements (in the spirit of BEIR's search()).

Retrieval, evals and the gate only ever talk to a backend through this protocol, so
the embedded default and OpenSearch are interchangeable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from sourcegate.pipelines.versions.manifest import VersionConflict

# What a hit carries back to retrieval (SearchBackend.chunks, HybridResult.stored), on every backend.
STORED_FIELDS = ("chunk_id", "doc_id", "title", "section", "section_id", "text")


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    score: float


@dataclass(frozen=True)
class ScoreDistribution:
    """BM25 scores of one query over the corpus, for a z-score of the top score.

    `scores` holds the scores of matching chunks (all of them for the embedded backend,
    the top `size` for OpenSearch's `bm25_distribution`, the top-k list for its batched
    `hybrid`); `matched` counts every chunk with a score > 0 and `total` every chunk in the
    index. Non-matching chunks score 0. `moments`, when given, is the exact (sum, sum of
    squares) over every matching chunk (OpenSearch computes it server-side) and wins over
    `scores` for the z-score.
    """

    scores: np.ndarray
    matched: int
    total: int
    moments: tuple[float, float] | None = None

    def zscore(self, value: float) -> float:
        """z of `value` against the distribution over ALL chunks (zeros included)."""
        n = self.total
        if n == 0:
            return 0.0
        if self.moments is not None:
            total, total_sq = self.moments
        else:
            s = np.asarray(self.scores, dtype=np.float64)
            # Unseen matching chunks (truncated distribution) are imputed at the lowest seen score.
            missing = max(self.matched - len(s), 0)
            floor = float(s.min()) if len(s) else 0.0
            total = s.sum() + missing * floor
            total_sq = (s**2).sum() + missing * floor**2
        mean = total / n
        var = max(total_sq / n - mean**2, 0.0)
        return 0.0 if var == 0 else float((value - mean) / np.sqrt(var))


@dataclass(frozen=True)
class HybridResult:
    """Everything one hybrid query reads from a backend: both lists, the stored fields of their
    hits, and what the signals need (the BM25 distribution, the best cosine, the document
    frequencies of the words asked for, over the whole index of `distribution.total` chunks)."""

    bm25: list[Hit]
    knn: list[Hit]
    stored: dict[str, dict]  # chunk_id -> stored fields, for every hit of either list
    distribution: ScoreDistribution
    best_cosine: float
    document_frequencies: Mapping[str, int] = field(default_factory=dict)  # word -> chunks holding it


class SearchBackend(Protocol):
    """Read side of one index version.

    A backend may also offer `hybrid(query, vector, bm25_k, knn_k, terms=()) -> HybridResult`,
    answering a whole hybrid query at once (OpenSearch: one `_msearch`); `hybrid_search` uses it
    when present.
    """

    def bm25(self, query: str, k: int) -> list[Hit]:
        """Top-k chunks by BM25 over title + section + body, best first."""

    def knn(self, vector: np.ndarray, k: int) -> list[Hit]:
        """Top-k chunks by cosine similarity to a unit-norm query vector, best first."""

    def best_cosine(self, vector: np.ndarray) -> float:
        """Best cosine of the query against every chunk of the corpus."""

    def bm25_distribution(self, query: str) -> ScoreDistribution:
        """BM25 score distribution of the query over the whole corpus."""

    def chunks(self, chunk_ids: Sequence[str]) -> list[dict]:
        """Stored fields (chunk_id, doc_id, title, section, text) for the given ids, in order."""

    def document_frequencies(self, words: Sequence[str]) -> tuple[int, dict[str, int]]:
        """(chunks in the index, {word: chunks holding every BM25 term of the word}).

        Each word goes through the backend's BM25 query analysis; one whose analysis is empty
        or holds a term no chunk has counts 0. Over the whole index, whatever a query's lists.
        """


def hybrid_search(
    backend: SearchBackend, query: str, vector: np.ndarray, bm25_k: int, knn_k: int, terms: Sequence[str] = ()
) -> HybridResult:
    """A hybrid query (and the document frequencies of `terms`): the backend's batched `hybrid`
    when it has one, else the protocol's calls."""
    batched = getattr(backend, "hybrid", None)
    return (
        batched(query, vector, bm25_k, knn_k, terms)
        if batched is not None
        else hybrid_by_calls(backend, query, vector, bm25_k, knn_k, terms)
    )


def hybrid_by_calls(
    backend: SearchBackend, query: str, vector: np.ndarray, bm25_k: int, knn_k: int, terms: Sequence[str] = ()
) -> HybridResult:
    """A hybrid query as the protocol's single calls (one round trip each on a server)."""
    bm25, knn = backend.bm25(query, bm25_k), backend.knn(vector, knn_k)
    ids = list(dict.fromkeys(h.chunk_id for h in [*bm25, *knn]))
    return HybridResult(
        bm25=bm25,
        knn=knn,
        stored=dict(zip(ids, backend.chunks(ids))),
        distribution=backend.bm25_distribution(query),
        best_cosine=backend.best_cosine(vector),
        document_frequencies=backend.document_frequencies(terms)[1] if terms else {},
    )


class IndexStore(Protocol):
    """Write side: versions of an index behind a live pointer (an alias)."""

    def load(self, version: str, chunks_parquet: str) -> int:
        """Build index `version` from a chunks.parquet; returns the number of chunks indexed."""

    def promote(self, version: str) -> None:
        """Atomically point the live alias at `version`."""

    def live(self) -> str | None:
        """The version the alias points to, or None."""

    def versions(self) -> list[str]:
        """All index versions present, oldest first by creation time (never by name)."""

    def drop(self, version: str) -> None:
        """Delete one version (never the live one)."""

    def open(self, version: str | None = None) -> SearchBackend:
        """A searcher over `version` (default: the live one)."""


def oldest_first(created: Iterable[tuple[float, str]]) -> list[str]:
    """Versions from (creation time, version) pairs, oldest first; a tie goes by name.

    Never by name alone: a version's name is a free run id (`manual` sorts after any date), and
    retention and rollback read this order.
    """
    return [version for _, version in sorted(created)]


def refuse_dropping_live(store: IndexStore, version: str) -> None:
    """The live version is never dropped: a failed or pruned night leaves the last good index serving."""
    if version == store.live():
        raise ValueError(f"refusing to drop the live index version {version}")


def refuse_rebuilding_live(store: IndexStore, version: str) -> None:
    """The live version is never rebuilt (G1): tonight's load must not touch what is being served."""
    if version == store.live():
        raise VersionConflict(f"refusing to rebuild index version {version}: it is the live version")


def retain(store: IndexStore, keep: int) -> list[str]:
    """Delete all but the newest `keep` index versions, never the live one. Returns what was dropped.

    Index versions only: the nightly retention works on whole run folders (sourcegate.pipelines.release.runs.retain_runs).
    """
    live = store.live()
    versions = store.versions()
    doomed = [v for v in versions[: max(len(versions) - keep, 0)] if v != live]
    for v in doomed:
        store.drop(v)
    return doomed
