"""Benchmark 5: the decline-calibration sweep on 10k labelled questions.

`sourcegate.evals.calibration.calibrate` with the six signals of config/pipeline.yaml, the
bm25_z x term_coverage pair and the gating check. Signals are
synthetic (seeded): should-answer questions score higher on average, with overlap.

    .venv/bin/python -m benchmarks.calibration [--questions 10000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from benchmarks._common import Result, log, peak_rss_mb, stats_ms, timed

TARGET_S = 1.0


def synthetic_records(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    is_answer = rng.random(n) < 0.6
    a = is_answer.astype(float)
    kinds = np.where(is_answer, "answerable", rng.choice(["off_topic", "near_topic", "unanswerable"], n))
    signals = {
        "cosine_top": np.clip(0.45 + 0.2 * a + rng.normal(0, 0.08, n), -1, 1),
        "rerank_top": 1 / (1 + np.exp(-(rng.normal(-4, 2.5, n) + 7 * a))),
        "bm25_z": rng.normal(8 + 6 * a, 4, n),
        "bm25_top": rng.gamma(4 + 4 * a, 2.5, n),
        "term_coverage": np.clip(rng.beta(2 + 3 * a, 2, n), 0, 1),
        "margin": rng.beta(1.2, 4, n),
    }
    records = []
    for i in range(n):
        sig = {k: float(v[i]) for k, v in signals.items()}
        if i % 50 == 7:
            sig["rerank_top"] = None  # a few without a reranker score, as when the reranker fails
        records.append(
            {
                "id": f"q{i}",
                "question": f"synthetic question {i}",
                "label": "answer" if is_answer[i] else "decline",
                "kind": str(kinds[i]),
                "signals": sig,
            }
        )
    return records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    from sourcegate.api import judging
    from sourcegate.evals.calibration import calibrate
    from sourcegate.evals.harness import calibration_config
    from sourcegate.pipelines import config as config_mod

    cfg = config_mod.load("config/pipeline.yaml", {})
    ccfg = calibration_config(judging(cfg))

    res = Result("calibration", questions=args.questions, repeats=args.repeats, target_s=TARGET_S, config=ccfg)
    records = synthetic_records(args.questions)
    times, dump_times = [], []
    for r in range(args.repeats):
        t, out = timed(calibrate, records, ccfg)
        td, text = timed(json.dumps, out)
        times.append(t)
        dump_times.append(td)
        log(f"repeat {r}: calibrate {t:.3f}s, json.dumps {td:.3f}s ({len(text) / 1e6:.1f} MB)")
    res["calibrate"] = {**stats_ms(times), "peak_rss_mb": peak_rss_mb()}
    res["json_dumps"] = {**stats_ms(dump_times), "artifact_mb": round(len(text) / 1e6, 2)}
    res["signals_calibrated"] = sorted(k for k, v in out["signals"].items() if not v.get("skipped"))
    res["pair"] = out["pair"]["verdict"] if out.get("pair") else None
    med = res["calibrate"]["p50_ms"] / 1000
    res["met"] = med < TARGET_S
    log(f"median {med:.3f}s -> target < {TARGET_S}s {'MET' if res['met'] else 'NOT MET'}")
    res.write()


if __name__ == "__main__":
    main()
