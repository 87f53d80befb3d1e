"""Benchmark 17: the evaluate step at the model's speed (issue #24).

Evaluates one demo night's index version with the whole harness (calibration + precision sets,
then the gate) three ways, interleaved and repeated on one machine:

- `per_question`: the path before #24, one question at a time: the question embedded alone,
  word vectors memoised in the process, sentence vectors encoded again for every question;
- `batched, first night`: `Retriever.retrieve_many` with an empty text-vector cache;
- `batched, next night`: the same with what the previous pass kept (text_vectors.parquet,
  rerank_pairs.parquet): the nightly case of an unchanged corpus.

Each pass starts with the cross-encoder's in-process pair memo emptied, as a new process would.
Every stage of every question is timed (question embedding, each search leg, rerank, each
signal), the per-question signals of the passes are compared, and so are the gate verdicts.

    python -m benchmarks.evaluate_speed --artifacts /tmp/speed/artifacts --version 20261201-210056 --reps 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._common import Result, log, median
from sourcegate.artifact_io.run_folder import KEPT
from sourcegate.pipelines.retrieval.answerability import answerability_signals
from sourcegate.pipelines.retrieval.retriever import Clock, Retriever, effective_query
from sourcegate.pipelines.search.analyzer import STOPWORDS

LEGS = ("bm25", "knn", "best_cosine", "bm25_distribution", "document_frequencies", "chunks")


class TimedSearcher:
    """Forwards the search protocol's single calls and adds each call's seconds to `stages`.

    It has no `hybrid`, so `hybrid_search` makes the protocol's calls one by one: the embedded
    backend's own `hybrid` is exactly those calls (sourcegate/pipelines/search/embedded.py).
    """

    def __init__(self, inner):
        self.inner, self.stages = inner, {}
        for name in LEGS:
            setattr(self, name, self._timed(name))

    def _timed(self, name):
        fn = getattr(self.inner, name)

        def call(*args, **kwargs):
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            self.stages[f"search: {name}"] = self.stages.get(f"search: {name}", 0.0) + time.perf_counter() - t
            return out

        return call


def timed_callable(fn, stages: dict, label: str):
    def call(*args):
        t = time.perf_counter()
        out = fn(*args)
        stages[label] = stages.get(label, 0.0) + time.perf_counter() - t
        return out

    return call


class PerQuestion:
    """The evaluation path before #24, stage by stage (only `retrieve`: the harness feeds it one question at a time)."""

    def __init__(self, retriever: Retriever, searcher: TimedSearcher):
        self.r, self.searcher = retriever, searcher
        self.words: dict[str, np.ndarray] = {}  # the old WordVectors memo: words only, in-process
        self.profile: list[dict] = []

    def word_vectors(self, words: list[str]) -> np.ndarray:
        todo = [w for w in dict.fromkeys(words) if w not in self.words]
        if todo:
            self.words.update(zip(todo, self.r.embedder.encode(todo)))
        return np.stack([self.words[w] for w in words])

    def retrieve(self, question: str, context=()):
        from sourcegate.pipelines.retrieval import combiner as combiner_mod
        from sourcegate.pipelines.retrieval.answerability import TOP_PASSAGES, content_terms
        from sourcegate.pipelines.retrieval.retriever import Retrieval

        r, stages, clock = self.r, {}, Clock()
        self.searcher.stages = stages
        query = effective_query(question, context)
        vector = r.embedder.encode_query(query)
        stages["question embedding"] = clock.lap()
        fused, found = r.fuse(query, vector, content_terms(query, STOPWORDS))
        stages["search: fusion and candidates"] = clock.lap() - sum(
            v for k, v in stages.items() if k.startswith("search")
        )
        result, ranked = r.rerank(query, fused)
        stages["rerank (12 pairs)"] = clock.lap()
        signals = r.signals(query, fused, found, result)
        stages["signals: cosine_top, rerank_top, bm25_top, bm25_z, term_coverage, margin"] = clock.lap()
        words = timed_callable(self.word_vectors, stages, "signals: concept_coverage word vectors")
        sentences = timed_callable(r.embedder.encode, stages, "signals: sentence_cosine sentence vectors")
        top = [c.text for c in fused[:TOP_PASSAGES]]
        n, df = found.distribution.total, found.document_frequencies
        signals.update(answerability_signals(query, vector, top, n, df, STOPWORDS, words, sentences))
        lap = clock.lap()
        stages["signals: answerability text handling"] = (
            lap
            - stages.get("signals: concept_coverage word vectors", 0.0)
            - stages.get("signals: sentence_cosine sentence vectors", 0.0)
        )
        signals[combiner_mod.SIGNAL] = combiner_mod.score(r.combiner, signals) if r.combiner else None
        stages["signals: answerability combiner"] = clock.lap()
        self.profile.append(stages)
        return Retrieval(query, fused, ranked, result is not None, signals, {})


def new_process(scorer) -> None:
    """A new process starts with no cross-encoder pairs memoised or kept (OnnxCrossEncoder's)."""
    for attr in ("_memo", "_kept"):
        getattr(scorer, attr, {}).clear()
    scorer.computed = 0


def one_pass(kind: str, cfg: dict, searcher, embedder, scorer, out: Path, kept_from: Path | None) -> dict:
    from sourcegate.api import judging
    from sourcegate.evals.harness import evaluate, gate_for_dir

    timed = TimedSearcher(searcher)
    retriever = Retriever.from_config(timed, embedder, scorer, cfg)
    subject = PerQuestion(retriever, timed) if kind == "per_question" else retriever
    new_process(scorer)
    out.mkdir(parents=True, exist_ok=True)
    chunks = Path(cfg.artifacts) / "runs" / searcher.folder.parent.name / "chunks.valid.parquet"
    if not chunks.exists():
        chunks = chunks.with_name("chunks.parquet")
    c, t = time.process_time(), time.perf_counter()
    kept = {name: kept_from / name for name in KEPT} if kept_from else None  # the first pass's, in this process
    stats = evaluate(subject, chunks, judging(cfg), out, kept_from=kept)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    gate = gate_for_dir(judging(cfg), out, {}, out / "check_scorings.jsonl")  # this pass's looks only
    return {
        "kind": kind,
        "evaluate_s": round(wall, 2),
        "evaluate_cpu_s": round(cpu, 2),
        "questions": stats["questions"],
        "kept": stats["kept"],
        "gate_passed": gate["passed"],
        "gate_reasons": gate["reasons"],
        "profile": getattr(subject, "profile", None),
        "folder": str(out),
    }


def signals_of(folder: str) -> dict:
    rows = [json.loads(line) for line in Path(folder, "questions.jsonl").read_text().splitlines()]
    return {(r["set"], r["id"]): r["signals"] for r in rows}


def largest_difference(a: dict, b: dict) -> float:
    """The largest absolute difference of any numeric signal of any question (inf when keys or a non-number differ)."""
    if a.keys() != b.keys():
        return float("inf")
    worst = 0.0
    for key in a:
        if a[key].keys() != b[key].keys():
            return float("inf")
        for name, x in a[key].items():
            y = b[key][name]
            if isinstance(x, float) and isinstance(y, float):
                worst = max(worst, abs(x - y))
            elif x != y:
                return float("inf")
    return worst


def profile_table(profile: list[dict]) -> dict:
    stages = sorted({k for p in profile for k in p})
    total = sum(sum(p.values()) for p in profile)
    return {
        s: {
            "median_ms": round(median([p.get(s, 0.0) for p in profile]) * 1000, 2),
            "mean_ms": round(float(np.mean([p.get(s, 0.0) for p in profile])) * 1000, 2),
            "share": round(sum(p.get(s, 0.0) for p in profile) / total, 3),
        }
        for s in stages
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", required=True, help="artifacts folder of a demo night (`sourcegate run`)")
    ap.add_argument("--version", required=True, help="the index version (run id) to evaluate")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--name", default="evaluate_speed")
    args = ap.parse_args()

    from sourcegate.api import get_embedder, open_store, scorer_for
    from sourcegate.pipelines import config

    cfg = config.load(Path("config/pipeline.yaml"), {"artifacts": args.artifacts})
    searcher = open_store(cfg).open(args.version)
    embedder = get_embedder(cfg.embedding)
    scorer = scorer_for(cfg.reranker.kind, cfg.reranker.model_path)
    res = Result(args.name, version=args.version, backend=cfg.embedding.backend, passes=[])
    with tempfile.TemporaryDirectory(prefix="sgbench-evaluate-") as tmp:
        for rep in range(args.reps):
            first = Path(tmp) / f"{rep}-first"
            for kind, out, source in (
                ("per_question", Path(tmp) / f"{rep}-old", None),
                ("batched, first night", first, None),
                ("batched, next night", Path(tmp) / f"{rep}-next", first),
            ):
                log(f"rep {rep}: {kind}")
                p = one_pass(kind, cfg, searcher, embedder, scorer, out, source)
                p["rep"] = rep
                log(f"rep {rep}: {kind}: evaluate {p['evaluate_s']} s, gate passed {p['gate_passed']}")
                res["passes"].append(p)
            old, *new = [p for p in res["passes"] if p["rep"] == rep]
            for p in new:
                p["signals_largest_difference_vs_per_question"] = largest_difference(
                    signals_of(old["folder"]), signals_of(p["folder"])
                )
                p["ratio_vs_per_question"] = round(p["evaluate_s"] / old["evaluate_s"], 3)
                p["cpu_ratio_vs_per_question"] = round(p["evaluate_cpu_s"] / old["evaluate_cpu_s"], 3)
                p["same_gate_verdict"] = (p["gate_passed"], p["gate_reasons"]) == (
                    old["gate_passed"],
                    old["gate_reasons"],
                )
            old["profile_table"] = profile_table(old.pop("profile"))
            for p in new:
                p.pop("profile")
            res.write()


if __name__ == "__main__":
    main()
