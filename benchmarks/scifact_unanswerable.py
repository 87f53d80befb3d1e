"""SciFact in-domain unanswerables: a BEIR folder whose held-out queries have lost their answers.

A seeded random subset of the judged test queries becomes should-decline; every document
judged relevant to any of them is removed from the corpus (unless it is also relevant to a
kept query: then the kept query would lose its answer too, so the decline query is dropped
instead of being kept with its answer still present). The remaining queries, with their
relevant documents untouched, are should-answer. These are the hard case for decline
signals: questions in the corpus's own domain whose answer has been taken out.

    python -m benchmarks.scifact_unanswerable --out /tmp/scifact-unans [--n 100] [--seed 14]
        [--answers 100 --neighbours 5 --distractors 300]   # a slice, for a machine without the CPU
    sourcegate beir /tmp/scifact-unans --decline /tmp/scifact-unans/decline.jsonl --out DIR

Writes corpus.jsonl, queries.jsonl, qrels/test.tsv (kept queries only), decline.jsonl (the
eval-set format) and split.json (ids and counts). The data is not shipped, only this builder.

A slice (`--answers`) keeps a seeded subset of the should-answer queries, and as corpus only
their judged documents, every query's (answer and decline alike) top `--neighbours` BM25
documents of the reduced corpus, and `--distractors` random others: the documents nearest
each question stay, so a decline query still meets its closest in-domain distractors, but
the rest of the corpus is thinner than in the full set (decline signals can only look better
on a slice than on the full corpus; say which one a number comes from).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

from benchmarks._common import SCIFACT
from sourcegate.api import load_queries
from sourcegate.pipelines.search.bm25 import BM25Index, tokenize


def split_queries(qrels: dict[str, dict[str, int]], n: int, seed: int) -> tuple[list[str], list[str]]:
    """(decline ids, answer ids): a seeded sample of `n` decline candidates; a candidate sharing
    a relevant document with a kept query is returned to the answer side."""
    ids = sorted(qrels)
    picked = set(random.Random(seed).sample(ids, n))
    kept_docs = {d for q in ids if q not in picked for d in qrels[q]}
    decline = sorted(q for q in picked if not kept_docs & set(qrels[q]))
    answer = sorted(q for q in ids if q not in decline)
    return decline, answer


def slice_documents(
    docs: dict[str, str], queries: list[str], judged: set[str], neighbours: int, distractors: int, seed: int
) -> set[str]:
    """Judged documents + each query's top BM25 documents + seeded random distractors."""
    ids = sorted(docs)
    index = BM25Index.build([tokenize(docs[d]) for d in ids])
    keep = set(judged)
    for q in queries:
        scores = index.scores(q)
        keep.update(ids[i] for i in np.argsort(-scores, kind="stable")[:neighbours])
    rest = sorted(set(ids) - keep)
    keep.update(random.Random(seed).sample(rest, min(distractors, len(rest))))
    return keep


def build(
    source: Path, out: Path, n: int, seed: int, answers: int | None = None, neighbours: int = 5, distractors: int = 300
) -> dict:
    queries, qrels = load_queries(source)
    decline, answer = split_queries(qrels, n, seed)
    if answers is not None:
        answer = sorted(random.Random(seed + 1).sample(answer, min(answers, len(answer))))
    removed = {d for q in decline for d in qrels[q]}
    lines = {}
    with (source / "corpus.jsonl").open(encoding="utf-8") as src:
        for line in src:
            if line.strip() and (doc := json.loads(line))["_id"] not in removed:
                lines[str(doc["_id"])] = (line if line.endswith("\n") else line + "\n", f"{doc['title']} {doc['text']}")
    keep = set(lines)
    if answers is not None:
        judged = {d for q in answer for d in qrels[q]}
        texts = {d: t for d, (_, t) in lines.items()}
        keep = slice_documents(texts, [queries[q] for q in answer + decline], judged, neighbours, distractors, seed)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as dst:
        for d in sorted(keep, key=lambda d: (len(d), d)):
            dst.write(lines[d][0])
    kept_docs = len(keep)
    with (out / "queries.jsonl").open("w", encoding="utf-8") as fh:
        for q in answer:
            fh.write(json.dumps({"_id": q, "text": queries[q]}) + "\n")
    with (out / "qrels" / "test.tsv").open("w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for q in answer:
            for d, s in sorted(qrels[q].items()):
                fh.write(f"{q}\t{d}\t{s}\n")
    with (out / "decline.jsonl").open("w", encoding="utf-8") as fh:
        for q in decline:
            item = {"id": f"u-{q}", "question": queries[q], "label": "decline", "expected": []}
            fh.write(json.dumps({**item, "context": [], "kind": "unanswerable"}) + "\n")
    split = {
        "source": str(source),
        "seed": seed,
        "sampled": n,
        "decline": decline,
        "answer_count": len(answer),
        "decline_count": len(decline),
        "removed_documents": len(removed),
        "slice": None
        if answers is None
        else {"answers": answers, "neighbours": neighbours, "distractors": distractors},
        "kept_documents": kept_docs,
    }
    (out / "split.json").write_text(json.dumps(split, indent=1) + "\n")
    return split


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=SCIFACT)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--n", type=int, default=100, help="decline candidates sampled from the judged test queries")
    p.add_argument("--seed", type=int, default=14)
    p.add_argument(
        "--answers", type=int, help="slice: keep this many should-answer queries (default: all, full corpus)"
    )
    p.add_argument("--neighbours", type=int, default=5, help="slice: top BM25 documents kept per query")
    p.add_argument("--distractors", type=int, default=300, help="slice: random other documents kept")
    args = p.parse_args()
    split = build(args.source, args.out, args.n, args.seed, args.answers, args.neighbours, args.distractors)
    print({k: v for k, v in split.items() if k != "decline"})


if __name__ == "__main__":
    main()
