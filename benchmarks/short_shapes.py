"""Benchmark 22: would shorter fixed shapes make torch-bf16's short texts cheaper without moving
their vectors? (issue #24; docs/benchmarks/15-embed-backends.md found words and questions 2.3x dearer at length 32).

Encodes a seeded sample of a demo index's words, and its sentences of at most 16 tokens, through
`Bf16Embedder._forward` at the shipped shortest length (32) and at 8 and 16; reports the largest
vector difference and the cost of one 8-row pass at each length (interleaved, medians).

    python -m benchmarks.short_shapes --chunks /tmp/speed/artifacts/runs/<run>/chunks.parquet
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow.parquet as pq

from benchmarks._common import Result
from sourcegate.pipelines.build.embed_backends import BF16, Bf16Embedder
from sourcegate.pipelines.retrieval.answerability import split_sentences
from sourcegate.pipelines.search.bm25 import tokenize


def encode_at(embedder: Bf16Embedder, texts: list[str], length: int) -> np.ndarray:
    rows = BF16["rows"]
    parts = [
        embedder._forward(texts[i : i + rows], length)[: len(texts[i : i + rows])] for i in range(0, len(texts), rows)
    ]
    return np.concatenate(parts)


def token_counts(embedder: Bf16Embedder, texts: list[str]) -> list[int]:
    return [len(ids) for ids in embedder._tok(texts, truncation=True, max_length=embedder.max_tokens)["input_ids"]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", required=True, help="a chunks.parquet of a demo night")
    ap.add_argument("--words", type=int, default=240)
    args = ap.parse_args()
    embedder = Bf16Embedder("sentence-transformers/all-MiniLM-L6-v2")
    texts = pq.read_table(args.chunks, columns=["text"])["text"].to_pylist()
    words = sorted({w for t in texts for w in tokenize(t)})
    sample = [str(w) for w in np.random.default_rng(0).choice(words, args.words, replace=False)]
    sentences = sorted({s for t in texts for s in split_sentences(t)})
    short = [s for s, n in zip(sentences, token_counts(embedder, sentences)) if n <= 16][:80]
    res = Result("short_shapes", vocabulary=len(words), sentences=len(sentences), sentences_le_16_tokens=len(short))
    for name, group in (("words", sample), ("sentences <= 16 tokens", short)):
        reference = encode_at(embedder, group, 32)
        longest = max(token_counts(embedder, group))
        res[name] = {
            f"max_abs_diff_len_{n}_vs_32": float(np.abs(encode_at(embedder, group, n) - reference).max())
            for n in (8, 16)
            if longest <= n
        } | {"n": len(group), "longest_tokens": longest}
    seconds: dict[int, list[float]] = {n: [] for n in (8, 16, 32)}
    for _ in range(3):
        for n in seconds:
            t = time.perf_counter()
            for _ in range(10):
                embedder._forward(sample[: BF16["rows"]], n)
            seconds[n].append((time.perf_counter() - t) / 10)
    res["ms_per_8_row_pass"] = {n: round(float(np.median(v)) * 1000, 1) for n, v in seconds.items()}
    res.write()


if __name__ == "__main__":
    main()
