"""A private OpenSearch node for destructive tests (a flood stage, a block, a stopped node): scripts/opensearch
with its own port and folder (OPENSEARCH_PORT, OPENSEARCH_CACHE), so no other test ever sees the fault; the
shared node at OPENSEARCH_URL is never touched. Stopped (by its own PID file) when the context ends."""

from __future__ import annotations

import os
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "opensearch"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_env(port: int, folder: Path) -> dict:
    return {**os.environ, "OPENSEARCH_PORT": str(port), "OPENSEARCH_CACHE": str(folder), "OPENSEARCH_HEAP": "512m"}


@contextmanager
def private_node(folder: Path):
    """Start a node on a free port in `folder`; yields its URL."""
    env = node_env(free_port(), folder)
    started = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=900)
    if started.returncode != 0:
        raise RuntimeError(f"the private node did not start: {started.stderr[-2000:]}")
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=300)
