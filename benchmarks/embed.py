"""Benchmark 1: the embedding stage vs the bare model.

`sourcegate.pipelines.build.embed.embed_chunks` (empty cache) vs `SentenceTransformer.encode(texts,
batch_size=32, normalize_embeddings=True)` on the same chunk texts (SciFact, ingested and
chunked by the pipeline's own steps, a seeded sample), same process, same model object,
interleaved repetitions with alternating order. Then variants on a smaller sample:
batch size, pre-sorting by length, torch threads, and whether the ONNX / OpenVINO
backends of sentence-transformers load offline here.

    .venv/bin/python -m benchmarks.embed [--texts 1000] [--repeats 3] [--variant-texts 200]
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

import numpy as np

from benchmarks._common import SCIFACT, Result, log, peak_rss_mb, rss_mb, stats_ms, timed, timed_cpu

TARGET_RATIO = 0.9


def scifact_chunks(n: int, seed: int = 0) -> list[dict]:
    """n chunk rows from SciFact via sourcegate.pipelines.build.ingest + sourcegate.pipelines.build.chunk (seeded sample)."""
    import pyarrow as pa  # noqa: F401

    from sourcegate.pipelines import models
    from sourcegate.pipelines.build.chunk import chunk_documents
    from sourcegate.pipelines.build.ingest import ingest

    with tempfile.TemporaryDirectory() as tmp:
        res = ingest(SCIFACT, Path(tmp), fmt="beir", max_doc_bytes=10**7)
        tok = models.tokenizer(str(models.embedding_model_path(None)))
        rows = chunk_documents(res.documents, tok, max_tokens=256, overlap=32)
    rows = list({r["text_hash"]: r for r in rows}.values())  # distinct texts: the pipeline dedups anyway
    random.Random(seed).shuffle(rows)
    return rows[:n]


def describe_texts(texts: list[str], tokenizer) -> dict:
    """What the timed texts were: how many, where from, their token lengths."""
    lengths = [len(tokenizer.encode(t).ids) for t in texts]
    return {
        "n": len(texts),
        "source": "SciFact corpus.jsonl -> sourcegate.pipelines.build.ingest -> sourcegate.pipelines.build.chunk "
        "(max 256 tokens, overlap 32), distinct texts, shuffled with seed 0",
        "tokens_mean": round(float(np.mean(lengths)), 1),
        "tokens_p50": int(np.median(lengths)),
        "tokens_max": int(max(lengths)),
    }


def throughput(n: int, seconds: float) -> float:
    return round(n / seconds, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variant-texts", type=int, default=200)
    ap.add_argument("--variant-repeats", type=int, default=3)
    ap.add_argument("--skip-variants", action="store_true")
    ap.add_argument("--presort", action="store_true", help="also time texts pre-sorted by length")
    args = ap.parse_args()

    import torch

    from benchmarks._common import versions
    from sourcegate.pipelines.build.embed import Embedder, embed_chunks

    res = Result(
        "embed",
        target_ratio=TARGET_RATIO,
        versions=versions(
            "sentence-transformers", "transformers", "torch", "onnxruntime", "optimum", "optimum-onnx", "openvino"
        ),
        torch_threads_default=torch.get_num_threads(),
    )
    rows = scifact_chunks(args.texts)
    texts = [r["text"] for r in rows]
    embedder = Embedder("sentence-transformers/all-MiniLM-L6-v2", None, batch_size=32)
    model = embedder.model
    res["texts"] = describe_texts(texts, embedder.tokenizer) | {"model_max_seq_length": embedder.max_tokens}
    log(f"{len(texts)} texts, mean {res['texts']['tokens_mean']:.0f} tokens; model loaded, rss {rss_mb()} MB")

    def pipeline():
        return embed_chunks(rows, embedder, {})[0]

    def raw():
        return model.encode(texts, batch_size=32, normalize_embeddings=True)

    # warm-up (first call pays lazy init), not timed
    model.encode(texts[:64], batch_size=32, normalize_embeddings=True)
    times = {"pipeline": [], "raw": []}
    cpu = {"pipeline": [], "raw": []}
    for rep in range(args.repeats):
        order = [("pipeline", pipeline), ("raw", raw)]
        if rep % 2:
            order.reverse()
        for name, fn in order:
            t, c, out = timed_cpu(fn)
            times[name].append(t)
            cpu[name].append(c)
            log(f"rep {rep} {name}: {t:.1f}s = {len(texts) / t:.1f} texts/s, peak rss {peak_rss_mb()} MB")
    p_med, r_med = np.median(times["pipeline"]), np.median(times["raw"])
    ratios = [r / p for p, r in zip(times["pipeline"], times["raw"])]
    res["main"] = {
        "pipeline": {**stats_ms(times["pipeline"]), "texts_per_s_median": throughput(len(texts), p_med)},
        "raw": {**stats_ms(times["raw"]), "texts_per_s_median": throughput(len(texts), r_med)},
        "ratio_pipeline_over_raw_throughput_median": round(float(r_med / p_med), 3),
        "ratio_per_pair": [round(x, 3) for x in ratios],
        "cpu_s_median": {k: round(float(np.median(v)), 2) for k, v in cpu.items()},
        "peak_rss_mb": peak_rss_mb(),
    }
    res["met"] = bool(r_med / p_med >= TARGET_RATIO)
    log(f"pipeline/raw throughput {r_med / p_med:.3f} (target >= {TARGET_RATIO})")
    # Same vectors? embed_chunks encodes in text-hash order, so compare by hash.
    vec_p = dict(zip([r["text_hash"] for r in rows], pipeline()))
    vec_r = raw()
    res["main"]["max_abs_diff_pipeline_vs_raw"] = float(
        max(np.abs(vec_p[r["text_hash"]] - vec_r[i]).max() for i, r in enumerate(rows))
    )

    if not args.skip_variants:
        res["variants"] = variants(model, texts[: args.variant_texts], args.variant_repeats, args.presort)
    res["backends"] = try_backends(embedder.path, texts[:32])
    res.write()


def variants(model, texts: list[str], repeats: int, presort: bool = False) -> dict:
    """Batch size, pre-sorted input and torch threads; interleaved round-robin per repetition."""
    import torch

    default_threads = torch.get_num_threads()
    by_len = sorted(texts, key=len)

    def enc(batch, items, threads=None):
        def run():
            if threads:
                torch.set_num_threads(threads)
            try:
                return model.encode(items, batch_size=batch, normalize_embeddings=True)
            finally:
                torch.set_num_threads(default_threads)

        return run

    cases = {f"batch_{b}": enc(b, texts) for b in (16, 32, 64, 128)}
    if presort:  # SentenceTransformer.encode already sorts each call's texts by length (longest first)
        cases["batch_32_presorted_by_length"] = enc(32, by_len)
    cases["batch_32_threads_1"] = enc(32, texts, 1)
    if os_cores() > 2:
        cases[f"batch_32_threads_{os_cores()}"] = enc(32, texts, os_cores())
    times: dict[str, list[float]] = {k: [] for k in cases}
    peaks: dict[str, float] = {}
    for rep in range(repeats):
        names = list(cases)
        names = names[rep % len(names) :] + names[: rep % len(names)]  # rotate the order each repetition
        for name in names:
            t, _ = timed(cases[name])
            times[name].append(t)
            peaks[name] = peak_rss_mb()
            log(f"variant rep {rep} {name}: {t:.1f}s ({len(texts) / t:.1f} texts/s)")
    base = np.median(times["batch_32"])
    return {
        "texts": len(texts),
        "repeats": repeats,
        "torch_threads_default": default_threads,
        "cases": {
            k: {
                **stats_ms(v),
                "texts_per_s_median": throughput(len(texts), float(np.median(v))),
                "speed_vs_batch_32": round(float(base / np.median(v)), 3),
                "peak_rss_mb": peaks[k],
            }
            for k, v in times.items()
        },
    }


def os_cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


def try_backends(path, sample: list[str]) -> dict:
    """Does SentenceTransformer(backend=...) load offline here? (Needs optimum / openvino.)"""
    from sentence_transformers import SentenceTransformer

    out = {}
    for backend in ("onnx", "openvino"):
        try:
            m = SentenceTransformer(str(path), device="cpu", backend=backend)
            t, _ = timed(m.encode, sample, batch_size=32, normalize_embeddings=True)
            out[backend] = {"works": True, "seconds_for_32": round(t, 3)}
        except Exception as exc:  # report, don't fail
            out[backend] = {"works": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        log(f"backend {backend}: {out[backend]}")
    return out


if __name__ == "__main__":
    main()
