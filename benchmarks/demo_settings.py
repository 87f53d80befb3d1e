"""Benchmark 7c: retrieval settings on the project's own eval sets (corpus/demo).

The SciFact grid (benchmark 7b) says what helps on one public dataset; this says what the
same settings do to the demo's precision evals and calibration, which is what the gate holds.
One demo index is built (sourcegate.pipelines.app.run.build into a scratch artifacts folder), then
`sourcegate.evals.harness.evaluate` runs once per (retrieval.rrf_k, retrieval.rerank_weight) with one
shared cross-encoder, so pairs scored for one setting are reused by the next.

    .venv/bin/python -m benchmarks.demo_settings [--settings 60:1.0,60:0.6,5:1.0,5:0.6,10:0.6,5:0.5]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from benchmarks._common import ROOT, Result, log, peak_rss_mb
from sourcegate.artifact_io.run_folder import RunFolder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--settings", default="60:1.0,60:0.6,5:1.0,5:0.6,10:0.6,5:0.5", help="comma-separated rrf_k:rerank_weight pairs"
    )
    args = ap.parse_args()
    res = Result("demo_settings", settings={})

    from sourcegate import api as factories
    from sourcegate.api import build
    from sourcegate.artifact_io import read_json
    from sourcegate.evals.harness import evaluate
    from sourcegate.pipelines import config as config_mod
    from sourcegate.pipelines.retrieval.rerank import load_scorer
    from sourcegate.pipelines.retrieval.retriever import Retriever

    work = Path(tempfile.mkdtemp(prefix="sgbench-demo-"))
    try:
        cfg = config_mod.load(
            ROOT / "config" / "pipeline.yaml",
            {"artifacts": str(work / "artifacts"), "corpus.path": str(ROOT / "corpus" / "demo")},
        )
        keys = ("evals.calibration_set", "evals.precision_set", "evals.baseline")
        cfg = config_mod.replace(cfg, {k: str(ROOT / config_mod.get(cfg, k)) for k in keys})
        build(RunFolder(cfg.artifacts, "demo"), cfg)
        searcher = factories.open_store(cfg).open("demo")
        embedder, scorer = factories.get_embedder(cfg.embedding), load_scorer("onnx")
        res["reranker"] = scorer.model_id
        for item in args.settings.split(","):
            k, w = item.split(":")
            c = config_mod.replace(
                cfg,
                # timeout: quality, not latency: a busy machine must not drop the reranker
                {"retrieval.rrf_k": int(k), "retrieval.rerank_weight": float(w), "reranker.timeout_s": 3600.0},
            )
            out = work / f"k{k}-w{w}"
            out.mkdir()
            evaluate(
                Retriever.from_config(searcher, embedder, scorer, c),
                RunFolder(c.artifacts, "demo").path / "chunks.parquet",
                factories.judging(c),
                out,
            )
            cal, pre = read_json(out / "calibration.json"), read_json(out / "precision.json")
            if not pre["reranker_used"]:
                raise RuntimeError(f"{item}: the reranker failed on some question; the numbers would not be comparable")
            gating = cal["gating"]["result"]
            res["settings"][f"rrf_k={k} rerank_weight={w}"] = {
                "fused": {m: round(v, 4) for m, v in pre["overall"]["fused"].items()},
                "final": {m: round(v, 4) for m, v in pre["overall"]["reranked"].items()},
                "final_p@1_by_kind": {kind: round(v["reranked"]["p@1"], 4) for kind, v in pre["by_kind"].items()},
                "wins_ties_losses": [pre["wins"], pre["ties"], len(pre["losses"])],
                "shortlist_recall": cal["shortlist_recall"]["recall"],
                "gate_gap": round(gating["gap"], 4),
                "answer_min": round(gating["answer_band"][0], 4),
                "off_topic_max": round(gating["decline_band"][1], 4),
                "decline_recall_by_kind": {
                    kind: v["recall"] for kind, v in cal["shipped"]["decline_recall_by_kind"].items()
                },
            }
            log(item, res["settings"][f"rrf_k={k} rerank_weight={w}"]["final"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res["peak_rss_mb"] = peak_rss_mb()
    res.write()


if __name__ == "__main__":
    main()
