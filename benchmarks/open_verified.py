"""Benchmark: opening an embedded version (what `sourcegate query` does first), before and after the `.verified` stamp.

Before (main until #22 item 7): every open re-hashed every file of the version (SHA-256 of
embeddings.npy, the BM25 matrix, chunks.parquet, ...). After: the open checks the stamp the last full
check left (manifest hash + each file's size, mtime_ns, ctime_ns, inode) and reads no file to hash it.
Both are measured side by side in one process, interleaved, on the same synthetic version (benchmarks.search's
seeded Zipf texts and unit 384-d vectors, loaded through `EmbeddedStore.load`), with the files in the page
cache (a warm open; a cold one also pays the disk reads before, not after).

    .venv/bin/python -m benchmarks.open_verified [--chunks 100000] [--repeats 5] [--name open_verified]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks._common import Result, log, stats_ms
from benchmarks.search import build_with_load, synth, texts_of, vocabulary


def open_before(store, version: str):
    """The open as it was: the SHA-256 of every file, then the searcher."""
    from sourcegate.pipelines.search.embedded import EmbeddedSearcher

    return EmbeddedSearcher(store.folder(version), manifest=store.verify(version))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default="open_verified", help="results/<name>.json")
    args = ap.parse_args()
    from sourcegate.pipelines.search.embedded import EmbeddedStore

    result = Result(args.name, chunks=args.chunks, repeats=args.repeats)
    with tempfile.TemporaryDirectory(prefix="sg-open-") as tmp:
        runs = Path(tmp) / "runs"
        runs.mkdir()
        offsets, flat, vectors = synth(args.chunks)
        t0 = time.perf_counter()
        folder = build_with_load(runs, texts_of(offsets, flat, vocabulary()), vectors)
        result["load_s"] = round(time.perf_counter() - t0, 1)
        store = EmbeddedStore(runs, runs / "LIVE")
        files = store.manifest("v1")["files"]
        result["version_bytes"] = sum(f["bytes"] for f in files.values())
        log(f"{args.chunks} chunks loaded in {result['load_s']} s; {result['version_bytes'] / 2**20:.0f} MiB of files")
        before, after = [], []
        for _ in range(args.repeats):
            for times, opener in ((before, open_before), (after, store.open)):
                t = time.perf_counter()
                opener(store, "v1") if opener is open_before else opener("v1")
                times.append(time.perf_counter() - t)
        result["before_full_sha256"] = stats_ms(before)
        result["after_stamp"] = stats_ms(after)
        check_before, check_after = [], []  # the verification alone, without building the searcher
        for _ in range(args.repeats):
            for times, proof in ((check_before, False), (check_after, True)):
                t = time.perf_counter()
                store.verify("v1", proof=proof)
                times.append(time.perf_counter() - t)
        result["verify_only_before"] = stats_ms(check_before)
        result["verify_only_after"] = stats_ms(check_after)
        result["ratio_p50"] = round(result["before_full_sha256"]["p50_ms"] / result["after_stamp"]["p50_ms"], 1)
        assert (folder / ".verified").is_file()
    log(f"open p50: before {result['before_full_sha256']['p50_ms']} ms, after {result['after_stamp']['p50_ms']} ms")
    result.write()


if __name__ == "__main__":
    main()
