"""Benchmark 14: a 1%-changed night on a large embedded index, each step in its own process.

A synthetic BEIR corpus (`--docs` documents of 30-60 pseudo-words from a Zipf-distributed
30,000-word vocabulary, one chunk each) is built once as the base version: ingest, chunk,
validate and load run for real, but the base's vectors are SYNTHETIC (seeded random unit
vectors under the real model id and fingerprint) because encoding 1M chunks would take a day
on this machine. The night then edits `--changed` (default 1%) of the documents (a few words changed, a sentence
added) and runs the pipeline's steps for real, each in a child process so each step's peak RSS
is its own: ingest, chunk, embed (the REAL model encodes the changed chunks; every other vector
comes from the previous run's cache), merge, validate, load, and `serve` (open the new version
and answer 20 hybrid queries with random unit query vectors: what the index needs to serve).
Evaluation and the gate are skipped: the demo's eval sets do not label this corpus, and the
cross-encoder's cost does not depend on the corpus size.

Per step: wall seconds, peak RSS (ru_maxrss: it counts the touched pages of memory-mapped files
too) and peak anonymous RSS (RssAnon sampled every 50 ms: memory that is not a mapped file).

    nice -n 10 .venv/bin/python -m benchmarks.night_1m --docs 100000,1000000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks._common import ROOT, Result, log
from sourcegate.artifact_io.run_folder import RunFolder

WORK = Path("/tmp/sgbench-night")
BASE_RUN, NIGHT_RUN = "20260101-000000", "20260102-000000"
NIGHT_STEPS = ("ingest", "chunk", "embed", "merge", "validate", "load", "serve")
GOAL_WALL_S, GOAL_RSS_MB = 600, 4096


# --- the synthetic corpus --------------------------------------------------------------------


def vocabulary(n: int = 30_000, seed: int = 7) -> list[str]:
    rng = np.random.default_rng(seed)
    syllables = [c + v for c in "bcdfghklmnprstvz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    words: dict[str, None] = {}
    while len(words) < n:
        k = int(rng.integers(2, 5))
        words["".join(syllables[i] for i in rng.integers(0, len(syllables), k))] = None
    return list(words)


def write_corpus(path: Path, docs: int, changed: float = 0.0, seed: int = 11) -> int:
    """corpus.jsonl with `docs` documents; `changed` of them (chosen by `seed`) edited. Returns how many."""
    vocab = np.array(vocabulary())
    ranks = np.arange(1, len(vocab) + 1)
    p = (1 / ranks) / (1 / ranks).sum()
    edit = np.random.default_rng(seed + 1).random(docs) < changed
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for start in range(0, docs, 10_000):
            rng = np.random.default_rng([seed, start])  # each block seeded alone: the same text whatever `changed`
            n = min(10_000, docs - start)
            lengths = rng.integers(30, 61, n)
            words = vocab[rng.choice(len(vocab), int(lengths.sum()) + 3 * n, p=p)]
            pos = 0
            for i in range(n):
                title = " ".join(words[pos : pos + 3]).capitalize()
                body = " ".join(words[pos + 3 : pos + 3 + lengths[i]])
                pos += 3 + lengths[i]
                if edit[start + i]:
                    body = body.replace(" ", " revised ", 2) + " The figures were re-checked last night."
                fh.write(json.dumps({"_id": f"d{start + i:08d}", "title": title, "text": body + "."}) + "\n")
    tmp.replace(path)
    return int(edit.sum())


# --- one step in its own process -------------------------------------------------------------


class AnonPeak:
    """Peak RssAnon of this process, sampled (the kernel keeps a peak only for the total RSS)."""

    def __init__(self, every_s: float = 0.05):
        self.peak_kb, self.every_s, self._stop = 0, every_s, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                self.peak_kb = max(self.peak_kb, int(line.split()[1]))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self):
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()


def synthetic_embed(cfg: dict, run_id: str) -> dict:
    """The base's chunks.parquet: chunks.text + seeded random unit vectors under the real model's id and fingerprint,
    written as the embed step writes it (its schema, batches.write_batches)."""
    from sourcegate import api as steps
    from sourcegate.pipelines.batches import iter_batches, write_batches
    from sourcegate.pipelines.build.embed import chunks_schema, with_vectors

    run = RunFolder(cfg.artifacts, run_id)
    model_id, fingerprint, dim = cfg.embedding.model_id, steps.embedding_fingerprint(cfg), 384

    def tables():
        for i, table in enumerate(iter_batches(run / "chunks.text.parquet", rows=65_536)):
            v = np.random.default_rng([3, i]).standard_normal((table.num_rows, dim), dtype=np.float32)
            yield with_vectors(table, v / np.linalg.norm(v, axis=1, keepdims=True), model_id, fingerprint)

    rows = write_batches(tables(), run / "chunks.parquet", chunks_schema(dim))
    run.update_info(models={"embedding": {"id": model_id, "dimension": dim, "fingerprint": fingerprint}}, counts={})
    return {"rows": rows, "synthetic": True}


def serve(cfg: dict, run_id: str, queries: int = 20) -> dict:
    """Open the version (verified by size; SHA-256 of 1 GB of files is load's business) and answer queries."""
    from sourcegate import api as steps

    t = time.perf_counter()
    searcher = steps.open_store(cfg).open(run_id, hashes=False)
    opened = time.perf_counter() - t
    words = vocabulary()
    rng = np.random.default_rng(5)
    times = []
    for _ in range(queries):
        q = " ".join(words[i] for i in rng.integers(0, 2000, 4))
        v = rng.standard_normal(searcher.vectors.shape[1]).astype(np.float32)
        t = time.perf_counter()
        searcher.hybrid(q, v / np.linalg.norm(v), 18, 18)
        times.append(time.perf_counter() - t)
    return {"open_s": round(opened, 2), "query_p50_ms": round(float(np.median(times)) * 1000, 1)}


def run_step(step: str, cfg, run_id: str) -> object:
    from sourcegate import api as steps

    run = RunFolder(cfg.artifacts, run_id)
    stats_file = run.path / "embed" / "stats.json"  # embed's stats, read by merge

    def embed() -> dict:
        stats = steps.embed_step(run, cfg.embedding, 0, 1)
        stats_file.write_text(json.dumps([stats]))
        return stats

    runners = {
        "ingest": lambda: steps.ingest_step(run, cfg),
        "chunk": lambda: steps.chunk_step(run, cfg.chunking, cfg.embedding),
        "synthetic_embed": lambda: synthetic_embed(cfg, run_id),
        "embed": embed,
        "merge": lambda: steps.merge_step(run, cfg.embedding, json.loads(stats_file.read_text())),
        "validate": lambda: steps.validate_step(run),
        "load": lambda: steps.load_step(run, cfg),
        "serve": lambda: serve(cfg, run_id),
    }
    if step not in runners:
        raise ValueError(step)
    return runners[step]()


def child(step: str, config_json: str, run_id: str) -> None:
    """Entry point of a step's process: run it and print one JSON line of measurements."""
    from sourcegate.pipelines import config

    cfg = config.load(ROOT / "config" / "pipeline.yaml", json.loads(config_json))
    with AnonPeak() as anon:
        t = time.perf_counter()
        out = run_step(step, cfg, run_id)
        wall = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        "RESULT "
        + json.dumps(
            {
                "step": step,
                "wall_s": round(wall, 2),
                "peak_rss_mb": round(peak),
                "peak_anon_mb": round(anon.peak_kb / 1024),
                "out": out,
            },
            default=str,
        ),
        flush=True,
    )


def spawn(step: str, overrides: dict, run_id: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.night_1m", "--step", step, "--config", json.dumps(overrides), run_id]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    load = os.getloadavg()[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if proc.returncode:
        raise RuntimeError(f"{step} failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :]) | {
        "load_1min_start": round(load, 1),
        "load_1min_end": round(os.getloadavg()[0], 1),
    }
    log(step, result)
    return result


# --- the benchmark -----------------------------------------------------------------------------


def folder_mb(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20, 1)


def one_size(docs: int, work: Path, rebuild_base: bool, changed: float = 0.01, checkpoint=lambda out: None) -> dict:
    """Base (built once, reused) then the night; `checkpoint(out)` after every step (partial results on disk)."""
    root = work / f"{docs}"
    overrides = {"artifacts": str(root / "artifacts"), "corpus.format": "beir", "lock.timeout_s": 5}
    base_cfg = {**overrides, "corpus.path": str(root / "base" / "corpus.jsonl")}
    night_cfg = {**overrides, "corpus.path": str(root / "night" / "corpus.jsonl")}
    base_index = root / "artifacts" / "runs" / BASE_RUN / "index" / "manifest.json"
    out: dict = {"docs": docs}
    if rebuild_base or not base_index.exists():
        shutil.rmtree(root, ignore_errors=True)
        t = time.perf_counter()
        write_corpus(root / "base" / "corpus.jsonl", docs)
        out["corpus_s"] = round(time.perf_counter() - t, 1)
        out["base"] = [spawn(s, base_cfg, BASE_RUN) for s in ("ingest", "chunk", "synthetic_embed", "validate", "load")]
    out["changed_share"] = changed
    out["changed_docs"] = write_corpus(root / "night" / "corpus.jsonl", docs, changed=changed)
    shutil.rmtree(root / "artifacts" / "runs" / NIGHT_RUN, ignore_errors=True)
    t = time.perf_counter()
    out["night"] = []
    for step in NIGHT_STEPS:
        out["night"].append(spawn(step, night_cfg, NIGHT_RUN))
        checkpoint(out)
    out["night_wall_s"] = round(time.perf_counter() - t, 1)
    night = root / "artifacts" / "runs" / NIGHT_RUN
    out["chunks"] = json.loads((night / "run.json").read_text())["counts"]
    index = night / "index"
    out["index_mb"] = {p.name: round(p.stat().st_size / 2**20, 1) for p in sorted(index.iterdir())}
    out["run_folder_mb"] = folder_mb(night)
    build = [s for s in out["night"] if s["step"] != "serve"]
    out["night_build_wall_s"] = round(sum(s["wall_s"] for s in build), 1)
    vectors_mb = out["index_mb"].get("embeddings.npy", 0)
    out["peak_rss_mb_max"] = max(s["peak_rss_mb"] for s in out["night"])
    out["peak_anon_mb_max"] = max(s["peak_anon_mb"] for s in out["night"])
    out["goals"] = {
        "wall_le_10_min": out["night_build_wall_s"] <= GOAL_WALL_S,
        "rss_minus_vectors_le_4gb": out["peak_rss_mb_max"] - vectors_mb <= GOAL_RSS_MB,
    }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", default="100000,1000000", help="base sizes (documents = chunks), comma-separated")
    p.add_argument("--work", default=str(WORK))
    p.add_argument("--changed", type=float, default=0.01, help="share of documents the night edits")
    p.add_argument("--rebuild-base", action="store_true", help="rebuild the base even when it is there")
    p.add_argument("--name", default="night_1m", help="results file benchmarks/results/<name>.json")
    p.add_argument("--step", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("run_id", nargs="?", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.step:
        child(args.step, args.config, args.run_id)
        return
    from sourcegate.pipelines import config

    backend = config.load(ROOT / "config" / "pipeline.yaml").embedding.backend
    result = Result(
        args.name,
        note="synthetic text; the base's vectors are synthetic, the night's changes encoded by the real model",
        embedding_backend=backend,
    )
    result["sizes"] = []
    for n in args.docs.split(","):
        result["sizes"].append({"docs": int(n), "partial": True})

        def checkpoint(out):
            result["sizes"][-1] = out | {"partial": True}
            result.write()

        result["sizes"][-1] = one_size(int(n), Path(args.work), args.rebuild_base, args.changed, checkpoint)
        result.write()


if __name__ == "__main__":
    main()
