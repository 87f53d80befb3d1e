"""Benchmark 7: retrieval quality on SciFact at several rerank depths.

The same code path as `sourcegate beir` (`sourcegate.pipelines.app.beir.run_beir`; its index is cached
under --out, shared with the CLI), one depth after another in ONE process with ONE
cross-encoder, whose pair-score memo is saved after every depth (for benchmarks.quality_ideas).
Consequence for latency: the first depth run here starts with an empty memo and its
rerank latency is real; later depths re-use the pairs already scored, so their measured
rerank latency is too low and is replaced by an estimate (pairs x measured ms/pair),
flagged in the JSON. A depth whose beir-depth<N>.json already exists is not rerun
(--force reruns it); a CLI run's beir.json at that depth is picked up.

Equivalent CLI, one depth at a time:
    .venv/bin/sourcegate beir ../shared/datasets/scifact --out benchmarks/results/scifact --rerank-depth 12

    .venv/bin/python -m benchmarks.quality [--depths 12,50,100] [--force]
"""

from __future__ import annotations

import argparse
import json
import pickle
import shutil
from pathlib import Path

from benchmarks._common import RESULTS, SCIFACT, Result, log, peak_rss_mb

OUT = RESULTS / "scifact"
MEMO = Path("/tmp/sgbench-scifact-pair-scores.pkl")  # (query, passage) -> logit; large, not in the repo
PUBLISHED = {"bm25": 0.665, "bm25+ce (MiniLM-L-6, top-100)": 0.688, "dense (all-MiniLM-L6-v2)": 0.645}
GOAL = 0.71


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--depths", default="12,50,100")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()

    from sourcegate import api as factories
    from sourcegate.api import run_beir
    from sourcegate.pipelines import config as config_mod
    from sourcegate.pipelines.retrieval.rerank import OnnxCrossEncoder

    cfg = config_mod.load("config/pipeline.yaml", {})
    scorer = OnnxCrossEncoder()
    if MEMO.exists():
        scorer._memo.update(pickle.loads(MEMO.read_bytes()))
    memo_at_start = len(scorer._memo)
    real = factories.retriever_for

    def retriever_for(c, searcher):  # the one scorer, so its memo survives between depths
        r, _ = real(config_mod.replace(c, {"reranker.kind": "none"}), searcher)
        r.scorer = scorer
        return r, scorer

    factories.retriever_for = retriever_for
    res = Result("quality", published_ndcg10=PUBLISHED, goal_hybrid_rerank_ndcg10=GOAL, depths={})
    for depth in [int(d) for d in args.depths.split(",")]:
        path = OUT / f"beir-depth{depth}.json"
        cli = OUT / "beir.json"
        if (
            not args.force
            and not path.exists()
            and cli.exists()
            and json.loads(cli.read_text())["rerank_depth"] == depth
        ):
            shutil.copy(cli, path)
            log(f"depth {depth}: taken from the CLI run's beir.json")
        if path.exists() and not args.force:
            out = json.loads(path.read_text())
            out.setdefault("rerank_latency_real", True)
        else:
            fresh = len(scorer._memo) == 0
            log(f"depth {depth}: running (memo holds {len(scorer._memo)} pairs)")
            out = run_beir(cfg, SCIFACT, OUT, rerank_depth=depth)
            out["rerank_latency_real"] = fresh
            out["peak_rss_mb"] = peak_rss_mb()
            path.write_text(json.dumps(out, indent=2) + "\n")
            MEMO.write_bytes(pickle.dumps(scorer._memo))
        s = out["systems"]
        out["rerank_ms_p50"] = round(s["hybrid+rerank"]["p50_ms"] - s["hybrid"]["p50_ms"], 1)
        res["depths"][str(depth)] = out
        log(f"depth {depth}: " + ", ".join(f"{k} {v['ndcg@10']}" for k, v in s.items()))
    real_ms = [d["rerank_ms_p50"] / int(k) for k, d in res["depths"].items() if d.get("rerank_latency_real")]
    if real_ms:
        per_pair = sorted(real_ms)[len(real_ms) // 2]
        res["ms_per_pair_from_real_runs"] = round(per_pair, 1)
        for k, d in res["depths"].items():
            if not d.get("rerank_latency_real"):
                d["rerank_ms_p50_estimated"] = round(per_pair * int(k), 1)
    best = max(d["systems"]["hybrid+rerank"]["ndcg@10"] for d in res["depths"].values())
    res["best_hybrid_rerank_ndcg10"] = best
    res["met"] = best >= GOAL
    res["memo_pairs_at_start"] = memo_at_start
    res.write()


if __name__ == "__main__":
    main()
