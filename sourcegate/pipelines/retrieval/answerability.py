"""Answerability signals: does the retrieved text contain an answer, not just the subject?

Relatedness signals (cosine, cross-encoder, BM25) score a passage about the question's subject
high even when it does not answer it ("Does RRT give seniors taxi vouchers?" against the
reduced-fares section). Two cheaper views of the same passages look at what is missing:

- `concept_coverage`: the question's content terms, each weighted by its idf over the whole
  index (a term the corpus has never seen weighs most), and each covered by the top passages
  either exactly or softly, by its bi-encoder similarity to the passages' words (so "bicycle"
  is covered by "bike"). The weights read the index, not the retrieved candidates, whose number
  follows `bm25_top_n`/`knn_top_n`: a signal's definition does not depend on ranking settings (G7).
- `sentence_cosine`: the best bi-encoder cosine between the question and one sentence of
  the top passages: an answer usually sits in one sentence, a topic spreads over all.

Everything here is a small pure function over strings and vectors; `Retriever.retrieve`
wires them in with the models it already holds. Higher always means "more answerable".
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from sourcegate.pipelines.retrieval import kept
from sourcegate.pipelines.search.bm25 import tokenize

TOP_PASSAGES = 3  # passages of the final order that may hold the answer
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])|\n+")


def content_terms(query: str, stopwords: Iterable[str]) -> list[str]:
    """Distinct content words of the question, in order; none when it has only function words."""
    stop = set(stopwords)
    return list(dict.fromkeys(t for t in tokenize(query) if t not in stop and not t.isdigit()))


def rarity_weights(terms: Sequence[str], n: int, df: Mapping[str, int]) -> dict[str, float]:
    """BM25-style idf of each term over the whole index: `n` chunks, `df[term]` of them holding it.

    The frequencies come from the search backend (`SearchBackend.document_frequencies`, the same
    BM25 analysis on both backends). A term missing from `df`, whose analysis is empty or that no
    chunk holds, counts 0: the index does not have it, so it gets the largest weight.
    """
    return {t: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for t in terms for f in [df.get(t, 0)]}


def term_similarity(terms: Sequence[str], words: Sequence[str], encode: Callable[[list[str]], np.ndarray]) -> dict:
    """Each term's best cosine to any of `words` (1.0 for an exact match; 0.0 with no words)."""
    present = set(words)
    out = {t: 1.0 for t in terms if t in present}
    rest = [t for t in terms if t not in present]
    vocab = sorted(present)
    if rest and vocab:
        sims = encode(rest) @ encode(vocab).T
        out.update({t: float(max(0.0, sims[i].max())) for i, t in enumerate(rest)})
    out.update({t: 0.0 for t in rest if t not in out})
    return out


def concept_coverage(weights: Mapping[str, float], similarity: Mapping[str, float]) -> float:
    """Rarity-weighted mean coverage of the question's content terms, in [0, 1].

    A question without content terms ("what is it?") has nothing to cover: 1.0, so this
    signal never declines it on its own; relatedness signals still can.
    """
    total = sum(weights.values())
    if total <= 0:
        return 1.0
    return sum(w * similarity.get(t, 0.0) for t, w in weights.items()) / total


def uncovered(weights: Mapping[str, float], similarity: Mapping[str, float], below: float = 0.5) -> list[str]:
    """Terms the top passages do not cover (similarity under `below`), rarest first: the explanation."""
    return sorted((t for t in weights if similarity.get(t, 0.0) < below), key=lambda t: (-weights[t], t))


def split_sentences(text: str) -> list[str]:
    """Sentences and list items of a passage (a list item is its own sentence)."""
    parts = (p.strip(" -*\t") for p in _SENTENCE_END.split(text))
    return [p for p in parts if len(tokenize(p)) >= 3]


def best_sentence_cosine(query_vector: np.ndarray, sentences: Sequence[str], encode) -> float:
    """Highest cosine between the question and any single sentence (0.0 without sentences)."""
    if not sentences:
        return 0.0
    return float(max(0.0, (encode(list(sentences)) @ np.asarray(query_vector)).max()))


class TextVectors:
    """Bi-encoder vectors of texts the signals embed (questions, their words, passage sentences),
    memoised by text hash under the model's fingerprint.

    Exact to reuse: every backend makes a text's vector a function of the text alone (torch-bf16's
    fixed shapes, ONNX one text per run; torch's dynamic padding moves it by < 1e-6), so a vector
    kept from another question, batch or night equals a fresh one. `prefetch` encodes all missing
    texts of many questions in one call (full forward passes instead of one question's few); `save_kept`
    and `load_kept` keep the vectors across nights, as the chunk cache does (sourcegate/pipelines/build/embed.py).
    """

    def __init__(self, embedder, limit: int = 500_000):
        self.embedder, self.limit = embedder, limit
        self.fingerprint = getattr(embedder, "fingerprint", None)
        self.memo: dict[str, np.ndarray] = {}
        self.computed = 0  # texts this process had to encode (the rest came from the memo)

    def prefetch(self, texts: Iterable[str]) -> None:
        keyed = {kept.text_key(t): t for t in texts}
        if len(self.memo) + len(keyed) > self.limit:  # bounded memory; whatever is asked now stays encodable
            self.memo.clear()
        todo = sorted((k, t) for k, t in keyed.items() if k not in self.memo)
        if not todo:
            return
        vectors = self.embedder.encode([t for _, t in todo])
        self.memo.update((h, v) for (h, _), v in zip(todo, vectors))
        self.computed += len(todo)

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.prefetch(texts)
        if not texts:
            return np.zeros((0, self.dimension), np.float32)
        return np.stack([self.memo[kept.text_key(t)] for t in texts])

    @property
    def kept_binding(self) -> str | None:
        """The key kept vectors are stored and found under: the model's fingerprint, the encoder's code and
        truncation length, the runtime (sourcegate/pipelines/retrieval/kept.py)."""
        recipe = {
            "encoder": type(self.embedder).__qualname__,
            "code": kept.source_digest(*getattr(self.embedder, "code", (type(self.embedder),))),
            "max_tokens": getattr(self.embedder, "max_tokens", None),
        }
        return kept.binding(self.fingerprint, recipe)

    def save_kept(self, path: Path) -> int:
        """Write the memo for the next night (sourcegate/pipelines/retrieval/kept.py); returns the rows written."""
        return kept.save(path, self.kept_binding, self.memo, self.dimension)

    def load_kept(self, path: Path | None) -> int:
        """Take the vectors an earlier night kept under this binding; returns how many."""
        found = kept.load(path, self.kept_binding, self.dimension)
        self.memo.update(found)
        return len(found)

    @property
    def dimension(self) -> int:
        return int(getattr(self.embedder, "dimension", 0))


def signal_inputs(query: str, top_texts: Sequence[str], stopwords: Iterable[str]) -> tuple[list, list, list]:
    """What the answerability signals read: the question's content terms, the top passages' words
    (sorted, distinct) and their sentences."""
    terms = content_terms(query, stopwords)
    words = sorted({w for text in top_texts for w in tokenize(text)})
    sentences = [s for text in top_texts for s in split_sentences(text)]
    return terms, words, sentences


def texts_to_encode(query: str, top_texts: Sequence[str], stopwords: Iterable[str]) -> list[str]:
    """Every text `answerability_signals` will embed for this retrieval (for `TextVectors.prefetch`)."""
    terms, words, sentences = signal_inputs(query, top_texts, stopwords)
    present = set(words)
    rest = [t for t in terms if t not in present]
    return [*rest, *(words if rest else []), *sentences]


def answerability_signals(
    query: str,
    query_vector: np.ndarray,
    top_texts: Sequence[str],
    n_chunks: int,
    document_frequencies: Mapping[str, int],
    stopwords: Iterable[str],
    word_vectors: Callable[[list[str]], np.ndarray],
    sentence_vectors: Callable[[list[str]], np.ndarray],
) -> dict:
    """The answerability signals of one retrieval (see the module docstring); `n_chunks` and
    `document_frequencies` describe the whole index (`content_terms` of the query -> chunks)."""
    terms, words, sentences = signal_inputs(query, top_texts, stopwords)
    weights = rarity_weights(terms, n_chunks, document_frequencies)
    similarity = term_similarity(terms, words, word_vectors)
    return {
        "concept_coverage": concept_coverage(weights, similarity),
        "sentence_cosine": best_sentence_cosine(query_vector, sentences, sentence_vectors),
        "uncovered_terms": uncovered(weights, similarity),
    }
