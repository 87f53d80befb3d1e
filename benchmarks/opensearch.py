"""Benchmark 6: OpenSearch bulk load and query latency vs the embedded backend.

If no node answers at OPENSEARCH_URL (default http://127.0.0.1:9200) it runs
`scripts/opensearch start`, and stops the node at the end only if it started it.
Synthetic chunks (benchmarks.search's generator: seeded unit vectors, Zipf texts) are
written to a chunks.parquet and loaded with `OpenSearchStore.load` into indexes
`sgbench-<random>-v<i>` (never promoted; all deleted at the end), and with
`EmbeddedStore.load` into a temp folder. Then the same queries against both.

    .venv/bin/python -m benchmarks.opensearch [--chunks 20000] [--repeats 3] [--queries 100] [--name N]
    .venv/bin/python -m benchmarks.opensearch --reuse PREFIX/VERSION --embedded DIR [--queries 100] --name N

Both measure hybrid retrieve through six round trips vs one ``_msearch`` vs the embedded backend,
interleaved query by query; the second form only queries (and adds the BM25 z-score error of top-S
distributions against the exact one).
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from benchmarks._common import ROOT, Result, cold, log, peak_rss_mb, stats_ms, timed
from benchmarks.search import DIM, FixedEmbedder, stored_table, synth, texts_of, unit_vectors, vocabulary, zipf_ids


def node_answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def write_chunks(path: Path, n: int, seed: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    offsets, flat, vectors = synth(n, seed)
    table = stored_table(texts_of(offsets, flat, vocabulary()))
    table = table.append_column("embedding", pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), DIM))
    pq.write_table(table, path)


def measure(searcher, retr, emb, qw, qv) -> dict:
    ops = {
        "bm25_top18": lambda q, v: searcher.bm25(q, 18),
        "knn_top18": lambda q, v: searcher.knn(v, 18),
        "best_cosine": lambda q, v: searcher.best_cosine(v),
        "bm25_distribution": lambda q, v: searcher.bm25_distribution(q),
        "hybrid_retrieve_no_rerank": lambda q, v: retr.retrieve(q),
    }
    for q, v in zip(qw[:5], qv[:5]):
        emb.vector = v
        for fn in ops.values():
            fn(q, v)
    times = {k: [] for k in ops}
    for q, v in zip(qw, qv):
        emb.vector = v
        for name, fn in ops.items():
            cold(searcher)  # each operation pays for its own corpus scan
            t, _ = timed(fn, q, v)
            times[name].append(t)
    return {k: stats_ms(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="opensearch", help="result file name (benchmarks/results/<name>.json)")
    ap.add_argument("--reuse", metavar="PREFIX/VERSION", help="query this loaded index instead of loading")
    ap.add_argument("--embedded", help="with --reuse: the embedded index folder of the same chunks")
    args = ap.parse_args()
    if args.reuse:
        queries_only(args)
        return

    import logging

    logging.getLogger("sourcegate.pipelines.retrieval.rerank").setLevel(logging.WARNING)
    from sourcegate.pipelines.config import OpenSearch
    from sourcegate.pipelines.retrieval.retriever import Retriever
    from sourcegate.pipelines.search.embedded import EmbeddedStore
    from sourcegate.pipelines.search.opensearch import OpenSearchStore

    url = os.environ.get("OPENSEARCH_URL", "http://127.0.0.1:9200")
    started = False
    if not node_answers(url):
        log("no node answers; scripts/opensearch start")
        t, p = timed(subprocess.run, [str(ROOT / "scripts" / "opensearch"), "start"], capture_output=True, text=True)
        if p.returncode != 0 or not node_answers(url):
            res = Result("opensearch", skipped=True, reason=f"could not start a node: {p.stderr[-1500:]}")
            res.write()
            return
        started = True
        log(f"node started in {t:.0f}s")
    prefix = f"sgbench-{secrets.token_hex(4)}"
    res = Result(
        args.name,
        url=url,
        prefix=prefix,
        started_node=started,
        chunks=args.chunks,
        dimension=DIM,
        node_heap=os.environ.get("OPENSEARCH_HEAP", "1g (scripts/opensearch default)"),
    )
    store = OpenSearchStore(section=OpenSearch(index_prefix=prefix), progress=False)
    loaded: list[str] = []
    try:
        res["node"] = store.client.info()["version"]["number"]
        with tempfile.TemporaryDirectory(prefix="sgbench-os-") as tmp:
            tmp = Path(tmp)
            src = tmp / "chunks.parquet"
            write_chunks(src, args.chunks, args.seed)
            loads = []
            for rep in range(args.repeats):
                version = f"v{rep}"
                t, count = timed(store.load, version, str(src))
                loaded.append(version)
                loads.append(t)
                log(f"load {rep}: {count} chunks in {t:.1f}s = {count / t:.0f} chunks/s, peak rss {peak_rss_mb()} MB")
            t_emb, _ = timed(EmbeddedStore(tmp / "runs", tmp / "LIVE").load, "v0", str(src))
            res["bulk_load"] = {
                **stats_ms(loads),
                "chunks_per_s_median": round(args.chunks / float(np.median(loads)), 1),
                "bulk_chunk_size": store.chunk_size,
                "includes": "create index, bulk, refresh, _count check",
                "peak_rss_mb": peak_rss_mb(),
            }
            res["embedded_load_s"] = round(t_emb, 2)

            rng = np.random.default_rng(args.seed + 1)
            qv = unit_vectors(rng, args.queries)
            words = vocabulary()
            qw = [" ".join(words[i] for i in zipf_ids(rng, int(rng.integers(4, 11)))) for _ in range(args.queries)]
            emb = FixedEmbedder()
            os_searcher = store.open(loaded[0])
            em_searcher = EmbeddedStore(tmp / "runs", tmp / "LIVE").open("v0")
            res["latency"] = {}
            for name, searcher in (("opensearch", os_searcher), ("embedded", em_searcher)):
                res["latency"][name] = measure(searcher, Retriever(searcher, emb, None), emb, qw, qv)
                log(name, {k: v["p50_ms"] for k, v in res["latency"][name].items()})
            res["hybrid_retrieve_no_rerank"] = round_trips(os_searcher, em_searcher, emb, qw, qv)
            log({k: v["p50_ms"] for k, v in res["hybrid_retrieve_no_rerank"].items()})
            res["agreement"] = agreement(os_searcher, em_searcher, qw[:50], qv[:50])
            res["peak_rss_mb_client"] = peak_rss_mb()
    finally:
        for v in loaded:
            store.drop(v)
        left = store.client.indices.get(index=f"{prefix}-*")
        res["indexes_left_after_cleanup"] = sorted(left)
        if started:
            subprocess.run([str(ROOT / "scripts" / "opensearch"), "stop"], capture_output=True, text=True)
            res["stopped_node"] = True
    res.write()


class ByCalls:
    """A searcher without its batched `hybrid`: the Retriever falls back to the protocol's single
    calls (BM25, kNN, mget, the top-`distribution_size` distribution, a count, kNN for best_cosine)."""

    def __init__(self, searcher):
        self.searcher = searcher

    def __getattr__(self, name):
        if name == "hybrid":
            raise AttributeError(name)
        return getattr(self.searcher, name)


def round_trips(os_searcher, em_searcher, emb, qw, qv) -> dict:
    """Hybrid retrieve (no rerank) p50: six round trips (before) vs one `_msearch` vs embedded,
    interleaved per query, every call cold."""
    from sourcegate.pipelines.retrieval.retriever import Retriever

    systems = {
        "opensearch_six_round_trips": Retriever(ByCalls(os_searcher), emb, None),
        "opensearch_one_round_trip": Retriever(os_searcher, emb, None),
        "embedded": Retriever(em_searcher, emb, None),
    }
    times = {k: [] for k in systems}
    for i, (q, v) in enumerate(zip(qw, qv)):
        emb.vector = v
        for name, retr in systems.items():
            cold(em_searcher)
            t, _ = timed(retr.retrieve, q)
            if i >= 5:  # the first five warm the caches and the connection
                times[name].append(t)
    out = {k: stats_ms(v) for k, v in times.items()}
    for k in ("opensearch_six_round_trips", "opensearch_one_round_trip"):
        out[k]["vs_embedded_p50"] = round(out[k]["p50_ms"] / out["embedded"]["p50_ms"], 2)
    return out


def distribution_error(os_searcher, qw, sizes=(18, 100, 1000)) -> dict:
    """The BM25 z-score from a top-S score list (the rest imputed at the lowest seen score) against
    the exact one (extended_stats over every matching chunk, as `hybrid` gets it), and what each
    request costs. Where at most 10,000 chunks match, the exact z is also checked against the full
    list of scores fetched as hits."""
    from sourcegate.pipelines.search.base import ScoreDistribution

    client, index = os_searcher.client, os_searcher.index
    total = int(client.count(index=index)["count"])
    match = os_searcher._match
    agg = {"bm25": {"extended_stats": {"script": {"source": "_score", "lang": "painless"}}}}
    errors = {s: [] for s in sizes}
    cost = {f"top_{s}": [] for s in sizes} | {"exact_moments_agg": []}
    full_check, matched_counts = [], []
    for q in qw:
        t, r = timed(
            client.search,
            index=index,
            body={"size": 0, "track_total_hits": True, "query": match(q), "aggs": agg},
            filter_path=["hits.total.value", "aggregations"],
        )
        cost["exact_moments_agg"].append(t)
        st = r["aggregations"]["bm25"]
        matched = int(r["hits"]["total"]["value"])
        matched_counts.append(matched)
        if not matched:
            continue
        top = float(st["max"])
        exact = ScoreDistribution(np.array([top]), matched, total, moments=(st["sum"], st["sum_of_squares"])).zscore(
            top
        )
        for s in sizes:
            t, r = timed(
                client.search,
                index=index,
                body={"size": s, "_source": False, "track_total_hits": True, "query": match(q)},
                filter_path=["hits.hits._score", "hits.total.value"],
            )
            cost[f"top_{s}"].append(t)
            scores = np.array([h["_score"] for h in r["hits"]["hits"]])
            z = ScoreDistribution(scores, matched, total).zscore(top)
            errors[s].append(abs(z - exact) / max(abs(exact), 1e-9))
        if matched <= 10_000:
            r = client.search(
                index=index,
                body={"size": matched, "_source": False, "query": match(q)},
                filter_path=["hits.hits._score"],
            )
            scores = np.array([h["_score"] for h in r["hits"]["hits"]])
            full_check.append(abs(ScoreDistribution(scores, matched, total).zscore(top) - exact))
    return {
        "queries": len(qw),
        "chunks": total,
        "matched_median": float(np.median(matched_counts)),
        "relative_z_error_vs_exact": {
            f"top_{s}": {
                "mean": round(float(np.mean(e)), 4),
                "p95": round(float(np.percentile(e, 95)), 4),
                "max": round(float(np.max(e)), 4),
            }
            for s, e in errors.items()
        },
        "exact_vs_full_list_max_abs_z_diff": float(max(full_check)) if full_check else None,
        "exact_vs_full_list_queries": len(full_check),
        "request_latency": {k: stats_ms(v) for k, v in cost.items()},
    }


def queries_only(args) -> None:
    """--reuse: query an already loaded index `<prefix>-<version>` and its embedded twin (no load)."""
    from sourcegate.pipelines.config import OpenSearch
    from sourcegate.pipelines.search.embedded import EmbeddedSearcher
    from sourcegate.pipelines.search.opensearch import OpenSearchStore

    prefix, version = args.reuse.split("/")
    res = Result(args.name, prefix=prefix, version=version, embedded=args.embedded, queries=args.queries)
    store = OpenSearchStore(section=OpenSearch(index_prefix=prefix), progress=False)
    res["node"] = store.client.info()["version"]["number"]
    os_searcher = store.open(version)
    em_searcher = EmbeddedSearcher(Path(args.embedded))
    res["chunks"] = len(em_searcher.ids)
    rng = np.random.default_rng(args.seed + 1)
    qv = unit_vectors(rng, args.queries)
    words = vocabulary()
    qw = [" ".join(words[i] for i in zipf_ids(rng, int(rng.integers(4, 11)))) for _ in range(args.queries)]
    emb = FixedEmbedder()
    res["hybrid_retrieve_no_rerank"] = round_trips(os_searcher, em_searcher, emb, qw, qv)
    log({k: v["p50_ms"] for k, v in res["hybrid_retrieve_no_rerank"].items()})
    res["bm25_distribution"] = distribution_error(os_searcher, qw)
    log(res["bm25_distribution"]["relative_z_error_vs_exact"])
    res.write()


def agreement(os_s, em_s, qw, qv) -> dict:
    """BM25 top-18 set overlap and HNSW kNN recall@18 against exact kNN."""
    bm, kn, top1 = [], [], []
    for q, v in zip(qw, qv):
        a, b = {h.chunk_id for h in os_s.bm25(q, 18)}, {h.chunk_id for h in em_s.bm25(q, 18)}
        bm.append(len(a & b) / max(len(b), 1))
        a, b = {h.chunk_id for h in os_s.knn(v, 18)}, {h.chunk_id for h in em_s.knn(v, 18)}
        kn.append(len(a & b) / 18)
        top1.append(abs(os_s.best_cosine(v) - em_s.best_cosine(v)) < 1e-4)
    return {
        "bm25_top18_overlap_mean": round(float(np.mean(bm)), 4),
        "knn_recall_at_18_mean": round(float(np.mean(kn)), 4),
        "best_cosine_equal_share": round(float(np.mean(top1)), 4),
        "queries": len(qw),
    }


if __name__ == "__main__":
    main()
