"""BM25 as a sparse term x chunk weight matrix, scoring like Lucene's BM25Similarity (OpenSearch).

Precomputing each (term, chunk) weight turns a query into a sum of a few sparse rows,
which is what makes corpus-wide score distributions cheap enough to compute per query.

The formula is Lucene's, so the embedded backend and OpenSearch give the same scores to the
same analysed text (:mod:`sourcegate.pipelines.search.analyzer`):

    idf(t)    = ln(1 + (N - df + 0.5) / (df + 0.5))      never negative, unlike Okapi's
    w(t, c)   = idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))

with N the chunks that have at least one term, avgdl their mean length, and dl the chunk's
length as Lucene stores it: one byte per document (``SmallFloat.intToByte4``), exact below 40
terms and rounded down to 4 significant bits above. The ``(k1 + 1)`` factor, which Lucene 8
dropped, is kept: OpenSearch's ``BM25`` similarity is Lucene's ``LegacyBM25Similarity``.

An index stores the id of the analyser it was built with; one built before the analyser
existed (``bm25_meta.json`` absent) is queried with its own tokenisation, so older versions
still serve correctly.

Queries read the matrix's CSR arrays with numpy, in the order scipy's sparse product adds them (the same scores to
the bit); scipy is imported only to build, save or hand out the matrix (about 0.1 s of a cold `query`).
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np

from sourcegate.pipelines.search.analyzer import ANALYZER_ID, analyze, words

# Lucene's (and so OpenSearch's) defaults, which BEIR's published Elasticsearch BM25 used.
K1 = 1.2
B = 0.75
LEGACY_ANALYZER = "lowercase-words"  # indexes built before sourcegate.pipelines.search.analyzer: \w+ of .lower()
_LEGACY_TOKEN = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    """Normalised lowercase word tokens (no stemming, no stopwords): what term coverage compares."""
    return words(text)


def _legacy_tokens(text: str) -> list[str]:
    return _LEGACY_TOKEN.findall(text.lower())


QUERY_ANALYZERS = {ANALYZER_ID: analyze, LEGACY_ANALYZER: _legacy_tokens}


def _int4(i: np.ndarray) -> np.ndarray:
    """SmallFloat.longToInt4: 3 explicit mantissa bits and a shift."""
    bits = np.zeros_like(i)
    nz = i > 0
    bits[nz] = np.floor(np.log2(i[nz])).astype(np.int64) + 1  # 64 - numberOfLeadingZeros
    shift = np.maximum(bits - 4, 0)
    normal = bits >= 4
    return np.where(normal, ((i >> shift) & 0x07) | ((shift + 1) << 3), i)


def _from_int4(e: np.ndarray) -> np.ndarray:
    shift = (e >> 3) - 1
    return np.where(shift == -1, e & 0x07, ((e & 0x07) | 0x08) << np.maximum(shift, 0))


def lucene_length(lengths: np.ndarray) -> np.ndarray:
    """The document length Lucene scores with: intToByte4 then byte4ToInt (24 free values)."""
    n = np.asarray(lengths, np.int64)
    free = 24
    return np.where(n < free, n, free + _from_int4(_int4(np.maximum(n - free, 0))))


def bm25_weights(rows, cols, tf, lengths, k1: float = K1, b: float = B, df=None) -> np.ndarray:
    """Lucene BM25 weight of each (term row, chunk col) posting with term frequency tf.

    `df` (postings per term over the whole corpus) is counted from `rows` unless given: a caller
    weighing the postings a slice at a time gives the corpus's."""
    lengths = np.asarray(lengths, np.int64)
    has_terms = lengths > 0
    docs = int(has_terms.sum())
    avgdl = lengths.sum() / docs if docs else 1.0
    if df is None:
        df = np.bincount(rows, minlength=int(rows.max()) + 1 if len(rows) else 0).astype(np.float64)
    idf = np.log1p((docs - df + 0.5) / (df + 0.5))
    dl = lucene_length(lengths).astype(np.float64)
    tf = np.asarray(tf, np.float64)
    return idf[rows] * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl[cols] / avgdl))


class Rows(NamedTuple):
    """A CSR matrix's arrays: row i's columns are indices[indptr[i]:indptr[i + 1]], its values data[...]."""

    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    shape: tuple[int, int]

    @classmethod
    def of(cls, matrix) -> Rows:
        csr = matrix.tocsr()
        return cls(csr.data, csr.indices, csr.indptr, tuple(csr.shape))

    @classmethod
    def load(cls, path: Path) -> Rows:
        """A matrix scipy.sparse.save_npz wrote in CSR, read without scipy (another format is converted by it)."""
        with np.load(path, allow_pickle=False) as z:
            fmt = z["format"].item()
            if (fmt.decode() if isinstance(fmt, bytes) else fmt) != "csr":
                from scipy import sparse

                return cls.of(sparse.load_npz(path))
            return cls(z["data"], z["indices"], z["indptr"], tuple(int(n) for n in z["shape"]))

    def weighted_sum(self, rows: np.ndarray, mult: np.ndarray) -> np.ndarray:
        """sum_k mult[k] * row rows[k], as scipy's `matrix[rows].T @ mult`: one row after another, each product
        rounded before it is added."""
        out = np.zeros(self.shape[1], np.result_type(self.data.dtype, mult.dtype))
        for r, m in zip(rows.tolist(), mult.astype(out.dtype)):  # products in the result's precision, as scipy's
            lo, hi = self.indptr[r], self.indptr[r + 1]
            out[self.indices[lo:hi]] += self.data[lo:hi] * m
        return out


class BM25Index:
    def __init__(self, vocab: dict[str, int], weights, analyzer: str = ANALYZER_ID):
        """`weights`: the (terms, chunks) matrix, as its CSR `Rows` or a scipy sparse matrix."""
        if analyzer not in QUERY_ANALYZERS:
            raise ValueError(f"BM25 index built with unknown analyser {analyzer!r}; rebuild the index")
        self.vocab = vocab
        self.rows = weights if isinstance(weights, Rows) else Rows.of(weights)
        self.size = self.rows.shape[1]
        self.analyzer = analyzer
        self._analyze = QUERY_ANALYZERS[analyzer]

    @property
    def weights(self):
        """The (terms, chunks) weight matrix as a scipy CSR matrix (a view of `rows`)."""
        from scipy import sparse

        return sparse.csr_matrix((self.rows.data, self.rows.indices, self.rows.indptr), shape=self.rows.shape)

    @classmethod
    def build(cls, corpus: list[list[str]], k1: float = K1, b: float = B) -> BM25Index:
        """From analysed chunks (``analyze(text)`` each)."""
        return BM25Builder().add(corpus).build(k1, b)

    @classmethod
    def from_texts(cls, texts: list[str], k1: float = K1, b: float = B) -> BM25Index:
        return cls.build([analyze(t) for t in texts], k1, b)

    def terms(self, query: str) -> list[str]:
        return self._analyze(query)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every chunk; a repeated query term counts again (as Lucene's match query does)."""
        ids = [self.vocab[t] for t in self._analyze(query) if t in self.vocab]
        if not ids:
            return np.zeros(self.size)
        counts = Counter(ids)
        terms = np.array(sorted(counts))
        mult = np.array([counts[t] for t in terms], np.float64)
        return self.rows.weighted_sum(terms, mult)

    def document_frequency(self, word: str) -> int:
        """Chunks holding every BM25 term of `word` (its query analysis); 0 when it has none or one is unseen."""
        ids = {self.vocab.get(t) for t in self._analyze(word)}
        if not ids or None in ids:
            return 0
        ptr, cols = self.rows.indptr, self.rows.indices  # CSR rows: a term's postings (weights are > 0)
        return len(functools.reduce(np.intersect1d, (cols[ptr[i] : ptr[i + 1]] for i in sorted(ids))))

    def save(self, folder: Path) -> None:
        from scipy import sparse

        sparse.save_npz(folder / "bm25.npz", self.weights)
        terms = sorted(self.vocab, key=self.vocab.get)
        (folder / "bm25_vocab.json").write_text(json.dumps(terms), encoding="utf-8")
        (folder / "bm25_meta.json").write_text(json.dumps({"analyzer": self.analyzer}), encoding="utf-8")

    @classmethod
    def open(cls, folder: Path) -> BM25Index:
        terms = json.loads((folder / "bm25_vocab.json").read_text(encoding="utf-8"))
        meta = folder / "bm25_meta.json"
        analyzer = json.loads(meta.read_text(encoding="utf-8"))["analyzer"] if meta.exists() else LEGACY_ANALYZER
        return cls({t: i for i, t in enumerate(terms)}, Rows.load(folder / "bm25.npz"), analyzer)


class BM25Builder:
    """Builds a BM25Index batch by batch: only one batch's token lists exist at a time.

    Each batch becomes the next columns of a term x chunk count matrix (CSC: term ids and counts,
    int32, per chunk). Term ids are assigned in first-seen order over the whole corpus, so the
    index is the same whatever the batches. The weights need N, avgdl and each term's df, known
    only at the end: `build` computes them, then the CSR matrix queries are answered from.
    """

    def __init__(self):
        self.vocab: dict[str, int] = {}
        self._terms: list[np.ndarray] = []
        self._counts: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._postings: list[np.ndarray] = []  # per chunk

    def add(self, corpus: list[list[str]]) -> BM25Builder:
        """The next chunks, analysed (``analyze(text)`` each)."""
        vocab, n = self.vocab, len(corpus)
        # One (chunk, term) key per posting, counted by np.unique (Python touches each token once).
        flat = np.fromiter((vocab.setdefault(t, len(vocab)) for tokens in corpus for t in tokens), np.int64)
        lengths = np.fromiter((len(t) for t in corpus), np.int64, count=n)
        width = max(len(vocab), 1)
        keys, counts = np.unique(np.repeat(np.arange(n, dtype=np.int64), lengths) * width + flat, return_counts=True)
        self._terms.append((keys % width).astype(np.int32))  # sorted by chunk, then term: CSC order
        self._counts.append(counts.astype(np.int32))
        self._postings.append(np.bincount(keys // width, minlength=n))
        self._lengths.append(lengths)
        return self

    def build(self, k1: float = K1, b: float = B) -> BM25Index:
        terms = np.concatenate(self._terms) if self._terms else np.zeros(0, np.int32)
        counts = np.concatenate(self._counts) if self._counts else np.zeros(0, np.int32)
        self._terms, self._counts = [], []
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        n, n_terms = len(lengths), len(self.vocab)
        per_chunk = np.zeros(n + 1, np.int64)
        per_chunk[1:] = np.cumsum(np.concatenate(self._postings)) if n else []
        weights = np.empty(len(terms), np.float64)
        df = np.bincount(terms, minlength=n_terms).astype(np.float64)
        for lo in range(0, n, 65_536):  # the weights a slice of chunks at a time: bounded temporaries
            hi = min(lo + 65_536, n)
            a, z = per_chunk[lo], per_chunk[hi]
            cols = np.repeat(np.arange(lo, hi), np.diff(per_chunk[lo : hi + 1]))
            weights[a:z] = bm25_weights(terms[a:z], cols, counts[a:z], lengths, k1, b, df=df)
        del counts
        from scipy import sparse

        matrix = sparse.csc_matrix((weights, terms, per_chunk), shape=(n_terms, n))
        return BM25Index(self.vocab, matrix.tocsr())
