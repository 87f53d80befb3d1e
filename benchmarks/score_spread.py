"""Benchmark 24: how far the scores that decide the gate move with the worker that computes them.

The gate's verdict reads `answer_support` (the in-domain answer model, window answerability.answer_passages),
`rerank_top` and `cosine_top` of the fit set's decisive questions. This scores those questions on one index
version under settings a pool of workers differs in: onnxruntime intra-op threads, torch threads, oneDNN's
instruction-set cap (ONEDNN_MAX_CPU_ISA: AMX, AVX512-BF16 or AVX2 kernels), the embedding backend
(torch-bf16 or torch fp32) and the embedding batch size. Each setting runs in its own process (the ISA cap
and thread pools are fixed at import), re-encodes the index's chunks with its own embedder (a night runs
wholly on one kind of worker) and reports per question the three signals, their logits and the chunk ids
the window and the rerank head read. The spread is each setting's largest difference from the baseline.

A counterfactual the code does not do is measured too: the window's pairs scored as one padded batch
(the INT8 model quantises activations per batch), to show what one pair per run buys.

    nice -n 10 python -m benchmarks.score_spread --run /work/main/artifacts/runs/20261205-122851
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from benchmarks._common import RESULTS, ROOT, finished, machine

QUESTIONS = ("u-a-053", "g-a-010", "g-a-029", "d-013", "g-o-006")  # the fit set's decisive questions
FIT_SET = ROOT / "config" / "evals" / "calibration.jsonl"
BASE = {"ort_threads": 2, "torch_threads": 2, "backend": "torch-bf16", "embed_batch": 32, "isa": None}
# Settings of one ISA cap run in one process, in this order: the ORT thread change last, as it empties the pair memo.
SETTINGS = {
    "baseline": {},
    "torch_threads_1": {"torch_threads": 1},
    "embed_batch_1": {"embed_batch": 1},
    "fp32": {"backend": "torch"},
    "fp32_embed_batch_1": {"backend": "torch", "embed_batch": 1},
    "ort_threads_1": {"ort_threads": 1},
    "isa_avx512_core_bf16": {"isa": "AVX512_CORE_BF16"},  # no AMX: the AVX512-BF16 kernel
    "isa_avx2": {"isa": "AVX2"},  # no bf16 unit: emulated
    "fp32_isa_avx2": {"backend": "torch", "isa": "AVX2"},
}
SIGNALS = ("answer_support", "rerank_top", "cosine_top")


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _with_threads(model, threads: int) -> None:
    """The model's session again with `threads` intra-op threads (the shipped class fixes 2)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    model.session = ort.InferenceSession(model.model_of(model.folder), options, providers=["CPUExecutionProvider"])


def _batched_logits(model, query: str, passages: list[str]) -> list[float]:
    """All pairs in one padded session run: what the one-pair-per-run rule avoids."""
    import numpy as np

    encs = [model.tokenizer.encode(query, p) for p in passages]
    width = max(len(e.ids) for e in encs)

    def pad(rows):
        return np.asarray([r + [0] * (width - len(r)) for r in rows], np.int64)

    feed = {
        "input_ids": pad([e.ids for e in encs]),
        "attention_mask": pad([e.attention_mask for e in encs]),
        "token_type_ids": pad([e.type_ids for e in encs]),
    }
    feed = {k: v for k, v in feed.items() if k in model.inputs}
    return [float(x) for x in np.asarray(model.session.run(None, feed)[0]).reshape(-1)]


def score(run: Path, settings: dict[str, dict]) -> dict:
    """The decisive questions' signals on `run`'s index under each of `settings` (names to settings), in this
    process: models load once; a changed thread count rebuilds the sessions and empties the pair memo, so no
    setting reads another's scores."""
    import numpy as np
    import torch

    from sourcegate.pipelines import config
    from sourcegate.pipelines.build.embed_backends import bf16_kernel, load_embedder
    from sourcegate.pipelines.retrieval.answer_support import load_answer_model
    from sourcegate.pipelines.retrieval.answerability import content_terms
    from sourcegate.pipelines.retrieval.rerank import load_scorer
    from sourcegate.pipelines.retrieval.retriever import Retriever
    from sourcegate.pipelines.search.analyzer import STOPWORDS
    from sourcegate.pipelines.search.embedded import EmbeddedSearcher

    cfg = config.load(ROOT / "config" / "pipeline.yaml", {"answerability.answer_passages": 10})
    searcher = EmbeddedSearcher(run / "index")
    stored = np.asarray(searcher.vectors)
    texts = searcher.table.column("text").to_pylist()
    reranker = load_scorer("onnx")
    answer = load_answer_model(ROOT / cfg.answerability.answer_model_path)
    members = getattr(answer, "members", [answer])
    asks = {r["id"]: r["question"] for r in map(json.loads, FIT_SET.read_text().splitlines()) if r["id"] in QUESTIONS}
    embedders, ort_threads, results = {}, None, {}
    for name, setting in settings.items():
        torch.set_num_threads(setting["torch_threads"])
        key = (setting["backend"], setting["embed_batch"])
        if key not in embedders:
            embedders[key] = load_embedder(cfg.embedding.model_id, None, setting["embed_batch"], setting["backend"])
        embedder = embedders[key]
        searcher.vectors = np.asarray(embedder.encode(texts), np.float32)  # the night's index, on this worker
        if setting["ort_threads"] != ort_threads:
            for model in (reranker, *members):
                _with_threads(model, setting["ort_threads"])
                model._memo.clear()
            ort_threads = setting["ort_threads"]
        retriever = Retriever.from_config(searcher, embedder, reranker, cfg, answer_scorer=answer)
        vectors = retriever.text_vectors([asks[q] for q in QUESTIONS])
        out = {}
        for qid, vector in zip(QUESTIONS, vectors):
            query = asks[qid]
            fused, found = retriever.fuse(query, vector, content_terms(query, STOPWORDS))
            result, _ = retriever.rerank(query, fused)
            window = [c.text for c in fused[: cfg.answerability.answer_passages]]
            each = [[logit for _, logit in m.score(query, window)] for m in members]
            batched = [_batched_logits(m, query, window) for m in members] if setting.get("batched") else None
            answer_logit = float(np.mean([max(row) for row in each]))
            out[qid] = {
                "answer_support": 1.0 / (1.0 + math.exp(-answer_logit)),
                "answer_support_logit": answer_logit,
                "rerank_top": max(result.probabilities),
                "rerank_top_logit": max(result.logits),
                "cosine_top": found.best_cosine,
                "window": [c.chunk_id for c in fused[: cfg.answerability.answer_passages]],
                "head": [c.chunk_id for c in fused[: cfg.retrieval.rerank_depth]],
                "member_logits": each,
                "member_logits_batched": batched,
            }
        results[name] = {
            "setting": setting,
            "kernel": bf16_kernel(),
            "index_vectors_vs_stored_max_abs": float(np.max(np.abs(searcher.vectors - stored))),
            "torch_threads": torch.get_num_threads(),
            "questions": out,
        }
    return results


def spread(base: dict, other: dict) -> dict:
    """Largest absolute difference per signal (probability and logit), and which windows changed."""
    out = {}
    for name in SIGNALS:
        diffs = [abs(other[q][name] - base[q][name]) for q in QUESTIONS]
        out[name] = {"max_abs": max(diffs), "by_question": dict(zip(QUESTIONS, diffs))}
        if name != "cosine_top":
            key = f"{name}_logit"
            out[name]["max_abs_logit"] = max(abs(other[q][key] - base[q][key]) for q in QUESTIONS)
    out["windows_changed"] = [q for q in QUESTIONS if other[q]["window"] != base[q]["window"]]
    out["heads_changed"] = [q for q in QUESTIONS if other[q]["head"] != base[q]["head"]]
    return out


def batching_spread(base: dict) -> dict:
    """One pair per run against the window's pairs in one padded batch, per pair logit."""
    diffs = [
        abs(a - b)
        for q in QUESTIONS
        for one, many in zip(base[q]["member_logits"], base[q]["member_logits_batched"])
        for a, b in zip(one, many)
    ]
    return {"pairs": len(diffs), "max_abs_logit": max(diffs), "median_abs_logit": sorted(diffs)[len(diffs) // 2]}


def run_group(run: Path, isa: str | None) -> dict:
    """The settings with one ISA cap, in a fresh process: oneDNN reads the cap when it loads."""
    group = {n: {**BASE, **s, "batched": n == "baseline"} for n, s in SETTINGS.items() if s.get("isa") == isa}
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.score_spread", "--run", str(run), "--worker", json.dumps(group)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"settings with ISA cap {isa} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="a demo night's run folder (read only)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS / "score_spread.json")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(score(args.run, json.loads(args.worker))))
        return 0
    result = {"benchmark": "score_spread", "machine": machine(), "run": str(args.run), "questions": list(QUESTIONS)}
    runs = {}
    for isa in dict.fromkeys(s.get("isa") for s in SETTINGS.values()):
        runs.update(run_group(args.run, isa))
    base = runs["baseline"]["questions"]
    result["settings"] = runs
    result["spread"] = {name: spread(base, r["questions"]) for name, r in runs.items() if name != "baseline"}
    result["batching_counterfactual"] = batching_spread(base)
    return finished(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
