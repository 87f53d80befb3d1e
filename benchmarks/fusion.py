"""Benchmark 12: fusion settings (RRF k, list depth, rerank depth, rerank weight) chosen across
the demo, SciFact and NFCorpus by one procedure, stated before the numbers were read.

Data. SciFact and NFCorpus (BEIR test splits) are indexed through `sourcegate beir`'s own path
(`sourcegate.pipelines.app.beir.index_dataset`, embedded backend) under `--cache/<name>`, so
`sourcegate beir <dataset> --out <cache>/<name>` reuses the same index. The demo is built with
`sourcegate.pipelines.app.run.build` under `--cache/demo` and read through its labelled precision set
(config/evals/precision.jsonl, the set the gate holds), with the gate's arithmetic
(`sourcegate.evals.precision.precision_eval`, chunk-level labels from `sourcegate.evals.evaluate.qrels_for`).

Caches (under --cache, reused by every later run): per dataset the 100-deep BM25 and kNN chunk
lists of each query (`fusion-lists-<version>.json`, one `hybrid_search` per query) and the
cross-encoder logit of every (query, passage) pair ever scored (`pair-logits.pkl`; the ONNX
cross-encoder scores one pair per session run, so a pair's logit is exact and order-free).

Arithmetic. Every setting is evaluated by the pipeline's own code: a `Retriever` built from the
setting fuses the cached lists (truncated to the setting's depth) with `Retriever.fuse` and
orders the head with `Retriever.rerank` (RRF, min-max blend); nothing is re-implemented here.
BEIR datasets are scored at document level (a document ranks at its best chunk,
`sourcegate.pipelines.app.beir.doc_ranking`), the demo at chunk level, all by nDCG@10 of the final order.

Procedure (fixed before the grid was read). For each dataset d and setting s, the relative
score r_d(s) = nDCG@10_d(s) / max over the grid of nDCG@10_d. The chosen setting maximises the
worst dataset's relative score, min_d r_d(s) (ties to 4 decimals: the higher mean r_d, then the
shipped values). Leave-one-dataset-out: the same rule on two datasets, read on the third.

    .venv/bin/python -m benchmarks.fusion --cache /work/cache/beir [--rrf-ks 5,10,20,30,60,100]
        [--list-depths 18,30,50,100] [--rerank-depths 12,20,30,50] [--weights 0.5,0.6,0.7,0.8,0.9,1.0]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import pickle
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from benchmarks._common import ROOT, Result, log, peak_rss_mb
from sourcegate.artifact_io.run_folder import RunFolder

DEPTH = 100  # the cached lists' depth; every setting reads a prefix of them
DATASETS = {"scifact": "scifact", "nfcorpus": "nfcorpus"}  # name -> folder under ../shared/datasets
SHARED = Path(os.environ.get("SOURCEGATE_SHARED", ROOT / ".." / "shared")).resolve() / "datasets"
TIMEOUT_S = 3600.0  # quality, not latency: a busy machine must not drop the reranker


class PairLogits:
    """The cross-encoder's logits on disk: a (query, passage) pair is scored once, ever.

    A `Scorer` (`score(query, passages) -> [(index, logit)]`) for `Retriever.rerank`; with
    `model=None` a missing pair is an error (the grid must read only pre-scored pairs).
    """

    def __init__(self, path: Path, model=None, model_id: str | None = None):
        self.path, self.model = path, model
        self.model_id = model_id or getattr(model, "model_id", None)
        self.logits: dict[str, float] = {}
        if path.exists():
            saved = pickle.loads(path.read_bytes())
            if saved["model_id"] != self.model_id:
                raise ValueError(f"{path} holds logits of {saved['model_id']}, not {self.model_id}")
            self.logits = saved["logits"]
        self.new, self.new_seconds = 0, 0.0
        self.seen: dict[tuple[str, str], float] = {}

    @staticmethod
    def key(query: str, passage: str) -> str:
        return hashlib.sha1(f"{query}\0{passage}".encode()).hexdigest()

    def missing(self, query: str, passages) -> list[str]:
        return [p for p in dict.fromkeys(passages) if self.key(query, p) not in self.logits]

    def score(self, query: str, passages) -> list[tuple[int, float]]:
        out = []
        for i, p in enumerate(passages):
            if (query, p) in self.seen:  # the grid asks the same pairs hundreds of times: skip the hash
                out.append((i, self.seen[query, p]))
                continue
            k = self.key(query, p)
            if k not in self.logits:
                if self.model is None:
                    raise KeyError(f"pair not pre-scored: {query[:40]!r}")
                t = time.perf_counter()
                self.logits[k] = float(self.model.score(query, [p])[0][1])
                self.new_seconds += time.perf_counter() - t
                self.new += 1
            self.seen[query, p] = self.logits[k]
            out.append((i, self.logits[k]))
        return out

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps({"model_id": self.model_id, "logits": self.logits}))
        tmp.replace(self.path)


class CachedLists:
    """A search backend that serves each query's cached 100-deep lists, cut to the asked depth.

    `Retriever.fuse` reads it exactly as it reads the index (`hybrid`); the BM25 distribution
    and best cosine and document frequencies (signals only) are not served.
    """

    def __init__(self, lists: dict[str, tuple[list, list]], stored: dict[str, dict]):
        self.lists, self.stored = lists, stored

    def hybrid(self, query: str, vector, bm25_k: int, knn_k: int, terms=()):
        from sourcegate.pipelines.search.base import Hit, HybridResult, ScoreDistribution

        bm25, knn = self.lists[query]
        bm25 = [Hit(c, s) for c, s in bm25[:bm25_k]]
        knn = [Hit(c, s) for c, s in knn[:knn_k]]
        ids = dict.fromkeys(h.chunk_id for h in [*bm25, *knn])
        return HybridResult(bm25, knn, {c: self.stored[c] for c in ids}, ScoreDistribution(np.zeros(0), 0, 0), 0.0)


def content_key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def demo_index(cfg: dict, cache: Path) -> tuple[dict, str]:
    """The demo corpus built once under `cache/demo` (keyed by its files, embedding, chunking, analyser)."""
    from sourcegate import api as factories
    from sourcegate.api import build
    from sourcegate.pipelines import config as config_mod
    from sourcegate.pipelines.search.analyzer import ANALYZER_ID

    corpus = ROOT / cfg.corpus.path
    files = sorted(p for p in corpus.rglob("*") if p.is_file())
    content = [(str(p.relative_to(corpus)), hashlib.sha256(p.read_bytes()).hexdigest()) for p in files]
    run_id = "demo-" + content_key(content, cfg.embedding.model_dump(), cfg.chunking.model_dump(), ANALYZER_ID)
    dcfg = config_mod.replace(cfg, {"artifacts": str(cache / "demo" / "cache"), "corpus.path": str(corpus)})
    marker = RunFolder(dcfg.artifacts, run_id).path / "loaded-embedded.json"
    if not (marker.exists() and run_id in factories.open_store(dcfg).versions()):
        build(RunFolder(dcfg.artifacts, run_id), dcfg)
        marker.write_text(json.dumps({"version": run_id}) + "\n")
    return dcfg, run_id


def load_dataset(name: str, cfg: dict, cache: Path) -> dict:
    """Queries, labels, the searcher and chunk table of one dataset (its index built if missing)."""
    from sourcegate import api as factories
    from sourcegate.api import index_dataset, load_queries
    from sourcegate.evals.evalset import load_evalset
    from sourcegate.evals.evaluate import qrels_for
    from sourcegate.pipelines.build.validate import loadable_chunks
    from sourcegate.pipelines.retrieval.retriever import effective_query

    if name == "demo":
        dcfg, version = demo_index(cfg, cache)
        items = [it for it in load_evalset(ROOT / cfg.evals.precision_set) if it["label"] == "answer"]
        chunks_parquet = RunFolder(dcfg.artifacts, version).path / "chunks.parquet"
        chunks = pq.read_table(chunks_parquet, columns=["chunk_id", "doc_id", "section_id"]).to_pylist()
        qrels = qrels_for(items, chunks)
        queries = {it["id"]: effective_query(it["question"], it.get("context", [])) for it in items}
    else:
        dcfg, version = index_dataset(cfg, SHARED / DATASETS[name], cache / name, progress=False)
        queries, qrels = load_queries(SHARED / DATASETS[name])
        items = None
        chunks_parquet = loadable_chunks(RunFolder(dcfg.artifacts, version).path)
    table = pq.read_table(chunks_parquet, columns=["chunk_id", "doc_id"])
    doc_of = dict(zip(table.column("chunk_id").to_pylist(), table.column("doc_id").to_pylist()))
    searcher = factories.open_store(dcfg).open(version)
    return {"cfg": dcfg, "version": version, "queries": queries, "qrels": qrels, "items": items,
            "doc_of": doc_of, "searcher": searcher}  # fmt: skip


def cached_lists(name: str, ds: dict, cfg: dict, cache: Path) -> dict[str, tuple[list, list]]:
    """qid -> (BM25 list, kNN list), each [(chunk_id, score)] DEPTH deep; searched once, then read from disk."""
    from sourcegate import api as factories
    from sourcegate.pipelines.search.base import hybrid_search

    path = cache / name / f"fusion-lists-{ds['version']}.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    todo = [q for q in ds["queries"] if q not in saved or saved[q]["query"] != ds["queries"][q]]
    if todo:
        embedder = factories.get_embedder(cfg.embedding)
        t = time.perf_counter()
        for qid in todo:
            text = ds["queries"][qid]
            found = hybrid_search(ds["searcher"], text, embedder.encode_query(text), DEPTH, DEPTH)
            saved[qid] = {
                "query": text,
                "bm25": [[h.chunk_id, h.score] for h in found.bm25],
                "knn": [[h.chunk_id, h.score] for h in found.knn],
            }
        path.write_text(json.dumps(saved))
        log(f"{name}: {len(todo)} queries searched in {time.perf_counter() - t:.0f}s")
    return {q: (saved[q]["bm25"], saved[q]["knn"]) for q in ds["queries"]}


def retriever(searcher, scorer, k: int, depth: int, rerank_depth: int, weight: float):
    from sourcegate.pipelines.config import Reranker, Retrieval
    from sourcegate.pipelines.retrieval.retriever import Retriever

    settings = Retrieval(bm25_top_n=depth, knn_top_n=depth, rrf_k=k, rerank_depth=rerank_depth, rerank_weight=weight)
    return Retriever(searcher, None, scorer, settings, Reranker(timeout_s=TIMEOUT_S))


def heads(queries: dict[str, str], searcher: CachedLists, ks, depths, rerank_depth: int) -> dict[str, list[str]]:
    """qid -> the passages any (k, list depth) setting puts in its top `rerank_depth`."""
    out = {}
    for qid, text in queries.items():
        head = {}
        for k, depth in itertools.product(ks, depths):
            fused, _ = retriever(searcher, None, k, depth, rerank_depth, 1.0).fuse(text, None)
            head.update((c.chunk_id, c.text) for c in fused[:rerank_depth])
        out[qid] = list(head.values())
    return out


def score_round(loaded: dict, rerank_depth: int, ks, depths, subsets: dict[str, list[str]], until: float) -> dict:
    """Score every pair the grid reranks at `rerank_depth`, one query of each dataset in turn, until
    `until` (epoch s). Returns dataset -> the queries whose pairs are all scored (a prefix of its subset)."""
    todo = {}
    for name, (ds, searcher, pairs) in loaded.items():
        want = heads({q: ds["queries"][q] for q in subsets[name]}, searcher, ks, depths, rerank_depth)
        todo[name] = [(q, pairs.missing(ds["queries"][q], ps)) for q, ps in want.items()]
    total = sum(len(m) for t in todo.values() for _, m in t)
    log(f"rerank depth {rerank_depth}: {total} pairs to score")
    done = {name: [] for name in loaded}
    t, n, last = time.perf_counter(), 0, 0
    for turn in itertools.zip_longest(*[[(name, q, m) for q, m in todo[name]] for name in todo]):
        if time.time() > until:
            break
        for name, qid, missing in filter(None, turn):
            ds, _, pairs = loaded[name]
            pairs.score(ds["queries"][qid], missing)
            done[name].append(qid)
            n += len(missing)
        if n - last >= 500:
            last = n
            for _, _, pairs in loaded.values():
                pairs.save()
            rate = n / (time.perf_counter() - t)
            log(f"depth {rerank_depth}: {n}/{total} pairs, {rate:.2f}/s, ~{(total - n) / rate / 60:.0f} min left")
    for _, _, pairs in loaded.values():
        pairs.save()
    return done


def evaluate(name: str, ds: dict, runs: dict[str, dict[str, list[str]]], qids=None) -> dict[str, dict]:
    """nDCG@10 (+ recall@100 on BEIR, p@1 on the demo) of chunk-id runs, per system name, over `qids` (all)."""
    from sourcegate.api import doc_ranking
    from sourcegate.evals.metrics import ndcg_at, precision_at, recall_at

    qids = set(ds["queries"] if qids is None else qids)
    qrels = {q: r for q, r in ds["qrels"].items() if q in qids}
    out = {}
    for system, run in runs.items():
        run = {q: r for q, r in run.items() if q in qids}
        if name == "demo":
            judged = {q: qrels[q] for q in run if any(v > 0 for v in qrels.get(q, {}).values())}
            out[system] = {
                "ndcg@10": ndcg_at(run, judged, 10)["mean"],
                "p@1": precision_at(run, judged, 1)["mean"],
            }
        else:
            docs = {q: doc_ranking(chunks, ds["doc_of"]) for q, chunks in run.items()}
            out[system] = {
                "ndcg@10": ndcg_at(docs, qrels, 10)["mean"],
                "recall@100": recall_at(docs, qrels, 100)["mean"],
            }
    return {s: {m: round(v, 4) for m, v in ms.items()} for s, ms in out.items()}


def grid_scores(name: str, ds: dict, searcher, pairs, ks, depths, rerank_depths, weights, subset, rerank_ks) -> dict:
    """Every setting's final-order scores on the reranked `subset` of queries; the hybrid (fused)
    scores per (k, depth), BM25 and dense on all queries and on the subset."""
    from sourcegate.evals.precision import precision_eval

    lists = searcher.lists
    base = {
        "bm25": {q: [c for c, _ in lists[t][0]] for q, t in ds["queries"].items()},
        "dense": {q: [c for c, _ in lists[t][1]] for q, t in ds["queries"].items()},
    }
    legs, legs_subset = evaluate(name, ds, base), evaluate(name, ds, base, subset)
    hybrid, hybrid_subset, final, gate = {}, {}, {}, {}
    for k, depth in itertools.product(ks, depths):
        fused = {q: retriever(searcher, None, k, depth, 0, 1.0).fuse(t, None)[0] for q, t in ds["queries"].items()}
        fused_ids = {q: [c.chunk_id for c in f] for q, f in fused.items()}
        hybrid[f"k{k}_n{depth}"] = evaluate(name, ds, {"hybrid": fused_ids})["hybrid"]
        hybrid_subset[f"k{k}_n{depth}"] = evaluate(name, ds, {"hybrid": fused_ids}, subset)["hybrid"]
        runs = {}
        for rd, w in itertools.product(rerank_depths if k in rerank_ks else [], weights):
            r = retriever(searcher, pairs, k, depth, rd, w)
            run = {}
            for q in subset:
                t = ds["queries"][q]
                result, ranked = r.rerank(t, fused[q])
                if result is None:
                    raise RuntimeError(f"{name} {q}: the reranker failed; the numbers would not be comparable")
                run[q] = [c.chunk_id for c in ranked]
            runs[setting_name(k, depth, rd, w)] = run
            if name == "demo" and len(subset) == len(ds["queries"]):  # the gate's arithmetic, for the record
                p = precision_eval(ds["items"], fused_ids, run, ds["qrels"])
                gate[setting_name(k, depth, rd, w)] = {
                    "fused_p@1": round(p["overall"]["fused"]["p@1"], 4),
                    "reranked_p@1": round(p["overall"]["reranked"]["p@1"], 4),
                    "reranked_ndcg@10": round(p["overall"]["reranked"]["ndcg@10"], 4),
                    "wins_ties_losses": [p["wins"], p["ties"], len(p["losses"])],
                }
        final.update(evaluate(name, ds, runs, subset))
        log(f"{name}: k={k} n={depth} done")
    return {"bm25": legs["bm25"], "dense": legs["dense"], "hybrid": hybrid, "reranked_queries": len(subset),
            "on_reranked_queries": {"bm25": legs_subset["bm25"], "dense": legs_subset["dense"], "hybrid": hybrid_subset},
            "final": final, "gate": gate}  # fmt: skip


def setting_name(k: int, depth: int, rerank_depth: int, weight: float) -> str:
    return f"k{k}_n{depth}_d{rerank_depth}_w{weight}"


def choose(scores: dict[str, dict[str, float]], datasets: list[str], shipped: str) -> dict:
    """The procedure: maximise the worst dataset's nDCG@10 relative to that dataset's best setting."""
    best = {d: max(scores[d].values()) for d in datasets}
    rel = {s: {d: scores[d][s] / best[d] for d in datasets} for s in scores[datasets[0]]}

    def rank_key(s: str):
        worst, mean = min(rel[s].values()), sum(rel[s].values()) / len(datasets)
        return (-round(worst, 4), -round(mean, 4), s != shipped, s)

    chosen = min(rel, key=rank_key)
    return {
        "setting": chosen,
        "worst_relative": round(min(rel[chosen].values()), 4),
        "relative": {d: round(v, 4) for d, v in rel[chosen].items()},
        "ndcg@10": {d: scores[d][chosen] for d in datasets},
        "best_per_dataset": {d: {"setting": max(scores[d], key=scores[d].get), "ndcg@10": best[d]} for d in datasets},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path("/work/cache/beir"), help="index, lists and pair-logit caches")
    ap.add_argument("--datasets", default="demo,scifact,nfcorpus")
    ap.add_argument("--rrf-ks", default="5,10,20,30,60,100")
    ap.add_argument("--rerank-ks", default="", help="RRF k values of the rerank grid (default: --rrf-ks)")
    ap.add_argument("--list-depths", default="18,30,50,100")
    ap.add_argument("--rerank-depths", default="12,20,30,50")
    ap.add_argument("--weights", default="0.5,0.6,0.7,0.8,0.9,1.0")
    ap.add_argument("--score-minutes", type=float, default=0, help="stop scoring pairs after this long (0: never)")
    ap.add_argument("--name", default="fusion", help="result file name (benchmarks/results/<name>.json)")
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ks, depths, rerank_depths = ints(args.rrf_ks), ints(args.list_depths), ints(args.rerank_depths)
    rerank_ks = ints(args.rerank_ks) or ks
    weights = [float(x) for x in args.weights.split(",") if x]
    names = [n for n in args.datasets.split(",") if n]

    res = Result(args.name, cache=str(args.cache), grid={"rrf_k": ks, "rerank_rrf_k": rerank_ks, "list_depth": depths,
                 "rerank_depth": rerank_depths, "rerank_weight": weights})  # fmt: skip
    from sourcegate.pipelines import config as config_mod
    from sourcegate.pipelines.retrieval.rerank import OnnxCrossEncoder

    cfg = config_mod.load(ROOT / "config" / "pipeline.yaml", {})
    r = cfg.retrieval
    shipped = setting_name(r.rrf_k, r.bm25_top_n, r.rerank_depth, r.rerank_weight)
    res["shipped"] = shipped
    model = OnnxCrossEncoder()
    res["reranker"] = model.model_id
    until = time.time() + args.score_minutes * 60 if args.score_minutes else float("inf")
    loaded = {}
    for name in names:  # indexes and lists first: they need the bi-encoder, the pairs do not
        ds = load_dataset(name, cfg, args.cache)
        lists = cached_lists(name, ds, cfg, args.cache)
        stored_ids = list(dict.fromkeys(c for b, n in lists.values() for c, _ in [*b, *n]))
        stored = dict(zip(stored_ids, ds["searcher"].chunks(stored_ids)))
        searcher = CachedLists({ds["queries"][q]: v for q, v in lists.items()}, stored)
        pairs = PairLogits(args.cache / name / "pair-logits.pkl", model)
        loaded[name] = (ds, searcher, pairs)
    # pairs by rerank depth, shallowest first, one query of each dataset in turn: at the time limit every
    # dataset has the same share of its queries scored; deeper heads are scored only on those queries
    t_pairs, scored_depths = time.perf_counter(), []
    subsets = {name: list(ds["queries"]) for name, (ds, _, _) in loaded.items()}
    for rd in sorted(rerank_depths):
        done = score_round(loaded, rd, rerank_ks, depths, subsets, until)
        if not scored_depths:  # the first depth fixes the query subset the rerank grid is read on
            subsets = {name: done[name] for name in done}
            if not all(subsets.values()):
                raise SystemExit("no query fully scored at the first rerank depth: raise --score-minutes")
        elif any(len(done[n]) < len(subsets[n]) for n in done):
            log(f"rerank depth {rd}: scoring stopped at the time limit; depths evaluated: {scored_depths}")
            break
        scored_depths.append(rd)
    new = sum(p.new_seconds for _, _, p in loaded.values())
    res["pair_scoring"] = {"seconds": round(time.perf_counter() - t_pairs, 1), "model_seconds": round(new, 1),
                           "rerank_depths_scored": scored_depths,
                           "queries_reranked": {n: len(q) for n, q in subsets.items()}}  # fmt: skip
    res["grid"]["rerank_depth"] = scored_depths
    scores, per_dataset = {}, {}
    for name, (ds, searcher, pairs) in loaded.items():
        t = time.perf_counter()
        grid = grid_scores(name, ds, searcher, PairLogits(pairs.path, None, model.model_id), ks, depths,
                           scored_depths, weights, subsets[name], rerank_ks)  # fmt: skip
        per_dataset[name] = {"version": ds["version"], "queries": len(ds["queries"]), **grid,
                             "seconds": round(time.perf_counter() - t, 1)}  # fmt: skip
        scores[name] = {s: v["ndcg@10"] for s, v in grid["final"].items()}
        log(f"{name}: best {max(scores[name].values())}, shipped {scores[name].get(shipped)}")
    res["datasets"] = per_dataset
    # the fused order alone (no rerank), on every query: the same procedure over (k, list depth)
    hybrid = {n: {s: v["ndcg@10"] for s, v in per_dataset[n]["hybrid"].items()} for n in names}
    res["chosen_hybrid"] = choose(hybrid, names, f"k{r['rrf_k']}_n{r['bm25_top_n']}")
    res["chosen"] = choose(scores, names, shipped)
    res["shipped_scores"] = {d: scores[d].get(shipped) for d in names}
    res["leave_one_out"] = {}
    for held in names if len(names) > 2 else []:
        rest = [d for d in names if d != held]
        pick = choose(scores, rest, shipped)["setting"]
        best = max(scores[held].values())
        res["leave_one_out"][held] = {
            "chosen_on": rest,
            "setting": pick,
            "held_out_ndcg@10": scores[held][pick],
            "held_out_best": best,
            "held_out_relative": round(scores[held][pick] / best, 4),
        }
    log("chosen", json.dumps(res["chosen"], indent=1), json.dumps(res["leave_one_out"], indent=1))
    res["peak_rss_mb"] = peak_rss_mb()
    res.write()


if __name__ == "__main__":
    main()
