"""docs/benchmarks/20-evaluate-speed.md, "The cross-encoder in bf16": could the reranker's pairs be batched in bf16
(the CPU's AMX units, fixed shapes as the bi-encoder's torch-bf16 backend runs them) instead of one INT8 pair per
session run? The same pairs three ways in one process: the shipped INT8 scorer (one pair per run, two side by side),
and the packaged model dequantised into torch (`training.base_model.packaged_base`) in bf16 and in fp32, `ROWS`
pairs a forward pass padded to one of `LENGTHS`. Reports seconds, the logits' distance to the INT8 ones, and whether a
pair's logit moves with its batch-mates (alone, and among other pairs).

    python -m benchmarks.cross_encoder_bf16 --pairs 300 --out benchmarks/results/cross_encoder_bf16.json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._common import ROOT, finished, machine, uptime
from benchmarks.pair_scoring import sample_pairs

ROWS = 8  # pairs a forward pass: the bi-encoder's bf16 shape (docs/benchmarks/15-embed-backends.md)
LENGTHS = (64, 128, 256, 512)  # padded lengths; 512 is the cross-encoder's truncation


class Batched:
    """The dequantised cross-encoder, `ROWS` pairs a pass padded to the first length that holds the longest."""

    def __init__(self, folder: str, dtype: str):
        import torch
        from transformers import AutoTokenizer, BertForSequenceClassification

        self.torch, self.dtype = torch, dtype
        self.model = BertForSequenceClassification.from_pretrained(folder).eval()
        self.tok = AutoTokenizer.from_pretrained(folder)

    def lengths(self, pairs):
        enc = self.tok([q for q, _ in pairs], [p for _, p in pairs], truncation=True, max_length=LENGTHS[-1])
        return [next(n for n in LENGTHS if n >= len(ids)) for ids in enc["input_ids"]]

    def forward(self, pairs, length: int) -> np.ndarray:
        torch = self.torch
        filled = list(pairs) + [("", "")] * (ROWS - len(pairs))
        enc = self.tok(
            [q for q, _ in filled],
            [p for _, p in filled],
            padding="max_length",
            truncation=True,
            max_length=length,
            return_tensors="pt",
        )
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.dtype == "bf16"):
            return self.model(**enc).logits.float().reshape(-1)[: len(pairs)].numpy()

    def score(self, pairs) -> np.ndarray:
        out, by_length = np.zeros(len(pairs)), {}
        for i, length in enumerate(self.lengths(pairs)):
            by_length.setdefault(length, []).append(i)
        for length, members in sorted(by_length.items()):
            for start in range(0, len(members), ROWS):
                batch = members[start : start + ROWS]
                out[batch] = self.forward([pairs[i] for i in batch], length)
        return out


def main(argv=None) -> int:
    import torch

    from sourcegate.pipelines.retrieval.rerank import OnnxCrossEncoder
    from sourcegate.pipelines.training.base_model import packaged_base

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/cross_encoder_bf16.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    pairs = sample_pairs(args.pairs)
    result = {"benchmark": "cross_encoder_bf16", "machine": machine(), "load_start": uptime(), "pairs": len(pairs)}
    int8 = OnnxCrossEncoder()
    int8.logit(*pairs[0])  # warm
    t = time.perf_counter()
    int8.prefetch(pairs)
    result["int8 one pair per run, two side by side"] = round(time.perf_counter() - t, 2)
    reference = np.array([int8.logit(*p) for p in pairs])
    with tempfile.TemporaryDirectory() as work:
        folder = packaged_base(Path(work) / "base")
        for dtype in ("bf16", "fp32"):
            model = Batched(folder, dtype)
            model.score(pairs[:ROWS])  # warm
            t = time.perf_counter()
            logits = model.score(pairs)
            seconds = round(time.perf_counter() - t, 2)
            alone = model.score(pairs[:16][::-1])[::-1]
            mixed = model.score(pairs[:16] + pairs[100:130])[:16]
            result[f"torch {dtype}, {ROWS} pairs a pass"] = {
                "seconds": seconds,
                "int8_seconds_over_these": round(result["int8 one pair per run, two side by side"] / seconds, 2),
                "max_abs_logit_vs_int8": round(float(np.abs(logits - reference).max()), 4),
                "mean_abs_logit_vs_int8": round(float(np.abs(logits - reference).mean()), 4),
                "max_abs_logit_moved_by_batch_mates": float(
                    max(np.abs(alone - logits[:16]).max(), np.abs(mixed - logits[:16]).max())
                ),
            }
        result["padded_lengths"] = {n: model.lengths(pairs).count(n) for n in LENGTHS}
    return finished(result, Path(args.out))


if __name__ == "__main__":
    raise SystemExit(main())
