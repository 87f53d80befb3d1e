"""docs/benchmarks/20-evaluate-speed.md, "Pairs side by side": one cross-encoder pair per session run, run one
at a time on a two-threaded session (the scorer before) or side by side on single-threaded sessions (`score`
today), interleaved and repeated in one process; the logits of every way are compared to the bit.

    python -m benchmarks.pair_scoring --pairs 300 --reps 2 --out benchmarks/results/pair_scoring.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks._common import ROOT, finished, machine, uptime


def sample_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """`n` (fit-set question, demo passage) pairs drawn with `seed`: the lengths a night scores."""

    import pyarrow.parquet as pq

    runs = sorted((ROOT / "artifacts" / "runs").glob("*/chunks.parquet"))
    if not runs:
        raise SystemExit("no demo night under artifacts/runs: `sourcegate run` first")
    texts = pq.read_table(runs[-1], columns=["text"]).column("text").to_pylist()
    lines = (ROOT / "config/evals/calibration.jsonl").read_text(encoding="utf-8").splitlines()
    questions = [json.loads(line)["question"] for line in lines if line.strip()]
    rng = random.Random(seed)
    return [(rng.choice(questions), rng.choice(texts)) for _ in range(n)]


def session(scorer, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(scorer.model_of(scorer.folder), options, providers=["CPUExecutionProvider"])


def main(argv=None) -> int:
    from sourcegate.pipelines.retrieval.rerank import OnnxCrossEncoder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/pair_scoring.json"))
    args = ap.parse_args(argv)
    pairs = sample_pairs(args.pairs)
    result = {
        "benchmark": "pair_scoring",
        "machine": machine(),
        "load_start": uptime(),
        "pairs": len(pairs),
        "runs": [],
    }
    ways = {"two-threaded session, one pair at a time": (2, 1), "single-threaded sessions, side by side": (1, 2)}
    scorer, logits = OnnxCrossEncoder(), {}
    for rep in range(args.reps):
        for way, (threads, workers) in ways.items():
            scorer.session = session(scorer, threads)
            scorer._run(*pairs[0])  # warm
            t = time.perf_counter()
            with ThreadPoolExecutor(workers) as pool:
                logits[way] = list(pool.map(lambda qp: scorer._run(*qp), pairs))
            result["runs"].append({"rep": rep, "way": way, "seconds": round(time.perf_counter() - t, 2)})
    first, *others = logits.values()
    result["max_abs_logit_difference"] = max(abs(a - b) for other in others for a, b in zip(first, other))
    for way in ways:
        result[way] = min(r["seconds"] for r in result["runs"] if r["way"] == way)
    result["speedup"] = round(result[list(ways)[0]] / result[list(ways)[1]], 2)
    return finished(result, Path(args.out))


if __name__ == "__main__":
    raise SystemExit(main())
