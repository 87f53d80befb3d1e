"""Benchmark 7b: ideas for a higher SciFact nDCG@10, tried without changing sourcegate/pipelines/.

Uses the index `sourcegate beir` cached under benchmarks/results/scifact/cache and the
cross-encoder pair scores benchmarks.quality saved (missing pairs are scored here and
added). Every variant is evaluated with the pipeline's own metrics (sourcegate.evals.metrics):

- rrf_k: chunk-level hybrid with RRF k in {5, 10, 20, 30, 60, 100}
- doc_fusion: per-list chunk -> document (max score = first occurrence), then RRF of the
  two document lists (instead of fusing chunks and collapsing afterwards)
- chunk_rerank@d: cross-encoder on the top-d fused chunks; a document's score is its best
  chunk's (max-score aggregation, what sourcegate.pipelines.app.beir does)
- doc_rerank@d: cross-encoder on the top-d fused DOCUMENTS, each as title + whole abstract
  (truncated at the model's 512 tokens)
- ..+rrf: RRF of the reranked list and the hybrid list (the reranker as a vote, not a verdict)
- blend: chunk-level RRF k in --blend-ks, rerank depth in --blend-depths, head ordered by
  `sourcegate.pipelines.retrieval.retriever.blend` (w x min-max cross-encoder logit + (1 - w) x min-max fused score)
  for w in --blend-weights; w = 1 is the plain cross-encoder order

- chunking: --max-tokens picks the index (`chunking.max_tokens`; built, cached and shared with
  `sourcegate beir` if missing) — e.g. 512 makes most abstracts one chunk (the bi-encoder still
  reads only its first 256 tokens; BM25 and the cross-encoder read the whole chunk)

Every system also gets nDCG@10 on the odd- and even-numbered queries (`folds`): a setting
picked on one half and read on the other is an honest estimate; the best-of-all on all 300
is not (SciFact has no train split here).

    .venv/bin/python -m benchmarks.quality_ideas [--chunk-depths 12,20,30,50] [--doc-depths 10,20,30]
        [--blend-ks 5,10,20,60] [--blend-depths 12,20,30,50] [--blend-weights 0.5,0.6,0.7,0.8,0.9,1.0]
        [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import json
import pickle
import time

import numpy as np

from benchmarks._common import SCIFACT, Result, log, peak_rss_mb
from benchmarks.quality import MEMO, OUT

DEPTH = 100


def ndcg(runs: dict, qrels) -> dict:
    from sourcegate.api import evaluate_systems

    return evaluate_systems(runs, qrels)


def rrf_docs(lists: list[list[str]], k: int = 60) -> list[str]:
    score: dict[str, float] = {}
    for lst in lists:
        for r, d in enumerate(lst, 1):
            score[d] = score.get(d, 0.0) + 1 / (k + r)
    return sorted(score, key=lambda d: -score[d])


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk-depths", default="12,20,30,50")
    ap.add_argument("--doc-depths", default="10,20,30")
    ap.add_argument("--blend-ks", default="")
    ap.add_argument("--blend-depths", default="12,20,30,50")
    ap.add_argument("--blend-weights", default="0.5,0.6,0.7,0.8,0.9,1.0")
    ap.add_argument(
        "--max-tokens", type=int, default=256, help="chunking.max_tokens of the index to use (built if missing)"
    )
    ap.add_argument("--queries", type=int, default=0, help="first N queries only (0 = all 300)")
    ap.add_argument("--name", default="quality_ideas", help="result file name (benchmarks/results/<name>.json)")
    return ap.parse_args()


def ints(csv: str) -> list[int]:
    return [int(x) for x in csv.split(",") if x]


class Memoised:
    """The cross-encoder's logits with its pair memo kept across runs (MEMO), timing only new pairs."""

    def __init__(self):
        from sourcegate.pipelines.retrieval.rerank import OnnxCrossEncoder

        self.scorer = OnnxCrossEncoder()
        if MEMO.exists():
            self.scorer._memo.update(pickle.loads(MEMO.read_bytes()))
        self.at_start = len(self.scorer._memo)
        self.new_pair_s: list[float] = []

    def __call__(self, query: str, passages: list[str]) -> list[float]:
        out = []
        for p in passages:
            fresh = (query, p) not in self.scorer._memo
            t = time.perf_counter()
            out.append(self.scorer.logit(query, p))
            if fresh:
                self.new_pair_s.append(time.perf_counter() - t)
        return out

    def save(self) -> None:
        MEMO.write_bytes(pickle.dumps(self.scorer._memo))


def scifact_corpus() -> dict[str, str]:
    corpus = {}
    for line in (SCIFACT / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        corpus[str(d["_id"])] = "\n".join(x for x in (d.get("title", "").strip(), d["text"].strip()) if x)
    return corpus


def fusion_runs(lists: dict, doc_of: dict) -> tuple[dict, dict]:
    """BM25, dense and their RRF fusions (chunk- and document-level); and the k=60 fused chunk lists."""
    from sourcegate.api import doc_ranking
    from sourcegate.pipelines.retrieval.retriever import rrf
    from sourcegate.pipelines.search.base import Hit

    runs: dict[str, dict[str, list[str]]] = {}
    fused_chunks = {}
    for k in (5, 10, 20, 30, 60, 100):
        name = f"hybrid_chunks_rrf_k{k}"
        runs[name] = {}
        for qid, (b, n) in lists.items():
            f = [c for c, _ in rrf([[Hit(c, 0) for c in b], [Hit(c, 0) for c in n]], k)]
            runs[name][qid] = doc_ranking(f, doc_of)
            if k == 60:
                fused_chunks[qid] = f
    for k in (10, 60):
        runs[f"hybrid_docs_rrf_k{k}"] = {
            qid: rrf_docs([doc_ranking(b, doc_of), doc_ranking(n, doc_of)], k) for qid, (b, n) in lists.items()
        }
    runs["bm25"] = {qid: doc_ranking(b, doc_of) for qid, (b, n) in lists.items()}
    runs["dense"] = {qid: doc_ranking(n, doc_of) for qid, (b, n) in lists.items()}
    return runs, fused_chunks


def chunk_rerank_runs(runs, items, fused_chunks, text_of, doc_of, ce, depths) -> None:
    from sourcegate.api import doc_ranking

    hybrid = runs["hybrid_chunks_rrf_k60"]
    for d in depths:
        name = f"chunk_rerank@{d}"
        runs[name], runs[name + "+rrf"] = {}, {}
        for qid, text in items:
            head = fused_chunks[qid][:d]
            s = ce(text, [text_of[c] for c in head])
            order = [head[i] for i in sorted(range(len(head)), key=lambda i: (-s[i], i))]
            runs[name][qid] = doc_ranking(order + fused_chunks[qid][d:], doc_of)
            runs[name + "+rrf"][qid] = rrf_docs([doc_ranking(order, doc_of), hybrid[qid]])
        log(f"{name} done; new pairs so far {len(ce.new_pair_s)}")


def blend_runs(runs, items, lists, text_of, doc_of, ce, args) -> None:
    from sourcegate.api import doc_ranking
    from sourcegate.pipelines.retrieval.retriever import blend, rrf
    from sourcegate.pipelines.search.base import Hit

    for k in ints(args.blend_ks):
        for qid, text in items:
            b, n = lists[qid]
            fused = rrf([[Hit(c, 0) for c in b], [Hit(c, 0) for c in n]], k)
            for d in ints(args.blend_depths):
                head = fused[:d]
                logits = ce(text, [text_of[c] for c, _ in head])
                for w in [float(x) for x in args.blend_weights.split(",") if x]:
                    order = blend(logits, [s for _, s in head], w)
                    ranked = [head[i][0] for i in order] + [c for c, _ in fused[d:]]
                    runs.setdefault(f"blend_k{k}_d{d}_w{w}", {})[qid] = doc_ranking(ranked, doc_of)
        log(f"blend k={k} done; new pairs so far {len(ce.new_pair_s)}")
        ce.save()


def doc_rerank_runs(runs, items, corpus, ce, depths) -> None:
    doc_base = runs["hybrid_docs_rrf_k60"]
    for d in depths:
        name = f"doc_rerank@{d}"
        runs[name], runs[name + "+rrf"] = {}, {}
        for qid, text in items:
            head = doc_base[qid][:d]
            s = ce(text, [corpus[x] for x in head])
            order = [head[i] for i in sorted(range(len(head)), key=lambda i: (-s[i], i))]
            runs[name][qid] = order + doc_base[qid][d:]
            runs[name + "+rrf"][qid] = rrf_docs([order, doc_base[qid]])
        log(f"{name} done; new pairs so far {len(ce.new_pair_s)}")
        ce.save()


def score_systems(runs: dict, qrels: dict, items: list) -> tuple[dict, dict]:
    """nDCG per system on all queries and on two halves; the best system picked on one half, read on the other."""
    systems = ndcg(runs, qrels)
    halves = {
        "odd": {q: qrels[q] for i, (q, _) in enumerate(items) if i % 2},
        "even": {q: qrels[q] for i, (q, _) in enumerate(items) if not i % 2},
    }
    for name, run in runs.items():
        systems[name]["ndcg@10_folds"] = {
            h: ndcg({name: {q: run[q] for q in part}}, part)[name]["ndcg@10"] for h, part in halves.items()
        }
    cross = {}
    for pick, read in (("odd", "even"), ("even", "odd")):
        best = max(systems, key=lambda n: systems[n]["ndcg@10_folds"][pick])
        cross[f"picked_on_{pick}"] = {"system": best, f"ndcg@10_on_{read}": systems[best]["ndcg@10_folds"][read]}
    cross["mean_held_out"] = round(sum(v[k] for v in cross.values() for k in v if k.startswith("ndcg")) / 2, 4)
    return dict(sorted(systems.items(), key=lambda kv: -kv[1]["ndcg@10"])), cross


def main() -> None:
    args = parse_args()
    res = Result(args.name)  # started here so wall_seconds covers the whole run
    from sourcegate.api import index_dataset, load_queries
    from sourcegate.pipelines import config as config_mod
    from sourcegate.pipelines.build.embed import Embedder
    from sourcegate.pipelines.search.embedded import EmbeddedSearcher

    cfg = config_mod.load("config/pipeline.yaml", {"chunking.max_tokens": args.max_tokens})
    folder = index_dataset(cfg, SCIFACT, OUT, progress=False) / "index"  # the index `sourcegate beir` uses
    res["chunking"] = cfg.chunking.model_dump()
    searcher = EmbeddedSearcher(folder)
    doc_of = dict(zip(searcher.ids, searcher.column("doc_id")))
    text_of = dict(zip(searcher.ids, searcher.column("text")))
    queries, qrels = load_queries(SCIFACT)
    items = list(queries.items())[: args.queries or None]
    qrels = {q: qrels[q] for q, _ in items}
    embedder = Embedder("sentence-transformers/all-MiniLM-L6-v2")
    ce = Memoised()
    lists = {}
    for qid, text in items:
        v = embedder.encode_query(text)
        lists[qid] = ([h.chunk_id for h in searcher.bm25(text, DEPTH)], [h.chunk_id for h in searcher.knn(v, DEPTH)])
    log(f"{len(items)} queries retrieved; memo has {ce.at_start} pairs")

    runs, fused_chunks = fusion_runs(lists, doc_of)
    chunk_rerank_runs(runs, items, fused_chunks, text_of, doc_of, ce, ints(args.chunk_depths))
    blend_runs(runs, items, lists, text_of, doc_of, ce, args)
    doc_rerank_runs(runs, items, scifact_corpus(), ce, ints(args.doc_depths))

    res.data.update(
        queries=len(items),
        candidate_depth=DEPTH,
        memo_pairs_at_start=ce.at_start,
        new_pairs_scored=len(ce.new_pair_s),
        ms_per_new_pair_median=round(float(np.median(ce.new_pair_s)) * 1000, 1) if ce.new_pair_s else None,
        ms_per_new_pair_by_kind="chunk pairs and abstract pairs mixed; abstracts are longer",
    )
    res["systems"], res["two_fold_selection"] = score_systems(runs, qrels, items)
    res["peak_rss_mb"] = peak_rss_mb()
    for k, v in res["systems"].items():
        log(f"{k:28s} nDCG@10 {v['ndcg@10']:.4f}  recall@100 {v['recall@100']:.4f}")
    ce.save()
    res.write()


if __name__ == "__main__":
    main()
