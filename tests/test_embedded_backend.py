import numpy as np
import pyarrow.parquet as pq
import pytest

from sourcegate.pipelines.search.base import ScoreDistribution, retain
from sourcegate.pipelines.search.embedded import EmbeddedStore, top_k
from tests.conftest import chunks_with_vectors


def synthetic_chunks(path, n=50, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    words = ["bus", "train", "fare", "pass", "bike", "night", "airport", "refund"]
    rows = []
    for i in range(n):
        text = " ".join(rng.choice(words, size=6))
        rows.append(
            {
                "chunk_id": f"c{i:03d}",
                "doc_id": f"d{i // 3}",
                "title": "T",
                "section": "S",
                "section_id": "s",
                "body": text,
                "text": text,
                "text_hash": str(i),
                "ordinal": 0,
            }
        )
    pq.write_table(chunks_with_vectors(rows, vectors, "m"), path)
    return rows, vectors


def test_knn_is_exact_cosine_and_best_cosine_is_corpus_wide(tmp_path):
    rows, vectors = synthetic_chunks(tmp_path / "c.parquet")
    store = EmbeddedStore(tmp_path / "runs", tmp_path / "LIVE")
    assert store.load("v1", str(tmp_path / "c.parquet")) == 50
    s = store.open("v1")
    q = vectors[7] + 0.1 * vectors[3]
    q /= np.linalg.norm(q)
    exact = vectors @ q
    hits = s.knn(q, 5)
    assert [h.chunk_id for h in hits] == [rows[i]["chunk_id"] for i in np.argsort(-exact)[:5]]
    assert hits[0].score == pytest.approx(exact.max(), abs=1e-6)
    assert s.best_cosine(q) == pytest.approx(exact.max(), abs=1e-6)
    assert [c["chunk_id"] for c in s.chunks(["c010", "c002"])] == ["c010", "c002"]


def test_bm25_distribution_covers_the_whole_corpus(tmp_path):
    synthetic_chunks(tmp_path / "c.parquet")
    store = EmbeddedStore(tmp_path / "runs", tmp_path / "LIVE")
    store.load("v1", str(tmp_path / "c.parquet"))
    s = store.open("v1")
    dist = s.bm25_distribution("airport refund")
    assert dist.total == 50 and dist.matched == len(dist.scores) > 0
    hits = s.bm25("airport refund", 50)
    assert len(hits) == dist.matched and hits[0].score == pytest.approx(dist.scores.max())


def test_zscore_counts_non_matching_chunks_as_zero():
    dist = ScoreDistribution(scores=np.array([3.0, 1.0]), matched=2, total=4)
    all_scores = np.array([3.0, 1.0, 0.0, 0.0])
    assert dist.zscore(3.0) == pytest.approx((3.0 - all_scores.mean()) / all_scores.std())


def test_zscore_uses_exact_moments_over_a_truncated_list():
    """OpenSearch's batched query sends only the top list plus the exact sum and sum of squares."""
    all_scores = np.array([3.0, 2.0, 1.5, 0.5, 0.0, 0.0])
    exact = ScoreDistribution(scores=all_scores[:4], matched=4, total=6)
    top_only = ScoreDistribution(scores=all_scores[:2], matched=4, total=6)  # the rest imputed at 2.0
    moments = ScoreDistribution(scores=all_scores[:2], matched=4, total=6, moments=(7.0, 9.0 + 4.0 + 2.25 + 0.25))
    assert moments.zscore(3.0) == pytest.approx(exact.zscore(3.0))
    assert top_only.zscore(3.0) != pytest.approx(exact.zscore(3.0))


def test_versions_promote_retention_and_live_is_never_dropped(tmp_path):
    synthetic_chunks(tmp_path / "c.parquet")
    store = EmbeddedStore(tmp_path / "runs", tmp_path / "LIVE")
    assert store.live() is None
    for v in ["v1", "v2", "v3", "v4"]:
        store.load(v, str(tmp_path / "c.parquet"))
    store.promote("v1")
    assert store.live() == "v1"
    with pytest.raises(ValueError):
        store.drop("v1")
    assert retain(store, 2) == ["v2"]  # the live v1 survives although it is the oldest
    assert store.versions() == ["v1", "v3", "v4"]
    store.promote("v4")
    assert retain(store, 2) == ["v1"] and store.versions() == ["v3", "v4"]
    with pytest.raises(FileNotFoundError):
        store.promote("v9")


def test_top_k_breaks_ties_by_position():
    assert list(top_k(np.array([1.0, 3.0, 3.0, 2.0]), 3)) == [1, 2, 3]
    assert list(top_k(np.array([1.0]), 5)) == [0]


def test_top_k_keeps_the_first_of_the_scores_tied_at_the_kth_place_whatever_the_cpu():
    """BM25 ties are common (Lucene's one-byte lengths): argpartition alone chose among those tied at the k-th
    place by its SIMD path, so two workers kept different chunks and fused them in different orders."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        scores = rng.integers(0, 5, 300).astype(np.float32)  # 5 distinct scores: ties everywhere
        k = int(rng.integers(1, 300))
        by_rule = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]  # best first, then position
        assert list(top_k(scores, k)) == by_rule


def test_alternating_queries_reuse_no_stale_scores(tmp_path):
    # A query's score arrays are kept for its own distribution / best cosine; a different
    # query in between must never see them.
    rows, vectors = synthetic_chunks(tmp_path / "c.parquet")
    store = EmbeddedStore(tmp_path / "runs", tmp_path / "LIVE")
    store.load("v1", str(tmp_path / "c.parquet"))
    s, fresh = store.open("v1"), store.open("v1")
    for query, vector in [("airport refund", vectors[1]), ("night bus", vectors[2]), ("airport refund", vectors[1])]:
        assert s.bm25(query, 5) == store.open("v1").bm25(query, 5)
        assert s.bm25_distribution(query).matched == int((fresh.bm25_index.scores(query) > 0).sum())
        assert s.best_cosine(vector) == pytest.approx(float((vectors @ vector).max()), abs=1e-6)
        assert [h.chunk_id for h in s.knn(vector, 1)] == [rows[int(np.argmax(vectors @ vector))]["chunk_id"]]
    assert s.chunks([]) == []
    assert s.column("doc_id") == [r["doc_id"] for r in rows]
