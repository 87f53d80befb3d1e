import numpy as np
from rank_bm25 import BM25Okapi

from pipelines.search.bm25 import BM25Index, tokenize


def test_scores_equal_rank_bm25_okapi():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(60)] + ["the"] * 20  # a very common word gets a negative idf
    corpus = [" ".join(rng.choice(words, size=rng.integers(3, 40))) for _ in range(200)]
    tokens = [tokenize(t) for t in corpus]
    ours, ref = BM25Index.build(tokens), BM25Okapi(tokens)
    for query in ["w1 w2", "the w3", "w5 w5 w7", "unknownword", "the", "w59 w0 w1 w2 w3"]:
        np.testing.assert_allclose(ours.scores(query), ref.get_scores(tokenize(query)), rtol=1e-12, atol=1e-12)


def test_save_and_open_round_trip(tmp_path):
    idx = BM25Index.build([tokenize("bus fare"), tokenize("train pass"), tokenize("bus pass pass")])
    idx.save(tmp_path)
    again = BM25Index.open(tmp_path)
    np.testing.assert_array_equal(again.scores("bus pass"), idx.scores("bus pass"))
