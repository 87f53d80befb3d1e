"""Benchmark 7b: ideas for a higher SciFact nDCG@10, tried without changing pipelines/.

Uses the index `sourcegate beir` cached under benchmarks/results/scifact/cache and the
cross-encoder pair scores benchmarks.quality saved (missing pairs are scored here and
added). Every variant is evaluated with the pipeline's own metrics (evals.metrics):

- rrf_k: chunk-level hybrid with RRF k in {5, 10, 20, 30, 60, 100}
- doc_fusion: per-list chunk -> document (max score = first occurrence), then RRF of the
  two document lists (instead of fusing chunks and collapsing afterwards)
- chunk_rerank@d: cross-encoder on the top-d fused chunks; a document's score is its best
  chunk's (max-score aggregation, what pipelines.app.beir does)
- doc_rerank@d: cross-encoder on the top-d fused DOCUMENTS, each as title + whole abstract
  (truncated at the model's 512 tokens)
- ..+rrf: RRF of the reranked list and the hybrid list (the reranker as a vote, not a verdict)
- blend: chunk-level RRF k in --blend-ks, rerank depth in --blend-depths, head ordered by
  `pipelines.retrieval.retriever.blend` (w x min-max cross-encoder logit + (1 - w) x min-max fused score)
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
    from pipelines.app.beir import evaluate_systems

    return evaluate_systems(runs, qrels)


def rrf_docs(lists: list[list[str]], k: int = 60) -> list[str]:
    score: dict[str, float] = {}
    for lst in lists:
        for r, d in enumerate(lst, 1):
            score[d] = score.get(d, 0.0) + 1 / (k + r)
    return sorted(score, key=lambda d: -score[d])


def main() -> None:
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
    args = ap.parse_args()

    res = Result(args.name)  # started here so wall_seconds covers the whole run
    from pipelines import config as config_mod
    from pipelines.app.beir import doc_ranking, index_dataset, load_queries
    from pipelines.build.embed import Embedder
    from pipelines.retrieval.rerank import OnnxCrossEncoder
    from pipelines.retrieval.retriever import blend, rrf
    from pipelines.search.embedded import EmbeddedSearcher

    cfg = config_mod.load("config/pipeline.yaml", {"chunking.max_tokens": args.max_tokens})
    folder = index_dataset(cfg, SCIFACT, OUT, progress=False) / "index"  # the index `sourcegate beir` uses
    res["chunking"] = cfg["chunking"]
    searcher = EmbeddedSearcher(folder)
    doc_of = dict(zip(searcher.ids, searcher.column("doc_id")))
    text_of = dict(zip(searcher.ids, searcher.column("text")))
    corpus = {}
    for line in (SCIFACT / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        corpus[str(d["_id"])] = "\n".join(x for x in (d.get("title", "").strip(), d["text"].strip()) if x)
    queries, qrels = load_queries(SCIFACT)
    items = list(queries.items())[: args.queries or None]
    qrels = {q: qrels[q] for q, _ in items}
    embedder = Embedder("sentence-transformers/all-MiniLM-L6-v2")
    scorer = OnnxCrossEncoder()
    if MEMO.exists():
        scorer._memo.update(pickle.loads(MEMO.read_bytes()))
    memo0 = len(scorer._memo)
    new_pair_s: list[float] = []

    def ce(query: str, passages: list[str]) -> list[float]:
        out = []
        for p in passages:
            fresh = (query, p) not in scorer._memo
            t = time.perf_counter()
            out.append(scorer.logit(query, p))
            if fresh:
                new_pair_s.append(time.perf_counter() - t)
        return out

    lists = {}
    for qid, text in items:
        v = embedder.encode_query(text)
        lists[qid] = ([h.chunk_id for h in searcher.bm25(text, DEPTH)], [h.chunk_id for h in searcher.knn(v, DEPTH)])
    log(f"{len(items)} queries retrieved; memo has {memo0} pairs")

    from pipelines.search.base import Hit

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
    hybrid = runs["hybrid_chunks_rrf_k60"]

    for d in [int(x) for x in args.chunk_depths.split(",") if x]:
        name = f"chunk_rerank@{d}"
        runs[name], runs[name + "+rrf"] = {}, {}
        for qid, text in items:
            head = fused_chunks[qid][:d]
            s = ce(text, [text_of[c] for c in head])
            order = [head[i] for i in sorted(range(len(head)), key=lambda i: (-s[i], i))]
            ranked = doc_ranking(order + fused_chunks[qid][d:], doc_of)
            runs[name][qid] = ranked
            runs[name + "+rrf"][qid] = rrf_docs([doc_ranking(order, doc_of), hybrid[qid]])
        log(f"{name} done; new pairs so far {len(new_pair_s)}")
    for k in [int(x) for x in args.blend_ks.split(",") if x]:
        for qid, text in items:
            b, n = lists[qid]
            fused = rrf([[Hit(c, 0) for c in b], [Hit(c, 0) for c in n]], k)
            for d in [int(x) for x in args.blend_depths.split(",") if x]:
                head = fused[:d]
                logits = ce(text, [text_of[c] for c, _ in head])
                for w in [float(x) for x in args.blend_weights.split(",") if x]:
                    order = blend(logits, [s for _, s in head], w)
                    ranked = [head[i][0] for i in order] + [c for c, _ in fused[d:]]
                    runs.setdefault(f"blend_k{k}_d{d}_w{w}", {})[qid] = doc_ranking(ranked, doc_of)
        log(f"blend k={k} done; new pairs so far {len(new_pair_s)}")
        MEMO.write_bytes(pickle.dumps(scorer._memo))
    doc_base = runs["hybrid_docs_rrf_k60"]
    for d in [int(x) for x in args.doc_depths.split(",") if x]:
        name = f"doc_rerank@{d}"
        runs[name], runs[name + "+rrf"] = {}, {}
        for qid, text in items:
            head = doc_base[qid][:d]
            s = ce(text, [corpus[x] for x in head])
            order = [head[i] for i in sorted(range(len(head)), key=lambda i: (-s[i], i))]
            runs[name][qid] = order + doc_base[qid][d:]
            runs[name + "+rrf"][qid] = rrf_docs([order, doc_base[qid]])
        log(f"{name} done; new pairs so far {len(new_pair_s)}")
        MEMO.write_bytes(pickle.dumps(scorer._memo))

    res.data.update(
        queries=len(items),
        candidate_depth=DEPTH,
        memo_pairs_at_start=memo0,
        new_pairs_scored=len(new_pair_s),
        ms_per_new_pair_median=round(float(np.median(new_pair_s)) * 1000, 1) if new_pair_s else None,
        ms_per_new_pair_by_kind="chunk pairs and abstract pairs mixed; abstracts are longer",
    )
    systems = ndcg(runs, qrels)
    halves = {
        "odd": {q: qrels[q] for i, (q, _) in enumerate(items) if i % 2},
        "even": {q: qrels[q] for i, (q, _) in enumerate(items) if not i % 2},
    }
    for name, run in runs.items():
        systems[name]["ndcg@10_folds"] = {
            h: ndcg({name: {q: run[q] for q in part}}, part)[name]["ndcg@10"] for h, part in halves.items()
        }
    res["systems"] = dict(sorted(systems.items(), key=lambda kv: -kv[1]["ndcg@10"]))
    # two-fold selection: the best system on one half, read on the other half
    cross = {}
    for pick, read in (("odd", "even"), ("even", "odd")):
        best = max(systems, key=lambda n: systems[n]["ndcg@10_folds"][pick])
        cross[f"picked_on_{pick}"] = {"system": best, f"ndcg@10_on_{read}": systems[best]["ndcg@10_folds"][read]}
    cross["mean_held_out"] = round(sum(v[k] for v in cross.values() for k in v if k.startswith("ndcg")) / 2, 4)
    res["two_fold_selection"] = cross
    res["peak_rss_mb"] = peak_rss_mb()
    for k, v in res["systems"].items():
        log(f"{k:28s} nDCG@10 {v['ndcg@10']:.4f}  recall@100 {v['recall@100']:.4f}")
    MEMO.write_bytes(pickle.dumps(scorer._memo))
    res.write()


if __name__ == "__main__":
    main()
