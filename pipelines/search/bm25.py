"""BM25 as a sparse term x chunk weight matrix, scoring exactly like rank-bm25's BM25Okapi.

Precomputing each (term, chunk) weight turns a query into a sum of a few sparse rows,
which is what makes corpus-wide score distributions cheap enough to compute per query.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
from scipy import sparse

_TOKEN = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens: the one tokenisation BM25, term coverage and tests share."""
    return _TOKEN.findall(text.lower())


class BM25Index:
    def __init__(self, vocab: dict[str, int], weights: sparse.csr_matrix):
        self.vocab = vocab
        self.weights = weights  # (terms, chunks)
        self.size = weights.shape[1]

    @classmethod
    def build(cls, corpus: list[list[str]], k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25) -> BM25Index:
        n = len(corpus)
        # Term ids in first-seen order; one (chunk, term) key per posting, counted by np.unique
        # (Python touches each token once; numpy does the counting and the weights).
        vocab: dict[str, int] = {}
        flat = np.fromiter((vocab.setdefault(t, len(vocab)) for tokens in corpus for t in tokens), np.int64)
        lengths = np.fromiter((len(t) for t in corpus), np.int64, count=n)
        width = max(len(vocab), 1)
        keys, counts = np.unique(np.repeat(np.arange(n, dtype=np.int64), lengths) * width + flat, return_counts=True)
        rows, cols, tf = keys % width, keys // width, counts.astype(np.float64)
        doc_len = lengths.astype(np.float64)
        avgdl = doc_len.sum() / n if n else 1.0
        df = np.bincount(rows, minlength=len(vocab)).astype(np.float64)
        # BM25Okapi's idf, with negative idfs floored at epsilon * mean idf (accumulated in
        # the same order as rank-bm25 so the floor matches to the last bit).
        idf = np.array([math.log(n - f + 0.5) - math.log(f + 0.5) for f in df])
        mean_idf = math.fsum(idf) / len(idf) if len(idf) else 0.0
        idf[idf < 0] = epsilon * mean_idf
        norm = k1 * (1 - b + b * doc_len[cols] / avgdl)
        w = idf[rows] * (tf * (k1 + 1) / (tf + norm))
        weights = sparse.csr_matrix((w, (rows, cols)), shape=(len(vocab), n))
        return cls(vocab, weights)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every chunk; repeated query terms count again, as in BM25Okapi."""
        ids = [self.vocab[t] for t in tokenize(query) if t in self.vocab]
        if not ids:
            return np.zeros(self.size)
        counts = Counter(ids)
        terms = np.array(sorted(counts))
        mult = np.array([counts[t] for t in terms], np.float64)
        return np.asarray(self.weights[terms].T @ mult).ravel()

    def save(self, folder: Path) -> None:
        sparse.save_npz(folder / "bm25.npz", self.weights)
        terms = sorted(self.vocab, key=self.vocab.get)
        (folder / "bm25_vocab.json").write_text(json.dumps(terms), encoding="utf-8")

    @classmethod
    def open(cls, folder: Path) -> BM25Index:
        terms = json.loads((folder / "bm25_vocab.json").read_text(encoding="utf-8"))
        return cls({t: i for i, t in enumerate(terms)}, sparse.load_npz(folder / "bm25.npz").tocsr())
