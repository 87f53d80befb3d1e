"""Hybrid retrieval: BM25 top-N + kNN top-N, reciprocal rank fusion, fail-safe reranking,
and the per-question signals that both answer modes and the calibration sweep use.

`Retriever.retrieve` is the only place signals are computed, so runtime decisions and
calibration numbers can never disagree. A night computes every signal; serving may ask for the decision's alone
(`wanted`): each signal is computed from the same inputs whichever others are, so the decision is the same.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from sourcegate.pipelines import config as config_models
from sourcegate.pipelines.retrieval import combiner as combiner_mod
from sourcegate.pipelines.retrieval.answer_support import answer_support
from sourcegate.pipelines.retrieval.answerability import (
    TOP_PASSAGES,
    TextVectors,
    answerability_signals,
    content_terms,
    texts_to_encode,
)
from sourcegate.pipelines.retrieval.rerank import Reranked, safe_rerank
from sourcegate.pipelines.search.analyzer import STOPWORDS
from sourcegate.pipelines.search.base import Hit, HybridResult, SearchBackend, hybrid_search
from sourcegate.pipelines.search.bm25 import tokenize

# The signals that encode the words and sentences of the top passages: the costly ones after the models
ENCODED_SIGNALS = ("concept_coverage", "sentence_cosine", "uncovered_terms")


@dataclass
class Candidate:
    chunk_id: str
    doc_id: str
    title: str
    section: str
    section_id: str
    text: str
    fused_rank: int
    fused_score: float
    bm25_rank: int | None = None
    bm25_score: float | None = None
    knn_rank: int | None = None
    cosine: float | None = None
    rerank_probability: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Retrieval:
    query: str  # what was searched: prior turns prepended
    fused: list[Candidate]  # fusion order
    ranked: list[Candidate]  # final order: reranked top-M then the rest, or fused
    reranked: bool
    signals: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)  # seconds per stage: embed, search, rerank, signals, answer


@dataclass
class _Staged:
    """A retrieval between its rerank and its signals (what the signals read)."""

    retrieval: Retrieval
    vector: np.ndarray
    found: HybridResult
    result: Reranked | None
    top: list[str]


class Clock:
    """Seconds since the previous lap."""

    def __init__(self):
        self.last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        elapsed, self.last = now - self.last, now
        return elapsed


def rrf(lists: Sequence[Sequence[Hit]], k: int = 60) -> list[tuple[str, float]]:
    """Reciprocal rank fusion (1-based ranks); ties broken by best single rank, then id."""
    score: dict[str, float] = {}
    best: dict[str, int] = {}
    for hits in lists:
        for rank, hit in enumerate(hits, 1):
            score[hit.chunk_id] = score.get(hit.chunk_id, 0.0) + 1.0 / (k + rank)
            best[hit.chunk_id] = min(best.get(hit.chunk_id, rank), rank)
    return sorted(score.items(), key=lambda kv: (-kv[1], best[kv[0]], kv[0]))


def minmax(values: Sequence[float]) -> list[float]:
    lo, hi = min(values, default=0.0), max(values, default=0.0)
    return [(v - lo) / (hi - lo) if hi > lo else 0.0 for v in values]


def blend(logits: Sequence[float], fused_scores: Sequence[float], weight: float) -> list[int]:
    """Final order of the rerank head: weight x cross-encoder + (1 - weight) x fusion.

    Both are min-max scaled within the head, so neither scale dominates; weight 1 is the
    cross-encoder's order, weight 0 the fused order; ties keep the fused rank. The
    cross-encoder alone overrides the fusion's agreement between BM25 and kNN, which on
    SciFact costs nDCG (docs/benchmarks/07-quality-scifact.md).
    """
    combined = [weight * a + (1 - weight) * b for a, b in zip(minmax(logits), minmax(fused_scores))]
    return sorted(range(len(combined)), key=lambda i: (-combined[i], i))


def rerank_head(
    scorer, query: str, texts: Sequence[str], fused_scores: Sequence[float], weight: float, timeout_s: float
) -> tuple[Reranked | None, list[int]]:
    """Rerank the fused head: the scorer's result (None on any failure) and the head's final order."""
    result = safe_rerank(scorer, query, texts, timeout_s)
    order = blend(result.logits, fused_scores, weight) if result is not None else list(range(len(texts)))
    return result, order


CONTEXT_WORDS = 64  # prior-turn words a question reads, the newest; every eval set's context holds at most 12


def effective_query(question: str, context: Sequence[str] = ()) -> str:
    """Multi-turn: the prior turns are prepended so a follow-up keeps its subject. Only their newest CONTEXT_WORDS
    words: the models read a question's first 256 tokens, so a long history would push the question itself out of
    what they read (a chat's whole transcript sent as context). Within the bound, the text is as it always was."""
    turns = [c.strip() for c in context if c.strip()]
    words = " ".join(turns).split()
    if len(words) > CONTEXT_WORDS:
        turns = [" ".join(words[-CONTEXT_WORDS:])]
    return " ".join([*turns, question.strip()])


def term_coverage(query: str, text: str) -> float:
    # Function words (the BM25 analyser's stopwords) do not make a question "covered"; content words do.
    terms = {t for t in tokenize(query) if t not in STOPWORDS} or set(tokenize(query))
    if not terms:
        return 0.0
    present = set(tokenize(text))
    return len(terms & present) / len(terms)


def margin(scores: Sequence[float]) -> float:
    """Normalised top-1/top-2 gap: (s1 - s2) / s1; 1.0 for a lone candidate."""
    if not scores or scores[0] <= 0:
        return 0.0
    if len(scores) == 1:
        return 1.0
    return (scores[0] - scores[1]) / scores[0]


def combiner_for(cfg: config_models.PipelineConfig) -> dict | None:
    """The accepted answerability combiner the config names (CombinerError if it is missing or stale)."""
    section = cfg.answerability
    return combiner_mod.load(section.combiner, section.features) if section.combiner else None


# The one source of defaults is the config's models (sourcegate/pipelines/config.py); no number of its own here.
_DEFAULTS = config_models.PipelineConfig()


class Retriever:
    """Hybrid retrieval, fusion and reranking with the settings of the config's `retrieval` section and the
    `reranker` section's timeout (sourcegate/pipelines/config.py, the one source of their defaults)."""

    def __init__(
        self,
        searcher: SearchBackend,
        embedder,
        scorer=None,
        retrieval: config_models.Retrieval = _DEFAULTS.retrieval,
        reranker: config_models.Reranker = _DEFAULTS.reranker,
        combiner: dict | None = None,
        answer_scorer=None,
        answer_passages: int = _DEFAULTS.answerability.answer_passages,
        wanted: frozenset[str] | None = None,
    ):
        self.searcher, self.embedder, self.scorer = searcher, embedder, scorer
        self.wanted = wanted  # the signals a caller reads (serving: the decision's); None: every one (a night)
        self.answer_scorer = answer_scorer  # the answer-support cross-encoder (answer_support.py), or None
        self.answer_passages = answer_passages  # how many of the fused top it reads
        self.combiner = (
            combiner  # the accepted answerability combiner (sourcegate/pipelines/retrieval/combiner.py), or None
        )
        self.settings, self.rerank_timeout_s = retrieval, reranker.timeout_s
        self.text_vectors = TextVectors(embedder)  # questions, their words, passage sentences: by text hash

    @classmethod
    def from_config(
        cls,
        searcher,
        embedder,
        scorer,
        cfg: config_models.PipelineConfig,
        answer_scorer=None,
        wanted: frozenset[str] | None = None,
        **overrides,
    ) -> Retriever:
        """The config's retrieval settings; `overrides` of the `retrieval` section (e.g. deeper lists for
        `sourcegate beir`) win. `wanted`: the signals computed (None: every one)."""
        retrieval = config_models.replace(cfg.retrieval, overrides)
        return cls(
            searcher,
            embedder,
            scorer,
            retrieval,
            cfg.reranker,
            combiner_for(cfg),
            answer_scorer,
            cfg.answerability.answer_passages,
            wanted,
        )

    def fuse(self, query: str, vector, terms: Sequence[str] = ()) -> tuple[list[Candidate], HybridResult]:
        """Both lists fused into candidates, and the search result they came from (the signals read it,
        with the document frequencies of `terms`)."""
        found = hybrid_search(self.searcher, query, vector, self.settings.bm25_top_n, self.settings.knn_top_n, terms)
        bm25, knn = found.bm25, found.knn
        fused = rrf([bm25, knn], self.settings.rrf_k)
        stored = [found.stored[cid] for cid, _ in fused]
        out = [
            Candidate(
                **{f: s[f] for f in ("chunk_id", "doc_id", "title", "section", "section_id", "text")},
                fused_rank=rank,
                fused_score=score,
            )
            for rank, ((cid, score), s) in enumerate(zip(fused, stored), 1)
        ]
        by_id = {c.chunk_id: c for c in out}
        for rank, h in enumerate(bm25, 1):
            by_id[h.chunk_id].bm25_rank, by_id[h.chunk_id].bm25_score = rank, h.score
        for rank, h in enumerate(knn, 1):
            by_id[h.chunk_id].knn_rank, by_id[h.chunk_id].cosine = rank, h.score
        return out, found

    def rerank(self, query: str, fused: list[Candidate]) -> tuple[Reranked | None, list[Candidate]]:
        """The cross-encoder's result over the fused head (None on failure) and the final order:
        the head blended with its fused scores, then the rest of the fused list."""
        head = fused[: self.settings.rerank_depth]
        result, order = rerank_head(
            self.scorer,
            query,
            [c.text for c in head],
            [c.fused_score for c in head],
            self.settings.rerank_weight,
            self.rerank_timeout_s,
        )
        if result is not None:
            for c, p in zip(head, result.probabilities):
                c.rerank_probability = p
        return result, [head[i] for i in order] + fused[self.settings.rerank_depth :]

    def retrieve(self, question: str, context: Sequence[str] = ()) -> Retrieval:
        return self.retrieve_many([(question, context)])[0]

    def retrieve_many(self, questions: Sequence[tuple[str, Sequence[str]]]) -> list[Retrieval]:
        """Retrievals of many (question, prior turns), batched across questions: the question vectors
        in one pass, then every word and sentence the signals embed in one more. Each retrieval and
        its signals are the same as alone, in any order or batch (a text's vector is its text's alone).

        Timings are seconds per question; a batched stage is shared out evenly.
        """
        if not questions:
            return []
        clock = Clock()
        queries = [effective_query(q, c) for q, c in questions]
        vectors = self.text_vectors(queries)
        embed_each = clock.lap() / len(queries)
        staged = [self._ranked(query, vector, embed_each) for query, vector in zip(queries, vectors)]
        clock.lap()
        if self.wants(*ENCODED_SIGNALS):
            self.text_vectors.prefetch(t for s in staged for t in texts_to_encode(s.retrieval.query, s.top, STOPWORDS))
        prefetch_each = clock.lap() / len(queries)
        for s in staged:
            s.retrieval.signals = self._signals(s)
            # the answer model's pairs timed apart (`_signals`): the costliest signal, and the one a night gates on
            s.retrieval.timings["signals"] = clock.lap() + prefetch_each - s.retrieval.timings["answer"]
        return [s.retrieval for s in staged]

    def _ranked(self, query: str, vector: np.ndarray, embed_s: float) -> _Staged:
        """One question's search and rerank; its signals wait for the batch's texts to be encoded."""
        clock = Clock()
        fused, found = self.fuse(query, vector, content_terms(query, STOPWORDS))
        search_s = clock.lap()
        result, ranked = self.rerank(query, fused)
        timings = {"embed": embed_s, "search": search_s, "rerank": clock.lap()}
        retrieval = Retrieval(query, fused, ranked, result is not None, {}, timings)
        top = [c.text for c in fused[:TOP_PASSAGES]]  # the fused top: the same at any rerank_weight (G7)
        return _Staged(retrieval, vector, found, result, top)

    def wants(self, *names: str) -> bool:
        """Whether any of `names` is computed: all are unless `wanted` names others (the combiner reads them all)."""
        return self.wanted is None or combiner_mod.SIGNAL in self.wanted or not self.wanted.isdisjoint(names)

    def _signals(self, s: _Staged) -> dict:
        query = s.retrieval.query
        signals = self.signals(query, s.retrieval.fused, s.found, s.result)  # cheap: always
        if self.wants(*ENCODED_SIGNALS):
            signals.update(
                answerability_signals(
                    query,
                    s.vector,
                    s.top,
                    s.found.distribution.total,  # idf over the whole index, not the candidates (G7)
                    s.found.document_frequencies,
                    STOPWORDS,
                    self.text_vectors,
                    self.text_vectors,
                )
            )
        clock = Clock()
        if self.wants("answer_support"):
            # the fused top: independent of the rerank (G7)
            window = [c.text for c in s.retrieval.fused[: self.answer_passages]]
            signals["answer_support"] = answer_support(self.answer_scorer, query, window)
        s.retrieval.timings["answer"] = clock.lap()
        if self.wants(combiner_mod.SIGNAL):
            # the accepted coefficients over the signals above; None without a combiner or a feature
            signals[combiner_mod.SIGNAL] = combiner_mod.score(self.combiner, signals) if self.combiner else None
        return signals

    @staticmethod
    def signals(query: str, fused: list[Candidate], found, result: Reranked | None) -> dict:
        """Every signal from a fixed definition, independent of rerank_weight and the final order.

        cosine_top, bm25_top, bm25_z read the whole index (`found`: the search's distribution and
        best cosine); term_coverage reads the fused top (fused[0]), so it exists whether or not
        the reranker ran; rerank_top and margin read the cross-encoder's probabilities over the
        fused head and are None when the reranker failed or is off: never replaced by a score on
        another scale.
        """
        dist = found.distribution
        bm25_top = float(dist.scores.max()) if len(dist.scores) else 0.0
        probabilities = result.probabilities if result is not None and result.probabilities else None
        return {
            "cosine_top": found.best_cosine,
            "rerank_top": max(probabilities) if probabilities else None,
            "bm25_top": bm25_top,
            "bm25_z": dist.zscore(bm25_top),
            "term_coverage": term_coverage(query, fused[0].text) if fused else 0.0,
            "margin": margin(sorted(probabilities, reverse=True)[:2]) if probabilities else None,
        }
