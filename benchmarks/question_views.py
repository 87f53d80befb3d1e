"""Multi-query fusion: does retrieving with the question reduced to its content words, fused with the
question as written, lift retrieval on the words users write? (issue #30, item 4)

    python -m benchmarks.question_views --index artifacts/runs/RUN \
        --questions config/evals/riders.jsonl config/evals/precision.jsonl --out FILE.json

For every should-answer question of each set: the rank of its first labelled passage in the final order
(hybrid search, fusion and rerank at the shipped settings) with the question as written, and with two views
fused — as written, and its content words alone (the query analyser's stopwords dropped) — by RRF over each
view's fused list at the shipped `rrf_k`; the cross-encoder then reranks the fused head against the question as
written, so only the candidates change. Reported per set: recall@5 (a labelled passage in the top 5) and p@1,
and the questions whose rank moved. Measured only: nothing ships from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from benchmarks._common import finished, machine, uptime
from sourcegate.api import retriever_for
from sourcegate.evals.evalset import load_evalset, relevant
from sourcegate.pipelines import config
from sourcegate.pipelines.retrieval.retriever import content_terms, rrf
from sourcegate.pipelines.search.analyzer import STOPWORDS
from sourcegate.pipelines.search.base import Hit
from sourcegate.pipelines.search.embedded import open_run_folder


def content_view(question: str) -> str:
    """The question reduced to its content words (the query analyser's stopwords dropped)."""
    return " ".join(content_terms(question, STOPWORDS))


def views_of(question: str) -> list[str]:
    """The question as written, and its content words when they differ from it."""
    content = content_view(question)
    return [question] + ([content] if content and content != question.lower() else [])


def retriever_on(run: Path):
    """The shipped config's retriever over an embedded run folder."""
    cfg = config.load("config/pipeline.yaml", {"artifacts": str(run.parent.parent)})
    return retriever_for(cfg, open_run_folder(run))[0]


def final_order(retriever, question: str, views: list[str]) -> list:
    """The reranked order over the views' fused lists, RRF-fused when there is more than one."""
    lists = [retriever.fuse(v, retriever.text_vectors([v])[0])[0] for v in views]
    merged = lists[0]
    if len(lists) > 1:
        by_id = {c.chunk_id: c for fused in reversed(lists) for c in fused}  # the written view's fields win
        order = rrf([[Hit(c.chunk_id, c.fused_score) for c in fused] for fused in lists], retriever.settings.rrf_k)
        merged = [
            dataclasses.replace(by_id[cid], fused_rank=rank, fused_score=score)
            for rank, (cid, score) in enumerate(order, 1)
        ]
    return retriever.rerank(question, merged)[1]


def labelled_rank(order: list, expected: list[str]) -> int | None:
    return next((i for i, c in enumerate(order, 1) if relevant(expected, c.doc_id, c.section_id)), None)


def measure(retriever, items: list[dict]) -> dict:
    rows = []
    for it in items:
        written = labelled_rank(final_order(retriever, it["question"], [it["question"]]), it["expected"])
        fused = labelled_rank(final_order(retriever, it["question"], views_of(it["question"])), it["expected"])
        rows.append({"id": it["id"], "written": written, "views": fused})

    def rate(key: str, k: int) -> float:
        return sum(r[key] is not None and r[key] <= k for r in rows) / len(rows)

    return {
        "n": len(rows),
        **{f"{key}_recall@5": rate(key, 5) for key in ("written", "views")},
        **{f"{key}_p@1": rate(key, 1) for key in ("written", "views")},
        "moved": [r for r in rows if r["written"] != r["views"]],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True, help="an embedded run folder")
    parser.add_argument("--questions", nargs="+", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    run = Path(args.index)
    retriever = retriever_on(run)
    result = {
        "machine": machine(),
        "load_start": uptime(),
        "index": str(run),
        "rrf_k": retriever.settings.rrf_k,
        "sets": {},
    }
    for path in args.questions:
        items = [it for it in load_evalset(path) if it["label"] == "answer" and not it.get("context")]
        start = time.perf_counter()
        result["sets"][Path(path).stem] = {**measure(retriever, items), "seconds": time.perf_counter() - start}
        summary = {k: v for k, v in result["sets"][Path(path).stem].items() if k != "moved"}
        print(Path(path).stem, json.dumps(summary))
    return finished(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
