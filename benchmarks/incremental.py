"""Benchmark 2: incremental vs full rebuild with sourcegate.pipelines.app.steps.

Part A (real, both sides measured): a SciFact subset (default 2000 documents). Each
repetition builds it from scratch (ingest -> chunk -> embed -> merge -> validate -> load,
every text encoded), then rebuilds after editing 1% of the documents in a copy of
corpus.jsonl (only changed chunks are encoded; the rest come from the embed cache).
Repetitions are interleaved: full, incremental, full, incremental, ...

Part B (scaling): corpora of 1x, 4x, 16x SciFact (copies of each document with new ids and
perturbed text). The baseline build of each runs every step for real, but with a stand-in
embedder (seeded random unit vectors under the real model id) so the baseline costs
minutes, not hours; the incremental rebuilds that follow use the REAL embedder and change
a fixed number of documents (1% of 1x), so cost per changed document shows what grows
with corpus size. A full build's embed time at each scale is ESTIMATED as chunks x the
per-chunk encode cost measured in part A (said so in the JSON).

    .venv/bin/python -m benchmarks.incremental [--docs 2000] [--repeats 3] [--scales 1,4,16]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import time
from pathlib import Path

import numpy as np

from benchmarks._common import SCIFACT, Result, log, median, peak_rss_mb

WORK = Path("/tmp/sgbench-incremental")
TARGET = 0.10
STEPS = ("ingest", "chunk", "embed", "merge", "validate", "load")


# --- corpora -------------------------------------------------------------------------


def read_docs(limit: int | None = None) -> list[dict]:
    lines = (SCIFACT / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    docs = [json.loads(x) for x in lines if x.strip()]
    return docs[:limit] if limit else docs


def perturb(text: str, rng: random.Random, share: float = 0.1) -> str:
    """Replace ~share of the words by other words of the same text (new text hash, same flavour)."""
    words = text.split()
    for i in rng.sample(range(len(words)), max(1, int(len(words) * share))):
        words[i] = rng.choice(words)
    return " ".join(words)


def scaled(docs: list[dict], scale: int) -> list[dict]:
    out = list(docs)
    for c in range(1, scale):
        for d in docs:
            rng = random.Random(f"{d['_id']}-{c}")
            out.append({**d, "_id": f"{d['_id']}-s{c}", "text": perturb(d["text"], rng)})
    return out


def edited(docs: list[dict], ids: set[str], tag: str) -> list[dict]:
    """Copy of docs with the text of `ids` edited (a sentence appended, a few words changed)."""
    out = []
    for d in docs:
        if d["_id"] in ids:
            rng = random.Random(f"edit-{tag}-{d['_id']}")
            d = {**d, "text": perturb(d["text"], rng, 0.03) + f" Revised ({tag}): results were re-checked."}
        out.append(d)
    return out


def write_corpus(docs: list[dict], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps(d) + "\n")
    return folder


# --- the build -----------------------------------------------------------------------


class StandInEmbedder:
    """Seeded random unit vectors under the real model id: a baseline without hours of encoding."""

    fingerprint = "stand-in:seeded-random-unit-vectors"  # never the real model's: no cache reuse across them

    def __init__(self, model_id: str, dimension: int = 384):
        self.model_id, self.dimension = model_id, dimension

    def encode(self, texts, progress=False):
        out = np.empty((len(texts), self.dimension), np.float32)
        for i, t in enumerate(texts):
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")
            v = np.random.default_rng(seed).standard_normal(self.dimension).astype(np.float32)
            out[i] = v / np.linalg.norm(v)
        return out


def config(artifacts: Path, corpus: Path) -> dict:
    from sourcegate.pipelines import config as config_mod

    return config_mod.load(
        "config/pipeline.yaml",
        {
            "artifacts": str(artifacts),
            "corpus.path": str(corpus),
            "corpus.format": "beir",
            "corpus.max_doc_bytes": 10**7,
        },
    )


def build(cfg: dict, run_id: str, embedder, use_cache: bool) -> dict:
    """ingest -> chunk -> embed -> merge -> validate -> load, each step timed."""
    from sourcegate import api as steps

    t: dict[str, float] = {}
    out: dict = {}

    def step(name, fn, *a, **k):
        s = time.perf_counter()
        r = fn(*a, **k)
        t[name] = round(time.perf_counter() - s, 3)
        return r

    out["ingest"] = step("ingest", steps.ingest_step, cfg, run_id)
    out["chunks"] = step("chunk", steps.chunk_step, cfg, run_id)
    stats = step("embed", steps.embed_step, cfg, run_id, embedder=embedder, use_cache=use_cache)
    step("merge", steps.merge_step, cfg, run_id, [stats])
    ok = step("validate", steps.validate_step, cfg, run_id)
    out["indexed"] = step("load", steps.load_step, cfg, run_id)
    if not ok:
        raise RuntimeError(f"{run_id}: validation failed")
    c = out["ingest"]
    return {
        "seconds": t,
        "total_s": round(sum(t.values()), 3),
        "encoded": stats["encoded"],
        "reused": stats["reused"],
        "chunks": out["chunks"],
        "documents": c["documents"],
        "changed": c["changed"],
        "added": c["added"],
        "peak_rss_mb": peak_rss_mb(),
    }


# --- part A --------------------------------------------------------------------------


def part_a(embedder, n_docs: int, repeats: int) -> dict:
    docs = read_docs(n_docs)
    n_changed = max(1, round(len(docs) * 0.01))
    base = write_corpus(docs, WORK / "a" / "corpus-base")
    changed_ids = set(random.Random(1).sample([d["_id"] for d in docs], n_changed))
    after = write_corpus(edited(docs, changed_ids, "a"), WORK / "a" / "corpus-edited")
    fulls, incrs = [], []
    for rep in range(repeats):
        arts = WORK / "a" / f"artifacts-{rep}"
        shutil.rmtree(arts, ignore_errors=True)
        fulls.append(build(config(arts, base), "r1-full", embedder, use_cache=False))
        log(f"A rep {rep} full: {fulls[-1]['total_s']}s {fulls[-1]['seconds']}")
        incrs.append(build(config(arts, after), "r2-incremental", embedder, use_cache=True))
        log(f"A rep {rep} incremental: {incrs[-1]['total_s']}s {incrs[-1]['seconds']} encoded {incrs[-1]['encoded']}")
        shutil.rmtree(arts, ignore_errors=True)
    full_med = median([f["total_s"] for f in fulls])
    incr_med = median([i["total_s"] for i in incrs])
    per_step = {
        s: {
            "full_s_median": median([f["seconds"][s] for f in fulls]),
            "incremental_s_median": median([i["seconds"][s] for i in incrs]),
        }
        for s in STEPS
    }
    embed_per_chunk = median([f["seconds"]["embed"] / f["encoded"] for f in fulls])
    return {
        "documents": len(docs),
        "changed_documents": n_changed,
        "chunks": fulls[0]["chunks"],
        "full_total_s_median": full_med,
        "incremental_total_s_median": incr_med,
        "ratio_incremental_over_full": round(incr_med / full_med, 4),
        "ratio_per_pair": [round(i["total_s"] / f["total_s"], 4) for f, i in zip(fulls, incrs)],
        "per_step": per_step,
        "embed_s_per_encoded_chunk_median": round(embed_per_chunk, 5),
        "full_runs": fulls,
        "incremental_runs": incrs,
        "met": incr_med / full_med <= TARGET,
    }


# --- part B --------------------------------------------------------------------------


def part_b(
    embedder,
    scales: list[int],
    repeats: int,
    embed_per_chunk: float,
    base_docs: int = 0,
    out: dict | None = None,
    save=lambda: None,
) -> dict:
    base_docs = read_docs(base_docs or None)
    n_changed = max(1, round(len(base_docs) * 0.01))
    out = {} if out is None else out
    for scale in scales:
        docs = scaled(base_docs, scale)
        folder = WORK / f"b-x{scale}"
        shutil.rmtree(folder, ignore_errors=True)
        arts = folder / "artifacts"
        baseline = build(
            config(arts, write_corpus(docs, folder / "corpus-0")),
            "r0-baseline",
            StandInEmbedder(embedder.model_id),
            use_cache=False,
        )
        log(f"B x{scale} baseline (stand-in embedder): {baseline['total_s']}s {baseline['seconds']}")
        ids = [d["_id"] for d in base_docs]  # change original docs (each is in every scale)
        rng = random.Random(scale)
        current, runs = docs, []
        for rep in range(repeats):
            picked = set(rng.sample(ids, n_changed))
            ids = [i for i in ids if i not in picked]
            current = edited(current, picked, f"b{rep}")  # cumulative: each rebuild sees n_changed new edits
            corpus = write_corpus(current, folder / f"corpus-{rep + 1}")
            runs.append(build(config(arts, corpus), f"r{rep + 1}-incremental", embedder, use_cache=True))
            log(
                f"B x{scale} incremental {rep}: {runs[-1]['total_s']}s {runs[-1]['seconds']} "
                f"encoded {runs[-1]['encoded']}"
            )
        chunks = baseline["chunks"]
        non_embed_full = sum(v for k, v in baseline["seconds"].items() if k != "embed")
        est_full = non_embed_full + chunks * embed_per_chunk
        incr_med = median([r["total_s"] for r in runs])
        out[f"x{scale}"] = {
            "documents": len(docs),
            "chunks": chunks,
            "changed_documents_per_rebuild": n_changed,
            "baseline_measured_steps_s": baseline["seconds"],
            "baseline_note": "baseline embed step used a stand-in embedder (random vectors); its embed time is "
            "not a real encode",
            "full_build_estimated_s": round(est_full, 1),
            "full_build_estimate_method": f"measured non-embed steps ({non_embed_full:.1f}s) + {chunks} chunks x "
            f"{embed_per_chunk * 1000:.1f} ms/chunk (part A's measured encode cost)",
            "incremental_total_s_median": incr_med,
            "incremental_per_step_s_median": {s: median([r["seconds"][s] for r in runs]) for s in STEPS},
            "cost_per_changed_document_s": round(incr_med / n_changed, 4),
            "ratio_incremental_over_estimated_full": round(incr_med / est_full, 4),
            "incremental_runs": runs,
            "peak_rss_mb": peak_rss_mb(),
        }
        shutil.rmtree(folder, ignore_errors=True)
        save()  # keep finished scales even if a larger one is interrupted
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=2000, help="part A subset size (0 = all 5183)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scales", default="1,4,16")
    ap.add_argument("--base-docs", type=int, default=0, help="part B 1x size (0 = all 5183)")
    ap.add_argument("--skip-a", action="store_true", help="reuse part A from an earlier result file")
    args = ap.parse_args()

    from sourcegate.pipelines.build.embed import Embedder

    embedder = Embedder("sentence-transformers/all-MiniLM-L6-v2", None, 32)
    res = Result("incremental", target_ratio=TARGET, work_dir=str(WORK))
    out_path = Path(__file__).parent / "results" / "incremental.json"
    if args.skip_a and out_path.exists():
        res["part_a"] = json.loads(out_path.read_text())["part_a"]
    else:
        res["part_a"] = part_a(embedder, args.docs or None, args.repeats)
        res.write()  # keep part A even if part B is interrupted
    a = res["part_a"]
    res["met"] = a["met"]
    log(f"A: incremental/full = {a['ratio_incremental_over_full']} (target <= {TARGET})")
    scales = [int(s) for s in args.scales.split(",") if s]
    res["part_b"] = {}
    part_b(
        embedder,
        scales,
        args.repeats,
        a["embed_s_per_encoded_chunk_median"],
        args.base_docs,
        out=res["part_b"],
        save=res.write,
    )
    res.write()


if __name__ == "__main__":
    main()
