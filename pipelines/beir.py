"""`sourcegate beir`: index a BEIR dataset and measure BM25, dense, hybrid and hybrid+rerank.

Documents are chunked like any corpus; a document's rank is that of its best chunk
(first occurrence in the chunk ranking). The index is cached under the output folder,
keyed by the corpus and config, so reruns skip straight to the queries.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import time
from pathlib import Path

import numpy as np

from evals.metrics import mrr, ndcg_at, precision_at, recall_at
from pipelines import steps
from pipelines.io import write_json
from pipelines.retrieval import rerank_head, rrf
from pipelines.run import build
from pipelines.search.embedded import EmbeddedSearcher

DEPTH = 100  # recall@100 needs lists this deep; top-18 lists would cap the union at 36


def load_queries(dataset: Path) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    queries = {}
    for line in (dataset / "queries.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            q = json.loads(line)
            queries[str(q["_id"])] = q["text"]
    qrels: dict[str, dict[str, int]] = {}
    with (dataset / "qrels" / "test.tsv").open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    return {q: queries[q] for q in qrels if q in queries}, qrels


def doc_ranking(chunk_ids: list[str], doc_of: dict[str, str]) -> list[str]:
    return list(dict.fromkeys(doc_of[c] for c in chunk_ids))


def index_dataset(cfg: dict, dataset: Path, out: Path, progress: bool) -> Path:
    """Build (or reuse) the embedded index of the dataset; returns its run folder."""
    corpus = dataset / "corpus.jsonl"
    content = hashlib.sha256(corpus.read_bytes()).hexdigest()  # not mtime: a fresh copy is the same corpus
    key = hashlib.sha256(json.dumps([content, cfg["embedding"], cfg["chunking"]], sort_keys=True).encode()).hexdigest()[
        :12
    ]
    run_id = f"beir-{key}"
    bcfg = copy.deepcopy(cfg)
    bcfg["artifacts"] = str(out / "cache")
    bcfg["corpus"].update(path=str(dataset), format="beir", max_doc_bytes=max(cfg["corpus"]["max_doc_bytes"], 10**7))
    folder = steps.run_dir(bcfg, run_id)
    if not (folder / "index" / "bm25.npz").exists():
        build(bcfg, run_id, progress=progress)
    return folder


def evaluate_systems(runs: dict[str, dict[str, list[str]]], qrels, ks=(1, 3, 5, 10)) -> dict:
    out = {}
    for name, run in runs.items():
        m = {
            "ndcg@10": ndcg_at(run, qrels, 10)["mean"],
            "recall@100": recall_at(run, qrels, 100)["mean"],
            "mrr": mrr(run, qrels)["mean"],
        }
        m.update({f"p@{k}": precision_at(run, qrels, k)["mean"] for k in ks})
        out[name] = {k: round(v, 4) for k, v in m.items()}
    return out


def run_beir(
    cfg: dict,
    dataset: Path,
    out: Path,
    *,
    decline: str | None = None,
    rerank_depth: int | None = None,
    progress: bool = False,
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    folder = index_dataset(cfg, dataset, out, progress)
    t_index = time.perf_counter() - t0
    searcher = EmbeddedSearcher(folder / "index")
    doc_of = dict(zip(searcher.ids, searcher.column("doc_id")))
    retriever, scorer = steps.retriever_for(cfg, searcher)
    embedder = retriever.embedder
    depth = rerank_depth or cfg["retrieval"]["rerank_depth"]
    weight = cfg["retrieval"]["rerank_weight"]
    queries, qrels = load_queries(dataset)
    runs = {"bm25": {}, "dense": {}, "hybrid": {}, "hybrid+rerank": {}}
    latency = {name: [] for name in runs}
    items = list(queries.items())
    if progress:
        from tqdm import tqdm

        items = tqdm(items, desc="beir queries", unit="q")
    for qid, text in items:
        t = time.perf_counter()
        vector = embedder.encode_query(text)
        t_embed = time.perf_counter() - t
        t = time.perf_counter()
        bm25 = searcher.bm25(text, DEPTH)
        latency["bm25"].append(time.perf_counter() - t)
        t = time.perf_counter()
        knn = searcher.knn(vector, DEPTH)
        latency["dense"].append(time.perf_counter() - t + t_embed)
        t = time.perf_counter()
        fused = rrf([bm25, knn], cfg["retrieval"]["rrf_k"])
        latency["hybrid"].append(time.perf_counter() - t + latency["bm25"][-1] + latency["dense"][-1])
        t = time.perf_counter()
        head = fused[:depth]
        _, order = rerank_head(
            scorer,
            text,
            [r["text"] for r in searcher.chunks([c for c, _ in head])],
            [s for _, s in head],
            weight,
            cfg["reranker"]["timeout_s"],
        )
        final = [head[i][0] for i in order] + [c for c, _ in fused[depth:]]
        latency["hybrid+rerank"].append(time.perf_counter() - t + latency["hybrid"][-1])
        runs["bm25"][qid] = doc_ranking([h.chunk_id for h in bm25], doc_of)
        runs["dense"][qid] = doc_ranking([h.chunk_id for h in knn], doc_of)
        runs["hybrid"][qid] = doc_ranking([c for c, _ in fused], doc_of)
        runs["hybrid+rerank"][qid] = doc_ranking(final, doc_of)
    systems = evaluate_systems(runs, qrels)
    for name in systems:
        systems[name]["p50_ms"] = round(float(np.median(latency[name])) * 1000, 2)
    result = {
        "dataset": str(dataset),
        "queries": len(queries),
        "chunks": len(doc_of),
        "documents": len(set(doc_of.values())),
        "rerank_depth": depth,
        "candidate_depth": DEPTH,
        "rrf_k": cfg["retrieval"]["rrf_k"],
        "rerank_weight": weight,
        "reranker": getattr(scorer, "model_id", None),
        "index_seconds": round(t_index, 1),
        "systems": systems,
    }
    if decline:
        result["calibration"] = str(calibrate_beir(cfg, retriever, queries, decline, out))
    write_json(result, out / "beir.json")
    return result


def calibrate_beir(cfg: dict, retriever, queries: dict[str, str], decline: str, out: Path) -> Path:
    """Dataset queries as should-answer, the file's questions as should-decline."""
    from evals.calibration import calibrate
    from evals.evalset import load_evalset
    from evals.evaluate import run_questions

    items = [
        {"id": f"q-{qid}", "question": text, "label": "answer", "kind": "beir", "context": [], "expected": []}
        for qid, text in queries.items()
    ]
    items += [{**it, "label": "decline"} for it in load_evalset(decline)]
    calibration = calibrate(run_questions(retriever, items), steps.calibration_config(cfg))
    return write_json(calibration, out / "calibration.json")
