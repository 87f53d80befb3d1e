"""Ranking metrics over plain dicts, matching trec_eval / ranx conventions.

run:   {qid: [doc_id, ...]}            ranked best first
qrels: {qid: {doc_id: relevance int}}  a document is relevant when relevance > 0

Queries are those in qrels (a query missing from the run scores 0); run
queries without judgments are ignored. A document retrieved twice counts once,
at its first rank. Each metric returns {"per_query": {qid: value}, "mean": value}.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

Run = Mapping[str, Sequence[str]]
Qrels = Mapping[str, Mapping[str, int]]
PerQuery = Callable[[list[str], Mapping[str, int]], float]


def _ranked(docs: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(docs))  # drop repeats, keep first rank


def _relevant(rels: Mapping[str, int]) -> set[str]:
    return {doc for doc, rel in rels.items() if rel > 0}


def first_relevant_rank(docs: Sequence[str], rels: Mapping[str, int], k: int | None = None) -> int | None:
    """1-based rank of the first relevant document (within top k), or None."""
    relevant = _relevant(rels)
    for rank, doc in enumerate(_ranked(docs)[:k], start=1):
        if doc in relevant:
            return rank
    return None


def _precision(docs: list[str], rels: Mapping[str, int], k: int) -> float:
    relevant = _relevant(rels)
    return sum(doc in relevant for doc in docs[:k]) / k  # short runs still divide by k


def _recall(docs: list[str], rels: Mapping[str, int], k: int) -> float:
    relevant = _relevant(rels)
    if not relevant:
        return 0.0
    return sum(doc in relevant for doc in docs[:k]) / len(relevant)


def _dcg(gains: Sequence[float]) -> float:
    return sum(g / math.log2(rank + 1) for rank, g in enumerate(gains, start=1))


def _ndcg(docs: list[str], rels: Mapping[str, int], k: int) -> float:
    # Jarvelin-Kekalainen gain = relevance (not 2**rel - 1), as ranx "ndcg".
    gain = {doc: rel for doc, rel in rels.items() if rel > 0}
    ideal = _dcg(sorted(gain.values(), reverse=True)[:k])
    if ideal == 0.0:
        return 0.0
    return _dcg([gain.get(doc, 0) for doc in docs[:k]]) / ideal


def _reciprocal_rank(docs: list[str], rels: Mapping[str, int], k: int | None) -> float:
    rank = first_relevant_rank(docs, rels, k)
    return 1.0 / rank if rank else 0.0


def _evaluate(run: Run, qrels: Qrels, per_query: PerQuery) -> dict:
    values = {qid: per_query(_ranked(run.get(qid, ())), rels) for qid, rels in qrels.items()}
    mean = sum(values.values()) / len(values) if values else 0.0
    return {"per_query": values, "mean": mean}


def _check_k(k: int) -> int:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return k


def precision_at(run: Run, qrels: Qrels, k: int) -> dict:
    """Share of the top k that is relevant (always divided by k)."""
    _check_k(k)
    return _evaluate(run, qrels, lambda docs, rels: _precision(docs, rels, k))


def recall_at(run: Run, qrels: Qrels, k: int) -> dict:
    """Share of the relevant documents found in the top k (0 when none are judged relevant)."""
    _check_k(k)
    return _evaluate(run, qrels, lambda docs, rels: _recall(docs, rels, k))


def ndcg_at(run: Run, qrels: Qrels, k: int) -> dict:
    """nDCG@k with gain = relevance and a log2(rank + 1) discount."""
    _check_k(k)
    return _evaluate(run, qrels, lambda docs, rels: _ndcg(docs, rels, k))


def mrr(run: Run, qrels: Qrels, k: int | None = None) -> dict:
    """Reciprocal rank of the first relevant document, 0 if none (no cutoff unless k)."""
    if k is not None:
        _check_k(k)
    return _evaluate(run, qrels, lambda docs, rels: _reciprocal_rank(docs, rels, k))
