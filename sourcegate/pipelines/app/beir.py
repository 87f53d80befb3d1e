"""`sourcegate beir`: index a BEIR dataset and measure BM25, dense, hybrid and hybrid+rerank.

Documents are chunked like any corpus; a document's rank is that of its best chunk
(first occurrence in the chunk ranking). The index is built on the configured backend
(`--backend embedded|opensearch`) and queried through the pipeline's own `Retriever`, with
100-deep lists: the four systems are read off one retrieval per query, so there is no second
fusion to drift from the pipeline's. The chunks and vectors are cached under the output
folder, keyed by the corpus and config, so reruns skip straight to the queries.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from sourcegate.artifact_io import run_folder as rf
from sourcegate.artifact_io import write_json
from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.evals.harness import calibrate_records
from sourcegate.evals.metrics import mrr, ndcg_at, precision_at, recall_at
from sourcegate.pipelines import config
from sourcegate.pipelines.app import factories, steps
from sourcegate.pipelines.app.run import build
from sourcegate.pipelines.build.beir_queries import document_id, load_queries
from sourcegate.pipelines.config import PipelineConfig
from sourcegate.pipelines.retrieval.retriever import Retriever
from sourcegate.pipelines.search.analyzer import ANALYZER_ID

DEPTH = 100  # recall@100 needs lists this deep; top-18 lists would cap the union at 36


def doc_ranking(chunk_ids: list[str], doc_of: dict[str, str]) -> list[str]:
    return list(dict.fromkeys(doc_of[c] for c in chunk_ids))


def without_own(docs: list[str], query_id: str) -> list[str]:
    """The ranking less the query's own id: BEIR's evaluation ignores a document whose id is the query's
    (`ignore_identical_ids`, its default), which matters where queries are corpus documents (ArguAna's
    counter-arguments, Quora's duplicate questions): there the query's own text would rank first."""
    return [doc for doc in docs if doc != query_id]


def dataset_config(cfg: PipelineConfig, dataset: Path, out: Path) -> tuple[PipelineConfig, str]:
    """The config that indexes the dataset under `out/cache`, and its run id (keyed by corpus and config)."""
    corpus = dataset / "corpus.jsonl"
    content = hashlib.sha256(corpus.read_bytes()).hexdigest()  # not mtime: a fresh copy is the same corpus
    # the analyser too: an index cached before an analyser change would silently report the old BM25
    # torch, the backend from before there was a choice, stays out of the key: its cached indexes stay valid
    embedding = {k: v for k, v in cfg.embedding.model_dump().items() if (k, v) != ("backend", "torch")}
    inputs = [content, embedding, cfg.chunking.model_dump(), ANALYZER_ID]
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]
    bcfg = config.replace(
        cfg,
        {
            "artifacts": str(out / "cache"),
            "corpus.path": str(dataset),
            "corpus.format": "beir",
            "corpus.max_doc_bytes": max(cfg.corpus.max_doc_bytes, 10**7),
            # a prefix of its own: the dataset's OpenSearch index is never a version of the pipeline's alias
            "backend.opensearch.index_prefix": f"{cfg.backend.opensearch.index_prefix}-beir",
        },
    )
    return bcfg, f"beir-{key}"


def index_dataset(cfg: PipelineConfig, dataset: Path, out: Path, progress: bool) -> tuple[PipelineConfig, str]:
    """Build (or reuse) the dataset's index on the configured backend; returns its config and version.

    The chunks and vectors (the run folder) are shared by both backends; the marker file
    `loaded-<backend>.json` is written only after that backend's load completed, so a load that
    failed half-way is redone, never reused.
    """
    bcfg, run_id = dataset_config(cfg, dataset, out)
    run = RunFolder(bcfg.artifacts, run_id)
    marker = run / f"loaded-{bcfg.backend.kind}.json"
    store = factories.open_store(bcfg)
    present = run_id in store.versions()
    if marker.exists() and present:
        return bcfg, run_id
    if present:  # from a load that did not finish (or an older cache): build it again
        store.drop(run_id)
    if "validate" in run.info().get("timings_s", {}):
        indexed = steps.load_step(run, bcfg)  # built before, for the other backend
    else:
        indexed = build(run, bcfg, progress=progress)["indexed"]
    write_json({"version": run_id, "indexed": indexed}, marker)
    return bcfg, run_id


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


def system_rankings(retrieval) -> dict[str, list[str]]:
    """The four systems' chunk rankings, all read off one `Retriever.retrieve`: its BM25 and kNN
    lists (the candidates' ranks in each), the fused order, and the final (reranked) order."""
    fused = retrieval.fused
    return {
        "bm25": [c.chunk_id for c in sorted((c for c in fused if c.bm25_rank), key=lambda c: c.bm25_rank)],
        "dense": [c.chunk_id for c in sorted((c for c in fused if c.knn_rank), key=lambda c: c.knn_rank)],
        "hybrid": [c.chunk_id for c in fused],
        "hybrid+rerank": [c.chunk_id for c in retrieval.ranked],
    }


def system_latency(timings: dict) -> dict[str, float]:
    """Seconds a caller waits for each system: the BM25 and kNN lists come from one search
    (one round trip on OpenSearch when batched), so `bm25` is the search, `dense` adds the query
    embedding, `hybrid` is the same (fusion is inside the search stage), `hybrid+rerank` adds the rerank."""
    dense = timings["embed"] + timings["search"]
    return {"bm25": timings["search"], "dense": dense, "hybrid": dense, "hybrid+rerank": dense + timings["rerank"]}


def run_beir(
    cfg: PipelineConfig,
    dataset: Path,
    out: Path,
    *,
    decline: str | None = None,
    rerank_depth: int | None = None,
    progress: bool = False,
    split: str = "test",
) -> dict:
    """Index the dataset on `cfg`'s backend and measure four systems through the pipeline's `Retriever` on the
    judged queries of `split` (qrels/<split>.tsv)."""
    queries, qrels = load_queries(dataset, split)  # first: a missing split is said before any indexing
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    bcfg, version = index_dataset(cfg, dataset, out, progress)
    t_index = time.perf_counter() - t0
    chunks = pq.read_table(RunFolder(bcfg.artifacts, version).loadable_chunks(), columns=["chunk_id", "doc_id"])
    doc_of = dict(zip(chunks.column("chunk_id").to_pylist(), chunks.column("doc_id").to_pylist()))
    searcher = factories.open_store(bcfg).open(version)
    depth = rerank_depth or cfg.retrieval.rerank_depth
    retriever, scorer = factories.retriever_for(cfg, searcher)
    deep = Retriever.from_config(  # its measures read the rankings alone: no answer signal is computed
        searcher, retriever.embedder, scorer, cfg, wanted=frozenset(), bm25_top_n=DEPTH, knn_top_n=DEPTH,
        rerank_depth=depth,
    )  # fmt: skip
    runs = {"bm25": {}, "dense": {}, "hybrid": {}, "hybrid+rerank": {}}
    latency = {name: [] for name in runs}
    identical = {name: 0 for name in runs}  # queries whose own id was among the system's documents
    items = list(queries.items())
    if progress:
        from tqdm import tqdm

        items = tqdm(items, desc="beir queries", unit="q")
    for qid, text in items:
        retrieval = deep.retrieve(text)
        own = document_id(qid)  # the query's id as ingest names a document
        for name, chunk_ids in system_rankings(retrieval).items():
            docs = doc_ranking(chunk_ids, doc_of)
            runs[name][qid] = without_own(docs, own)
            identical[name] += len(runs[name][qid]) < len(docs)
        for name, seconds in system_latency(retrieval.timings).items():
            latency[name].append(seconds)
    systems = evaluate_systems(runs, qrels)
    for name in systems:
        systems[name]["p50_ms"] = round(float(np.median(latency[name])) * 1000, 2)
    result = {
        "dataset": str(dataset),
        "backend": cfg.backend.kind,
        "split": split,
        "queries": len(queries),
        "chunks": len(doc_of),
        "documents": len(set(doc_of.values())),
        "rerank_depth": depth,
        "candidate_depth": DEPTH,
        "rrf_k": cfg.retrieval.rrf_k,
        "rerank_weight": cfg.retrieval.rerank_weight,
        "reranker": getattr(scorer, "model_id", None),
        "index_seconds": round(t_index, 1),
        "identical_ids_ignored": identical,  # BEIR's ignore_identical_ids: queries whose own document was dropped
        "systems": systems,
    }
    if decline:
        result["calibration"] = str(calibrate_beir(cfg, retriever, queries, decline, out))
    write_json(result, out / "beir.json")
    return result


def calibrate_beir(cfg: PipelineConfig, retriever, queries: dict[str, str], decline: str, out: Path) -> Path:
    """Dataset queries as should-answer, the file's questions as should-decline."""
    from sourcegate.evals.evalset import load_evalset
    from sourcegate.evals.evaluate import run_questions
    from sourcegate.pipelines.retrieval.combiner import describe

    items = [
        {"id": f"q-{qid}", "question": text, "label": "answer", "kind": "beir", "context": [], "expected": []}
        for qid, text in queries.items()
    ]
    items += [{**it, "label": "decline"} for it in load_evalset(decline)]
    calibration = calibrate_records(run_questions(retriever, items), factories.judging(cfg))
    # the accepted combiner, applied as is (fitted on the demo's questions: never refitted here)
    calibration["combiner"] = describe(retriever.combiner, cfg.answerability.combiner, refit=False)
    return write_json(calibration, out / rf.CALIBRATION)
