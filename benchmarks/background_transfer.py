"""docs/benchmarks/18-users-words.md, fourth round: do the demo's decline thresholds transfer to SciFact and NFCorpus?

    SOURCEGATE_SHARED=../shared python -m benchmarks.background_transfer --out /tmp/transfer \
        --candidates benchmarks/results/signal_candidates.json --background ../shared/datasets/squad2/dev-v2.0.json.gz

Each dataset is indexed like `sourcegate beir` (cached under --out). Its test queries are should-answer, the demo
fit set's off-topic questions should-decline. Two bi-encoder signals are computed for each, needing no reranker:
`cosine_top` (the best cosine over the dataset's chunks) and `cosine_over_background` (that minus the mean of the
question's best background cosines, benchmarks/signal_candidates.py). Each is judged at the threshold the demo fit
set placed (`fit_threshold` in the --candidates result): kept should-answer, declined off-topic, and the AUC.
Nothing is placed or chosen on these datasets.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks._common import RESULTS, machine, uptime
from benchmarks.placement import DATASETS, FIT_SET, dataset_retriever, transfer
from benchmarks.signal_candidates import background_questions, over_background
from sourcegate.artifact_io import read_json, write_json
from sourcegate.evals.evalset import load_evalset
from sourcegate.evals.sweep import roc_auc

SIGNALS = ("cosine_top", "cosine_over_background")


def judged_at(scores: list[float], is_answer: list[bool], threshold: float) -> dict:
    """Kept should-answer and declined should-decline at `threshold` (placement.transfer), and the AUC."""
    moved = transfer(threshold, scores, is_answer)
    s, mask = np.asarray(scores, dtype=float), np.asarray(is_answer, dtype=bool)
    return {
        "threshold": threshold,
        "kept": f"{moved['kept']}/{moved['n_answer']}",
        "declined": f"{moved['declined']}/{moved['n_decline']}",
        "auc": round(roc_auc(s[mask], s[~mask]), 3),
    }


def dataset_signals(name: str, dataset: Path, out: Path, questions: list[str], background: list[str]) -> dict:
    """Both signals of every question over one dataset's index (built or reused under `out`)."""
    from sourcegate.pipelines.config import load

    retriever = dataset_retriever(load("config/pipeline.yaml"), dataset, out / name)
    corpus = np.asarray(retriever.searcher.vectors, np.float32)
    vectors, back = retriever.text_vectors(questions), retriever.text_vectors(background)
    best = (vectors @ corpus.T).max(axis=1)
    return {
        "cosine_top": best.tolist(),
        "cosine_over_background": [over_background(b, back @ v) for b, v in zip(best, vectors)],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="where the datasets' indexes are cached")
    parser.add_argument("--candidates", required=True, help="a benchmarks.signal_candidates result (fit thresholds)")
    parser.add_argument("--background", required=True, help="a SQuAD-format file: the background questions")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--result", default="background_transfer.json")
    args = parser.parse_args(argv)
    from sourcegate.api import load_queries

    thresholds = {s: read_json(args.candidates)["signals"][s]["fit_threshold"] for s in SIGNALS}
    off_topic = [q["question"] for q in load_evalset(FIT_SET) if q.get("kind") == "off_topic"]
    background = background_questions(args.background)
    result = {"machine": machine(), "load_start": uptime(), "candidates": args.candidates, "datasets": {}}
    for name in args.datasets.split(","):
        queries, _ = load_queries(DATASETS[name])
        questions = [*queries.values(), *off_topic]
        is_answer = [True] * len(queries) + [False] * len(off_topic)
        scores = dataset_signals(name, DATASETS[name], Path(args.out), questions, background)
        result["datasets"][name] = {s: judged_at(scores[s], is_answer, thresholds[s]) for s in SIGNALS}
        print(name, json.dumps(result["datasets"][name]), flush=True)
    result["load_end"] = uptime()
    write_json(result, RESULTS / args.result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
