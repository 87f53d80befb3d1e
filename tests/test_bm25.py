import json
import math
import subprocess
import sys

import numpy as np
from rank_bm25 import BM25Okapi

from sourcegate.pipelines.search.analyzer import analyze
from sourcegate.pipelines.search.bm25 import K1, LEGACY_ANALYZER, B, BM25Index, lucene_length


class LuceneIdfOkapi(BM25Okapi):
    """rank-bm25's BM25Okapi with Lucene's idf, which never goes negative (no floor needed)."""

    def _calc_idf(self, nd):
        self.idf = {w: math.log(1 + (self.corpus_size - f + 0.5) / (f + 0.5)) for w, f in nd.items()}


def test_scores_equal_rank_bm25_with_lucene_idf_on_short_chunks():
    # Below 40 terms Lucene stores lengths exactly: then only the idf differs from Okapi's.
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(60)] + ["common"] * 20  # a very common word: idf stays positive
    corpus = [" ".join(rng.choice(words, size=rng.integers(3, 40))) for _ in range(200)]
    tokens = [analyze(t) for t in corpus]
    ours, ref = BM25Index.build(tokens), LuceneIdfOkapi(tokens, k1=K1, b=B)
    for query in ["w1 w2", "common w3", "w5 w5 w7", "unknownword", "common", "w59 w0 w1 w2 w3", "the"]:
        expected = ref.get_scores(analyze(query))
        np.testing.assert_allclose(ours.scores(query), expected, rtol=1e-12, atol=1e-12)
    assert (ours.scores("common") > 0).sum() == sum("common" in t for t in tokens)


def test_lucene_length_matches_smallfloat_byte4():
    n = np.arange(0, 5000)
    got = lucene_length(n)
    assert (got[:40] == n[:40]).all()  # 24 free values + 16 exact int4 values
    assert (got <= n).all() and (np.diff(got) >= 0).all()
    assert ((n - got)[1:] / n[1:] < 1 / 8).all()  # 4 significant bits
    assert (lucene_length(got) == got).all()  # decoded lengths are fixed points
    # hand-decoded from SmallFloat.intToByte4 / byte4ToInt (Lucene 9)
    assert lucene_length(np.array([40, 41, 42, 55, 56, 100, 1000])).tolist() == [40, 40, 42, 54, 56, 96, 984]


def test_hand_computed_score_with_a_long_chunk():
    long_chunk = ["x"] * 3 + ["y"] * 97  # 100 terms: stored as 96
    index = BM25Index.build([long_chunk, ["y", "z"], ["z"]])
    avgdl = (100 + 2 + 1) / 3
    idf = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    expected = idf * 3 * (K1 + 1) / (3 + K1 * (1 - B + B * 96 / avgdl))
    assert math.isclose(index.scores("x")[0], expected, rel_tol=1e-12)


def test_chunks_without_terms_count_for_neither_n_nor_avgdl():
    with_empty = BM25Index.build([["a", "b"], ["b"], []])
    without = BM25Index.build([["a", "b"], ["b"]])
    np.testing.assert_allclose(with_empty.scores("a b")[:2], without.scores("a b"), rtol=1e-12)
    assert with_empty.scores("a b")[2] == 0


def test_save_and_open_round_trip(tmp_path):
    idx = BM25Index.from_texts(["bus fare", "train pass", "bus passes pass"])
    idx.save(tmp_path)
    again = BM25Index.open(tmp_path)
    assert again.analyzer == idx.analyzer
    np.testing.assert_array_equal(again.scores("Bus passes"), idx.scores("bus pass"))


def test_an_index_from_before_the_analyser_is_queried_with_its_own_tokens(tmp_path):
    # The files an older version wrote: weights + vocabulary of lowercase \w+ tokens, no meta file.
    old = BM25Index.build([["the", "buses"], ["bus", "the"]])
    old.save(tmp_path)
    (tmp_path / "bm25_meta.json").unlink()
    opened = BM25Index.open(tmp_path)
    assert opened.analyzer == LEGACY_ANALYZER
    assert opened.scores("THE buses")[0] > 0 and opened.terms("THE buses") == ["the", "buses"]
    assert json.loads((tmp_path / "bm25_vocab.json").read_text()) == ["the", "buses", "bus"]


def test_scores_are_scipys_sparse_product_to_the_bit_and_open_needs_no_scipy(tmp_path):
    # A query is answered from the matrix's CSR arrays (no scipy import on the query path): it must add the
    # same products in the same order as `weights[terms].T @ counts`, the product the scores were proven with.
    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(400)]
    corpus = [list(rng.choice(words, size=rng.integers(1, 120))) for _ in range(3000)]
    index = BM25Index.build(corpus)
    index.save(tmp_path)
    opened = BM25Index.open(tmp_path)
    assert opened.rows.indices.dtype == index.rows.indices.dtype and opened.size == 3000
    for _ in range(200):
        query = " ".join(rng.choice(words, size=rng.integers(1, 25)))  # repeated terms count again
        ids = [index.vocab[t] for t in analyze(query) if t in index.vocab]
        terms, counts = np.unique(ids, return_counts=True)
        expected = np.asarray(index.weights[terms].T @ counts.astype(np.float64)).ravel()
        assert opened.scores(query).tobytes() == expected.tobytes()
    script = "import sys; from pathlib import Path; from sourcegate.pipelines.search.bm25 import BM25Index; "
    script += f"BM25Index.open(Path({str(tmp_path)!r}))"
    script += ".scores('w1 w2'); assert 'scipy' not in sys.modules, 'scipy imported'"
    subprocess.run([sys.executable, "-c", script], check=True)
