"""Run the labelled sets through retrieval and produce the eval records.

Only talks to the index through a Retriever (the search interface), and to the corpus
labels through the chunk table, so it serves every backend unchanged.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

from sourcegate.evals.answer_modes import mode_for
from sourcegate.evals.evalset import relevant
from sourcegate.evals.metrics import first_relevant_rank

log = logging.getLogger(__name__)


BATCH = 64  # questions per retrieve_many call: the passes fill up, memory stays a batch's


def retrievals(retriever, items: list[dict], batch: int = BATCH):
    """Each item's retrieval, in order; a retriever with `retrieve_many` gets the questions in
    batches (the same retrievals and signals as one at a time, in fewer model passes)."""
    many = getattr(retriever, "retrieve_many", None)
    if many is None:
        for it in items:
            yield retriever.retrieve(it["question"], it.get("context", []))
        return
    for start in range(0, len(items), batch):
        yield from many([(it["question"], it.get("context", [])) for it in items[start : start + batch]])


def run_questions(
    retriever, items: Iterable[dict], *, progress: bool = False, stages: Counter | None = None
) -> list[dict]:
    """One record per question: signals + the fused and final candidate ids. `stages` adds up the seconds each
    retrieval stage took (embed, search, rerank, signals, answer): where a night's evaluation went."""
    items = list(items)
    found = retrievals(retriever, items)
    if progress:
        from tqdm import tqdm

        found = tqdm(found, total=len(items), desc="evaluate", unit="q")
    out = []
    for it, r in zip(items, found):
        if stages is not None:
            stages.update(r.timings)
        out.append(
            {
                "id": it["id"],
                "question": it["question"],
                "label": it["label"],
                "kind": it.get("kind", "single"),
                "context": it.get("context", []),
                "expected": it.get("expected", []),
                "signals": r.signals,
                "reranked": r.reranked,
                "fused": [c.chunk_id for c in r.fused],
                "ranked": [c.chunk_id for c in r.ranked],
                "top": [
                    {
                        "chunk_id": c.chunk_id,
                        "doc_id": c.doc_id,
                        "section_id": c.section_id,
                        "rerank_probability": c.rerank_probability,
                        "fused_score": c.fused_score,
                    }
                    for c in r.ranked[:3]
                ],
            }
        )
    return out


def qrels_for(items: list[dict], chunks: list[dict]) -> dict[str, dict[str, int]]:
    """Relevant chunk ids per question, from the labels alone (never from a ranker)."""
    return {
        it["id"]: {c["chunk_id"]: 1 for c in chunks if relevant(it["expected"], c["doc_id"], c["section_id"])}
        for it in items
    }


def shortlist_recall(records: list[dict], chunks_by_id: dict[str, dict], depth: int) -> dict:
    """Share of should-answer questions whose labelled article is among the reranker's candidates."""
    answer = [r for r in records if r["label"] == "answer"]
    missed = []
    for r in answer:
        docs = {e.split("#")[0] for e in r["expected"]}
        if not any(chunks_by_id[c]["doc_id"] in docs for c in r["fused"][:depth]):
            missed.append(r["id"])
    n = len(answer)
    return {"depth": depth, "n": n, "recall": (n - len(missed)) / n if n else None, "missed": missed}


def with_source_rank(lost: list[dict], records: list[dict], qrels: dict[str, dict[str, int]]) -> list[dict]:
    """Each lost should-answer question with `source_rank`: where its labelled passage stood in the final
    order (None: not among the candidates). It says whose miss it was: a source the signal saw at rank 1
    and scored low is the signal's; a source ranked deep, or not retrieved, is retrieval's."""
    ranked = {r["id"]: r["ranked"] for r in records}
    return [{**q, "source_rank": first_relevant_rank(ranked[q["id"]], qrels.get(q["id"], {}))} for q in lost]


def question_rows(set_name: str, records: list[dict], qrels: dict[str, dict[str, int]], answer) -> list[dict]:
    """Per-question records of one run (questions.jsonl): what `sourcegate diff` joins across runs.

    `labelled_rank` is the 1-based rank of the first labelled passage in the final order
    (None: not retrieved, or the question has no label to find).
    """
    signal = answer.signal
    rows = []
    for r in records:
        score = r["signals"].get(signal)
        rows.append(
            {
                "set": set_name,
                "id": r["id"],
                "kind": r["kind"],
                "label": r["label"],
                "question": r["question"],
                "gating_signal": signal,
                "gating_score": score,
                "mode": mode_for(r["signals"], answer)[0],
                "labelled_rank": first_relevant_rank(r["ranked"], qrels.get(r["id"], {})),
                "signals": r["signals"],
            }
        )
    return rows
