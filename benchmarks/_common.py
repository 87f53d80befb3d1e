"""Shared helpers for the benchmarks: timing, memory, machine facts, result files.

Every result JSON carries the machine (cores, memory, CPU), the date, and the load
average at the start and end of the run: the machines are shared, so a number without
its load is hard to read.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# CI and the work trees lay shared/ beside the clone; SOURCEGATE_SHARED says where it is otherwise (as in tests).
SCIFACT = (Path(os.environ.get("SOURCEGATE_SHARED", ROOT / ".." / "shared")) / "datasets" / "scifact").resolve()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def rss_mb() -> float:
    """Current resident set size."""
    try:
        import psutil

        return round(psutil.Process().memory_info().rss / 2**20, 1)
    except ImportError:  # pragma: no cover
        return float("nan")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def finished(result: dict, out: str | Path) -> int:
    """Stamp the load at the end, print the result and write it to `out` (a benchmark's last step)."""
    result["load_end"] = uptime()
    text = json.dumps(result, indent=2)
    print(text)
    Path(out).write_text(text + "\n", encoding="utf-8")
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine() -> dict:
    """Facts about the machine and its load right now."""
    try:
        import psutil

        mem = psutil.virtual_memory()
        memory = {"total_gb": round(mem.total / 2**30, 1), "available_gb": round(mem.available / 2**30, 1)}
    except ImportError:  # pragma: no cover
        memory = {}
    return {
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "cpu": _cpu_model(),
        "memory": memory,
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "uptime": uptime(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def versions(*names: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            out[n] = None
    return out


def stats_ms(seconds: list[float]) -> dict:
    """p50/p95/min/max/mean in milliseconds (p50 = median)."""
    a = np.asarray(seconds, dtype=float) * 1000
    if not len(a):
        return {"n": 0}
    return {
        "n": int(len(a)),
        "p50_ms": round(float(np.median(a)), 3),
        "p95_ms": round(float(np.percentile(a, 95)), 3),
        "min_ms": round(float(a.min()), 3),
        "max_ms": round(float(a.max()), 3),
        "mean_ms": round(float(a.mean()), 3),
    }


def timed(fn: Callable, *args, **kwargs) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t, out


def timed_cpu(fn: Callable, *args, **kwargs) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process over all its threads, result)."""
    c, t = time.process_time(), time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t, time.process_time() - c, out


def median(xs) -> float:
    return float(np.median(np.asarray(xs, dtype=float)))


class Result:
    """Collects one benchmark's numbers and writes benchmarks/results/<name>.json."""

    def __init__(self, name: str, **meta):
        self.name = name
        self.started = time.perf_counter()
        self.data: dict = {
            "benchmark": name,
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine_start": machine(),
            **meta,
        }

    def __setitem__(self, key, value):
        self.data[key] = value

    def __getitem__(self, key):
        return self.data[key]

    def write(self, path: Path | None = None) -> Path:
        self.data["machine_end"] = machine()
        self.data["wall_seconds"] = round(time.perf_counter() - self.started, 1)
        self.data["peak_rss_mb"] = peak_rss_mb()
        path = path or RESULTS / f"{self.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.data, indent=2, default=_default) + "\n", encoding="utf-8")
        print(f"wrote {path}", flush=True)
        return path


def _default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def log(*parts) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')} rss {rss_mb():.0f}MB]", *parts, flush=True)


def cold(searcher) -> None:
    """Forget the embedded searcher's kept score arrays (no-op for other backends).

    A query's BM25 and cosine arrays are kept for its distribution and best cosine; timing
    operations one after another on the same query would otherwise hand the work over free.
    """
    for attr in ("_last_bm25", "_last_cosine"):
        if hasattr(searcher, attr):
            setattr(searcher, attr, None)
