"""Benchmark 4: the reranker stage vs a bare onnxruntime session.

`safe_rerank(OnnxCrossEncoder(), query, passages)` (memo cleared before every
repetition, so inference really runs) vs a bare `onnxruntime.InferenceSession` with the
same model file and thread setting, scoring the same pairs one pair per run. 12 and 100
candidates (SciFact chunk texts, pipeline-chunked), interleaved repetitions.

Then batched scoring (one padded session run per batch of 8 / 32 / all pairs): its speed,
and how far its scores move from the one-pair-per-run scores (the INT8 model quantises
activations dynamically per batch, so a pair's score depends on its batch-mates).

    .venv/bin/python -m benchmarks.rerank [--repeats 3] [--queries 1]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from benchmarks._common import SCIFACT, Result, log, peak_rss_mb, stats_ms, timed, timed_cpu

TARGET_RATIO = 0.9


class BareSession:
    """The same model through onnxruntime directly: tokenize one pair, run, read the logit."""

    def __init__(self, threads: int = 2, spinning: bool = True):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        from sourcegate.pipelines import models

        folder = models.cross_encoder_dir(None)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        if not spinning:  # idle pool threads sleep instead of spinning (matters when cores are shared)
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(folder / "model.onnx"), opts, providers=["CPUExecutionProvider"])
        self.tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tok.enable_truncation(512)
        self.tok.no_padding()  # the shipped tokenizer.json pads; one pair needs no padding
        self.inputs = {i.name for i in self.session.get_inputs()}

    def one(self, query: str, passage: str) -> float:
        e = self.tok.encode(query, passage)
        feed = {
            "input_ids": np.array([e.ids], np.int64),
            "attention_mask": np.array([e.attention_mask], np.int64),
            "token_type_ids": np.array([e.type_ids], np.int64),
        }
        return float(self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs})[0].reshape(-1)[0])

    def pairs(self, query: str, passages: list[str]) -> list[float]:
        return [self.one(query, p) for p in passages]

    def batched(self, query: str, passages: list[str], batch: int) -> list[float]:
        out = []
        for s in range(0, len(passages), batch):
            encs = self.tok.encode_batch([(query, p) for p in passages[s : s + batch]])
            width = max(len(e.ids) for e in encs)
            pad = lambda xs: [x + [0] * (width - len(x)) for x in xs]  # noqa: E731
            feed = {
                "input_ids": np.array(pad([e.ids for e in encs]), np.int64),
                "attention_mask": np.array(pad([e.attention_mask for e in encs]), np.int64),
                "token_type_ids": np.array(pad([e.type_ids for e in encs]), np.int64),
            }
            out += self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs})[0].reshape(-1).tolist()
        return out


def sigmoid(x):
    return 1 / (1 + np.exp(-np.asarray(x, float)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--queries", type=int, default=1, help="distinct queries per candidate count")
    args = ap.parse_args()

    from benchmarks.embed import scifact_chunks
    from sourcegate.pipelines.retrieval.rerank import OnnxCrossEncoder, safe_rerank

    rows = scifact_chunks(400, seed=3)
    queries = [json.loads(x)["text"] for x in (SCIFACT / "queries.jsonl").read_text().splitlines()[: args.queries]]
    scorer, bare = OnnxCrossEncoder(), BareSession(threads=2)
    res = Result(
        "rerank",
        target_ratio=TARGET_RATIO,
        model=scorer.model_id,
        repeats=args.repeats,
        queries=queries,
        onnx_intra_op_threads=2,
    )
    bare.one(queries[0], rows[0]["text"])  # warm-up
    res["cases"] = {}
    for m in (12, 100):
        groups = [[r["text"] for r in rows[i * m % len(rows) :][:m]] for i in range(len(queries))]
        t_pipe, t_bare = [], []
        for rep in range(args.repeats):
            for qi, (q, passages) in enumerate(zip(queries, groups)):

                def pipe():
                    scorer._memo.clear()  # real inference every time
                    r = safe_rerank(scorer, q, passages, timeout_s=600)
                    assert r is not None
                    return r

                order = [("pipeline", pipe), ("bare", lambda: bare.pairs(q, passages))]
                if (rep + qi) % 2:
                    order.reverse()
                for name, fn in order:
                    t, _ = timed(fn)
                    (t_pipe if name == "pipeline" else t_bare).append(t)
            log(
                f"{m} candidates rep {rep}: pipeline {np.median(t_pipe[-len(queries) :]):.2f}s, "
                f"bare {np.median(t_bare[-len(queries) :]):.2f}s, peak rss {peak_rss_mb()} MB"
            )
        p, b = np.median(t_pipe), np.median(t_bare)
        # same scores? (the pipeline's logits are exact one-pair runs)
        scorer._memo.clear()
        pipe_logits = [s for _, s in scorer.score(queries[0], groups[0])]
        single = bare.pairs(queries[0], groups[0])
        case = {
            "pipeline": {**stats_ms(t_pipe), "ms_per_pair_median": round(p / m * 1000, 2)},
            "bare": {**stats_ms(t_bare), "ms_per_pair_median": round(b / m * 1000, 2)},
            "ratio_pipeline_over_bare_throughput": round(float(b / p), 3),
            "pipeline_equals_bare_scores": bool(np.allclose(pipe_logits, single, atol=1e-6)),
            "peak_rss_mb": peak_rss_mb(),
        }
        case["batched"] = batched(bare, queries[0], groups[0], single, args.repeats)
        res["cases"][str(m)] = case
        log(f"{m}: ratio {case['ratio_pipeline_over_bare_throughput']}, batched {case['batched']}")
    res["session_options"] = session_options(rows, queries[0], args.repeats)
    res["met"] = all(c["ratio_pipeline_over_bare_throughput"] >= TARGET_RATIO for c in res["cases"].values())
    res.write()


def session_options(rows, query: str, repeats: int) -> dict:
    """One pair per run with other thread settings: 2 threads (as shipped), 1 thread, no spinning."""
    passages = [r["text"] for r in rows[:12]]
    sessions = {
        "threads_2_spinning (shipped)": BareSession(2),
        "threads_1": BareSession(1),
        "threads_2_no_spinning": BareSession(2, spinning=False),
    }
    times = {k: [] for k in sessions}
    cpu = {k: [] for k in sessions}
    for rep in range(repeats):
        names = list(sessions)[rep % 3 :] + list(sessions)[: rep % 3]
        for name in names:
            t, c, _ = timed_cpu(sessions[name].pairs, query, passages)
            times[name].append(t)
            cpu[name].append(c)
    return {
        k: {
            **stats_ms(v),
            "cpu_s_median": round(float(np.median(cpu[k])), 2),
            "pairs": len(passages),
            "peak_rss_mb": peak_rss_mb(),
        }
        for k, v in times.items()
    }


def batched(bare: BareSession, query: str, passages: list[str], single: list[float], repeats: int) -> dict:
    out = {}
    order_single = np.argsort(-np.asarray(single), kind="stable")
    for batch in sorted({8, 32, len(passages)}):
        ts = []
        for _ in range(repeats):
            t, logits = timed(bare.batched, query, passages, batch)
            ts.append(t)
        rev = bare.batched(query, passages[::-1], batch)[::-1]  # same pairs, other batch-mates/order
        logits = np.asarray(logits)
        order = np.argsort(-logits, kind="stable")
        out[f"batch_{batch}"] = {
            **stats_ms(ts),
            "speedup_vs_one_pair_per_run": None,
            "max_abs_logit_diff_vs_single": round(float(np.abs(logits - single).max()), 4),
            "max_abs_prob_diff_vs_single": round(float(np.abs(sigmoid(logits) - sigmoid(single)).max()), 5),
            "max_abs_logit_diff_reversed_order": round(float(np.abs(logits - np.asarray(rev)).max()), 4),
            "same_top1_as_single": bool(order[0] == order_single[0]),
            "same_top10_order_as_single": bool((order[:10] == order_single[:10]).all()),
            "peak_rss_mb": peak_rss_mb(),
        }
    t_single = [timed(bare.pairs, query, passages)[0] for _ in range(repeats)]
    for v in out.values():
        v["speedup_vs_one_pair_per_run"] = round(float(np.median(t_single) / (v["p50_ms"] / 1000)), 3)
    out["one_pair_per_run"] = stats_ms(t_single)
    return out


if __name__ == "__main__":
    main()
