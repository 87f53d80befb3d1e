"""The read side of one OpenSearch index (or of the alias, which follows promotions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sourcegate.pipelines.config import OpenSearch
from sourcegate.pipelines.search.base import STORED_FIELDS, Hit, HybridResult, ScoreDistribution
from sourcegate.pipelines.search.opensearch.backoff import REJECTED, retry_rejected

SEARCH_BACKOFF_S = 0.5  # a 429'd search waits 0.5, 1, 2, 4 s (backend.opensearch.search_retries: 4)
SEARCH_BACKOFF_CAP_S = 8.0
DEFAULT_SECTION = (
    OpenSearch()
)  # the config's `backend.opensearch` defaults (sourcegate/pipelines/config.py), the one source
EF_SEARCH = 100  # HNSW candidates per kNN query (raised to k when k is larger)


class OpenSearchSearcher:
    """Read side of one index (or of the alias, which follows promotions)."""

    def __init__(
        self,
        client,
        index: str,
        section: OpenSearch = DEFAULT_SECTION,
        *,
        manifest: Mapping | None = None,
        ef_search: int | None = EF_SEARCH,
    ):
        self.client = client
        self.max_retries = section.search_retries
        self.index = index
        self.manifest = manifest
        self.distribution_size = section.distribution_size
        self.ef_search = ef_search

    def _request(self, call, what: str):
        """One request to the node, retried with bounded backoff while it answers 429 (overloaded)."""
        return retry_rejected(
            call,
            f"{what} {self.index}",
            max_retries=self.max_retries,
            initial=SEARCH_BACKOFF_S,
            cap=SEARCH_BACKOFF_CAP_S,
        )

    def _search(self, body: dict) -> dict:
        return self._request(lambda: self.client.search(index=self.index, body=body), "search")

    def _msearch(self, searches: list[dict], filter_path: list[str]) -> list[dict]:
        """The responses of one ``_msearch``; a sub-search the node rejected (429) retries the whole request."""
        body = [line for s in searches for line in ({"index": self.index}, s)]
        return self._request(
            lambda: self._responses(self.client.msearch(body=body, filter_path=filter_path)), "msearch"
        )

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
        total = int(self._request(lambda: self.client.count(index=self.index), "count")["count"])
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
        responses = self._msearch(searches, ["responses.hits.total.value", "responses.error", "responses.status"])
        return [int(r["hits"]["total"]["value"]) for r in responses]

    def _responses(self, resp: dict) -> list[dict]:
        from opensearchpy import TransportError

        responses = resp["responses"]
        for r in responses:
            if "error" not in r:
                continue
            if r.get("status") == REJECTED:  # the node's own 429, as a client error: retried, then exit 2
                raise TransportError(REJECTED, (r["error"] or {}).get("type", "rejected"), r)
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
        responses = self._msearch(
            searches,
            [
                "responses.hits.hits._id",
                "responses.hits.hits._score",
                "responses.hits.hits._source",
                "responses.hits.total.value",
                "responses.aggregations.bm25.count",
                "responses.aggregations.bm25.sum",
                "responses.aggregations.bm25.sum_of_squares",
                "responses.aggregations.bm25.max",
                "responses.error",
                "responses.status",
            ],
        )
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
        resp = self._request(
            lambda: self.client.mget(
                index=self.index, body={"ids": sorted(set(ids))}, _source_includes=list(STORED_FIELDS)
            ),
            "mget",
        )
        found = {d["_id"]: d["_source"] for d in resp["docs"] if d.get("found")}
        missing = [c for c in ids if c not in found]
        if missing:
            raise KeyError(f"{len(missing)} chunk id(s) not in {self.index}: {missing[:5]}")
        return [{f: found[c].get(f) for f in STORED_FIELDS} | {"chunk_id": c} for c in ids]
