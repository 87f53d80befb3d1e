"""Benchmark 15: the bi-encoder's backends side by side: torch vs ONNX Runtime fp32 vs ONNX INT8.

Throughput: the same SciFact chunks (ingested and chunked by the pipeline, up to 256 tokens,
distinct, seeded sample) through each backend's `encode`, same process, same batch size
setting, repetitions interleaved with the order rotated each time, after a warm-up. Agreement:
each ONNX vector's cosine to the torch vector of the same text.

Quality: SciFact nDCG@10 per backend comes from `sourcegate beir` runs, one per backend,
`--set embedding.backend=<b>`; pass their beir.json files with `--beir <b>=<path>` to put the
numbers (and the default rule's verdict) into the same result file.

    nice -n 10 .venv/bin/python -m benchmarks.embed_backends [--texts 1000] [--repeats 3] \
        [--beir torch=/tmp/b/torch/beir.json --beir onnx=... --beir onnx-int8=...]
    # the nDCG runs after the throughput run: keep its numbers, add theirs and the rule's verdict
    .venv/bin/python -m benchmarks.embed_backends --quality-only --beir torch=... --beir onnx-int8=...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks._common import Result, log, peak_rss_mb, stats_ms, timed
from benchmarks.embed import describe_texts, scifact_chunks, throughput

TARGET_SPEEDUP = 2.0  # the target: >= 2x torch's texts/s
MAX_NDCG_LOSS = 0.005  # ... for a variant whose SciFact hybrid+rerank nDCG@10 is within this of torch's
SYSTEM = "hybrid+rerank"
# what must be equal across the compared beir runs (only the backend may differ)
SAME_SETTINGS = ("dataset", "queries", "rerank_depth", "candidate_depth", "rrf_k", "rerank_weight", "reranker")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--beir", action="append", default=[], metavar="BACKEND=BEIR_JSON")
    ap.add_argument(
        "--quality-only",
        action="store_true",
        help="keep the throughput of the last result file; add the --beir numbers and the default rule",
    )
    args = ap.parse_args()
    if args.quality_only:
        add_quality(dict(item.split("=", 1) for item in args.beir))
        return

    from benchmarks._common import versions
    from sourcegate.pipelines.build.embed_backends import BACKENDS, load_embedder

    res = Result("embed_backends", versions=versions("torch", "onnxruntime", "onnx", "sentence-transformers"))
    rows = scifact_chunks(args.texts)
    texts = [r["text"] for r in rows]
    embedders = {b: load_embedder("sentence-transformers/all-MiniLM-L6-v2", None, args.batch_size, b) for b in BACKENDS}
    res["texts"] = describe_texts(texts, embedders["torch"].tokenizer)
    res["batch_size"] = args.batch_size
    res["fingerprints"] = {b: e.fingerprint for b, e in embedders.items()}
    for e in embedders.values():  # warm-up: the first call pays lazy initialisation
        e.encode(texts[:32])
    times: dict[str, list[float]] = {b: [] for b in BACKENDS}
    vectors: dict[str, np.ndarray] = {}
    for rep in range(args.repeats):
        first = rep % len(BACKENDS)
        order = list(BACKENDS[first:] + BACKENDS[:first])  # rotate who goes first
        for b in order:
            t, vectors[b] = timed(embedders[b].encode, texts)
            times[b].append(t)
            log(f"rep {rep} {b}: {t:.1f}s = {len(texts) / t:.1f} texts/s, peak rss {peak_rss_mb()} MB")
    torch_median = float(np.median(times["torch"]))
    res["throughput"] = {
        b: {
            **stats_ms(v),
            "texts_per_s_median": throughput(len(texts), float(np.median(v))),
            "speedup_vs_torch_median": round(torch_median / float(np.median(v)), 3),
            "speedup_vs_torch_per_repeat": [round(a / x, 3) for a, x in zip(times["torch"], v)],
        }
        for b, v in times.items()
    }
    res["cosine_to_torch"] = {b: cosine_summary(vectors[b], vectors["torch"]) for b in BACKENDS[1:]}
    res["quality"] = quality(dict(item.split("=", 1) for item in args.beir))
    res["default_rule"] = choose(res["throughput"], res["quality"])
    log(json.dumps({"throughput": res["throughput"], "cosine": res["cosine_to_torch"], "rule": res["default_rule"]}))
    res.write()


def add_quality(beir_files: dict[str, str]) -> None:
    """Put the beir runs' nDCG@10 and the default rule into the last result file (its throughput kept)."""
    from benchmarks._common import RESULTS

    path = RESULTS / "embed_backends.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["quality"] = quality(beir_files)
    data["default_rule"] = choose(data["throughput"], data["quality"])
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    log(json.dumps(data["default_rule"]))


def cosine_summary(got: np.ndarray, want: np.ndarray) -> dict:
    cos = (got * want).sum(axis=1)  # both unit-norm
    return {
        k: round(float(v), 7) for k, v in {"min": cos.min(), "p01": np.quantile(cos, 0.01), "mean": cos.mean()}.items()
    }


def quality(beir_files: dict[str, str]) -> dict:
    """nDCG@10 (and the other metrics) per backend from `sourcegate beir` result files."""
    out, settings = {}, {}
    for backend, path in beir_files.items():
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        settings[backend] = {k: data.get(k) for k in SAME_SETTINGS}
        out[backend] = {"beir_json": path, "systems": data["systems"], "ndcg@10": data["systems"][SYSTEM]["ndcg@10"]}
    if len({json.dumps(v, sort_keys=True) for v in settings.values()}) > 1:
        raise SystemExit(f"the beir runs differ in retrieval settings, their nDCG@10 do not compare: {settings}")
    return out


def choose(speed: dict, quality: dict) -> dict:
    """The default rule: the fastest variant whose hybrid+rerank nDCG@10 is within MAX_NDCG_LOSS of torch's."""
    if "torch" not in quality:
        return {"decided": False, "why": "no torch nDCG@10 given (--beir torch=...)"}
    base = quality["torch"]["ndcg@10"]
    eligible = [b for b in quality if quality[b]["ndcg@10"] >= base - MAX_NDCG_LOSS]
    best = max(eligible, key=lambda b: speed[b]["texts_per_s_median"])
    speedup = speed[best]["speedup_vs_torch_median"]
    return {
        "decided": True,
        "default": best,
        "eligible": eligible,
        "ndcg_delta_vs_torch": {b: round(quality[b]["ndcg@10"] - base, 4) for b in quality},
        "speedup": speedup,
        "target_speedup": TARGET_SPEEDUP,
        "target_met": bool(speedup >= TARGET_SPEEDUP),
    }


if __name__ == "__main__":
    main()
