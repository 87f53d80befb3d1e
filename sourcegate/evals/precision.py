"""Reranker precision evals: the fused candidate order against the reranked one,
overall and per question kind, with every question the reranker made worse.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sourcegate.artifact_io import jsonable
from sourcegate.evals.metrics import first_relevant_rank, mrr, ndcg_at, precision_at, recall_at

SYSTEMS = ("fused", "reranked")


def _metric_fns(ks: Sequence[int]) -> dict[str, Any]:
    """Metric name -> fn(run, qrels) returning per-query values."""
    fns = {f"p@{k}": (lambda run, qrels, k=k: precision_at(run, qrels, k)) for k in ks}
    fns["ndcg@10"] = lambda run, qrels: ndcg_at(run, qrels, 10)
    fns["recall@5"] = lambda run, qrels: recall_at(run, qrels, 5)
    fns["mrr"] = lambda run, qrels: mrr(run, qrels)
    return fns


def _per_query(run: Mapping[str, Sequence[str]], qrels: Mapping, fns: Mapping) -> dict[str, dict[str, float]]:
    return {name: fn(run, qrels)["per_query"] for name, fn in fns.items()}


def _means(per_query: Mapping[str, Mapping[str, float]], qids: Iterable[str]) -> dict[str, float]:
    qids = list(qids)
    return {name: sum(values[q] for q in qids) / len(qids) for name, values in per_query.items()}


def _compare(values: Mapping[str, Mapping[str, Mapping[str, float]]], qids: list[str]) -> dict[str, Any]:
    fused, reranked = (_means(values[s], qids) for s in SYSTEMS)
    return {
        "n": len(qids),
        "fused": fused,
        "reranked": reranked,
        "delta": {name: reranked[name] - fused[name] for name in fused},
    }


def _loss(item: Mapping, fused_rank: int | None, reranked_rank: int | None) -> dict[str, Any]:
    return {
        "id": item["id"],
        "kind": item.get("kind"),
        "question": item.get("question", ""),
        "fused_rank_of_first_relevant": fused_rank,
        "reranked_rank_of_first_relevant": reranked_rank,
    }


def precision_eval(
    items: Sequence[Mapping],
    fused: Mapping[str, Sequence[str]],
    reranked: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, int]],
    ks: Sequence[int] = (1, 3, 5),
) -> dict[str, Any]:
    """precision.json: metrics before/after reranking, per kind, and the losses.

    Items without a relevant document in qrels are left out (listed in
    `skipped`): precision means nothing for them. A question missing from a
    run counts as retrieving nothing.
    """
    judged = [it for it in items if any(rel > 0 for rel in qrels.get(it["id"], {}).values())]
    judged_ids = {it["id"] for it in judged}
    skipped = [it["id"] for it in items if it["id"] not in judged_ids]
    subset = {it["id"]: qrels[it["id"]] for it in judged}
    fns = _metric_fns(ks)
    values = {"fused": _per_query(fused, subset, fns), "reranked": _per_query(reranked, subset, fns)}

    kinds: dict[str, list[str]] = {}
    for it in judged:
        kinds.setdefault(str(it.get("kind")), []).append(it["id"])

    losses, wins, ties = [], 0, 0
    per_question = {}
    for it in judged:
        qid = it["id"]
        before = first_relevant_rank(fused.get(qid, ()), subset[qid])
        after = first_relevant_rank(reranked.get(qid, ()), subset[qid])
        per_question[qid] = {"kind": it.get("kind"), "fused_rank": before, "reranked_rank": after}
        rr_before, rr_after = values["fused"]["mrr"][qid], values["reranked"]["mrr"][qid]
        # p@1 can only drop if the reciprocal rank drops, so one test covers both.
        if rr_after < rr_before:
            losses.append(_loss(it, before, after))
        elif rr_after > rr_before:
            wins += 1
        else:
            ties += 1

    qids = [it["id"] for it in judged]
    return jsonable(
        {
            "ks": list(ks),
            "metrics": list(fns),
            "n": len(qids),
            "overall": _compare(values, qids) if qids else None,
            "by_kind": {kind: _compare(values, ids) for kind, ids in sorted(kinds.items())},
            "losses": losses,
            "wins": wins,
            "ties": ties,
            "skipped": skipped,
            # rank of the first relevant passage per question: what the regression check pairs
            "per_question": per_question,
        }
    )
