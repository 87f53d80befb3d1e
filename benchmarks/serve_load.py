"""Benchmark 26: `sourcegate serve` under a bounded load on loopback, and `sourcegate query` cold.

Warm: one `serve` process over an artifacts folder's live version; after a few warm-up questions, N requests per
level are sent by 1, 4 and 16 concurrent clients (threads, one request at a time each, a new connection per
request). Every question is asked once in the whole run (a question seen before would be answered from the
cross-encoders' pair memo): they are the labelled riders' training questions (config/evals/riders-train.jsonl,
no check set), in file order. The latency is what a client waits (request sent to body read); each answer's
`timings_s` says where the server spent it (queued behind the model lock, embed, search, rerank, signals).

Cold: `sourcegate query` as a new process, the wall time of the command, `--cold-reps` times per source tree,
the trees interleaved (before and after a change, side by side on the same load); plus the wall time of importing
torch alone in a new process (the bi-encoder's one library since it stopped importing transformers).

    python -m benchmarks.serve_load --artifacts /tmp/serve-art --requests 32 \\
        --cold-tree after=. --cold-tree before=/tmp/main-s --cold-reps 3

A tree may name the interpreter it runs under, `NAME=PATH@PYTHON` (another venv: e.g. one installed without .pyc files).

`--pad-to N`: the live version's chunks (texts and vectors as its night made them) plus seeded filler chunks
(benchmark 3's pseudo-word texts and unit vectors) up to N, loaded as a new version of a new artifacts folder and
served `--unproven` (the padded version has no verdict of its own; the decision applied is the config's, which
is the verdict's): riders' questions find the demo's passages at the cost of searching an index of N chunks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks._common import ROOT, Result, log, stats_ms

LEVELS = (1, 4, 16, 64)  # 64: past serve's queue bound (MAX_WAITING), where questions are refused busy
QUESTIONS = ROOT / "config" / "evals" / "riders-train.jsonl"
STAGES = ("queued", "embed", "search", "rerank", "answer", "signals")
COLD_QUESTION = "How much does a monthly pass cost?"


def questions(path: Path) -> list[str]:
    seen, out = set(), []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            q = json.loads(line)["question"]
            if q not in seen:
                seen.add(q)
                out.append(q)
    return out


def env_for(tree: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def start_serve(artifacts: str, config: str | None, *extra: str) -> tuple[subprocess.Popen, str, float]:
    cmd = [sys.executable, "-m", "sourcegate.pipelines.app.cli", *(["--config", config] if config else [])]
    cmd += ["serve", "--artifacts", artifacts, "--port", "0", *extra]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env_for(ROOT), stdout=subprocess.PIPE, text=True)
    first = proc.stdout.readline().strip()
    started = time.perf_counter() - t
    if "(version " not in first:
        proc.terminate()
        raise SystemExit(f"serve did not start serving: {first!r}")
    return proc, first.split()[2], started


def ask(url: str, question: str) -> tuple[float, int, dict]:
    body = json.dumps({"question": question}).encode()
    req = urllib.request.Request(url + "/query", data=body, method="POST")
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            status, data = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, data = err.code, err.read()
    except OSError as exc:  # refused, reset: counted, not fatal to the run
        return time.perf_counter() - t, f"{type(exc).__name__}", {}
    return time.perf_counter() - t, status, json.loads(data)


def level(url: str, clients: int, asked: list[str]) -> dict:
    """`asked` sent by `clients` concurrent clients; per request: latency, status, server timings."""
    lock, rows = threading.Lock(), []

    def one(q: str) -> None:
        seconds, status, payload = ask(url, q)
        busy = status == 503 and str(payload.get("error", "")).startswith("busy")
        with lock:
            rows.append((seconds, status, payload.get("timings_s") or {}, payload.get("mode"), busy))

    t = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, asked))
    wall = time.perf_counter() - t
    return {
        "clients": clients,
        "requests": len(asked),
        "wall_s": round(wall, 2),
        "per_second": round(len(asked) / wall, 2),
        "statuses": {str(s): sum(1 for r in rows if r[1] == s) for s in sorted({r[1] for r in rows}, key=str)},
        "modes": {str(m): sum(1 for r in rows if r[3] == m) for m in sorted({str(r[3]) for r in rows})},
        "latency": stats_ms([r[0] for r in rows if r[1] in (200, 503) and not r[4]]),  # answered requests only
        "busy": sum(1 for r in rows if r[4]),  # refused at once: the queue in front of the models was full
        "busy_latency": stats_ms([r[0] for r in rows if r[4]]),
        "server_stages": {s: stats_ms([r[2][s] for r in rows if s in r[2]]) for s in STAGES},
    }


PHASES = """
import json, sys, time
t = time.perf_counter(); laps = {}
def lap(name):
    global t
    now = time.perf_counter(); laps[name] = round(now - t, 3); t = now
from sourcegate.pipelines.app import cli; lap("import_cli")
import torch; lap("import_torch")
from sourcegate.pipelines.app.factories import answer_scorer_for, get_embedder, scorer_for, serving_for; lap("import_factories")
cfg = cli.config_mod.load(cli.DEFAULT_CONFIG, {"artifacts": sys.argv[1]})
get_embedder(cfg.embedding); lap("load_bi_encoder")
scorer_for(cfg.reranker.kind, cfg.reranker.model_path); lap("load_reranker")
answer_scorer_for(cfg.answerability.answer_model_path); lap("load_answer_model")
serving = serving_for(cfg); lap("open_version_and_check_decision")
from sourcegate.pipelines.app.answering import ask
answered = ask(cfg, serving, sys.argv[2]); lap("answer")
print(json.dumps({"phases_s": laps, "stages_s": answered.retrieval.timings}))
"""


def cold_phases(artifacts: str, reps: int) -> list[dict]:
    """Where a cold query's seconds go: each phase of `query` timed in a new process (the interpreter's own
    start excluded)."""
    runs = []
    for _ in range(reps):
        cmd = [sys.executable, "-c", PHASES, artifacts, COLD_QUESTION]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, env=env_for(ROOT))
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs


def cold(trees: dict[str, tuple[Path, str]], artifacts: str, config: str | None, reps: int) -> dict:
    """`sourcegate query` as a new process per (tree, interpreter), interleaved; and torch's import alone."""
    out = {name: [] for name in trees}
    for _ in range(reps):
        for name, (tree, python) in trees.items():
            cmd = [python, "-m", "sourcegate.pipelines.app.cli", *(["--config", config] if config else [])]
            cmd += ["query", "--artifacts", artifacts, COLD_QUESTION]
            t = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, cwd=tree, env=env_for(tree))  # cwd first on sys.path
            out[name].append(time.perf_counter() - t)
    imports = []
    for _ in range(reps):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True, env=env_for(ROOT))
        imports.append(time.perf_counter() - t)
    return {
        "question": COLD_QUESTION,
        "interpreters": {name: python for name, (_, python) in trees.items()},
        "query_wall": {name: stats_ms(seconds) for name, seconds in out.items()},
        "import_torch": stats_ms(imports),
    }


def padded(artifacts: str, chunks: int, seed: int = 0) -> str:
    """An artifacts folder whose live version is `artifacts`'s live version padded with filler to `chunks` rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.search import DIM, synth, texts_of, vocabulary
    from sourcegate.pipelines.search.embedded import EmbeddedStore

    source = EmbeddedStore(Path(artifacts) / "runs", Path(artifacts) / "LIVE")
    live = source.live()
    index = source.folder(live)
    real = pq.read_table(index / "chunks.parquet")
    vectors = np.load(index / "embeddings.npy")
    offsets, flat, filler = synth(chunks - real.num_rows, seed)
    texts = texts_of(offsets, flat, vocabulary())
    n = len(texts)
    fill = pa.table(
        {
            "chunk_id": [f"filler-{i:07d}" for i in range(n)],
            "doc_id": [f"filler-{i // 3:07d}" for i in range(n)],
            **{name: [""] * n for name in ("title", "section", "section_id")},
            "text": texts,
        }
    )
    table = pa.concat_tables([real.select(fill.column_names), fill])
    flat_vectors = pa.array(np.concatenate([vectors, filler]).astype(np.float32).reshape(-1), pa.float32())
    table = table.append_column("embedding", pa.FixedSizeListArray.from_arrays(flat_vectors, DIM))
    out = Path(f"/tmp/sgbench-serve-{chunks}")
    shutil.rmtree(out, ignore_errors=True)
    store = EmbeddedStore(out / "runs", out / "LIVE")
    (out / "runs").mkdir(parents=True)
    pq.write_table(table, out / "src.parquet")
    store.load(live, str(out / "src.parquet"), source.manifest(live)["inputs"])  # its model fingerprint: the same
    store.promote(live)
    log(f"padded {live} ({real.num_rows} chunks) to {table.num_rows} in {out}")
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", required=True, help="an artifacts folder with a live version (serve's)")
    ap.add_argument("--config", help="the pipeline config (default: config/pipeline.yaml)")
    ap.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    ap.add_argument("--warm-up", type=int, default=4)
    ap.add_argument("--label", default="demo", help="names the result file: serve_load_<label>.json")
    ap.add_argument("--levels", type=int, nargs="+", default=list(LEVELS), choices=LEVELS, help="clients per level")
    ap.add_argument(
        "--cold-tree",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a source tree to time (@PYTHON: under that interpreter)",
    )
    ap.add_argument("--cold-reps", type=int, default=3)
    ap.add_argument("--all-signals", action="store_true", help="serve --all-signals: every signal a night measures")
    ap.add_argument("--pad-to", type=int, help="serve the live version padded with filler to this many chunks")
    args = ap.parse_args()
    res = Result(f"serve_load_{args.label}", target={"p50_ms_4_clients": 100, "p95_ms_4_clients": 250, "cold_s": 3})
    asked = questions(QUESTIONS)
    need = args.warm_up + args.requests * len(LEVELS)
    if len(asked) < need:
        raise SystemExit(f"{QUESTIONS} has {len(asked)} distinct questions; {need} are needed")
    extra = ["--all-signals"] * args.all_signals + ["--unproven"] * bool(args.pad_to)
    served = padded(args.artifacts, args.pad_to) if args.pad_to else args.artifacts
    proc, url, started = start_serve(served, args.config, *extra)
    res["serve_args"], res["chunks_padded_to"] = extra, args.pad_to
    try:
        res["serve_start_s"] = round(started, 2)
        res["health"] = json.loads(urllib.request.urlopen(url + "/health", timeout=60).read())
        log(f"serve at {url} after {started:.1f} s: {res['health']['version']}")
        for q in asked[: args.warm_up]:
            ask(url, q)
        rest, levels = asked[args.warm_up :], []
        for clients in args.levels:
            i = LEVELS.index(clients)  # each level its own questions, the same ones whichever levels run
            levels.append(level(url, clients, rest[i * args.requests : (i + 1) * args.requests]))
            log(f"{clients} clients: {levels[-1]['latency']}")
            res["levels"] = levels
            res.write()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    if args.cold_tree:
        trees = {}
        for name, _, where in (t.partition("=") for t in args.cold_tree):
            path, _, python = where.partition("@")
            trees[name] = (Path(path).resolve(), python or sys.executable)
        res["cold"] = cold(trees, args.artifacts, args.config, args.cold_reps)
        log(f"cold: {res['cold']['query_wall']}")
        res.write()
        res["cold_phases"] = cold_phases(args.artifacts, args.cold_reps)
    res.write()


if __name__ == "__main__":
    main()
