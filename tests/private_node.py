"""A private OpenSearch node for destructive tests (a flood stage, a block, a stopped node): scripts/opensearch
with its own port and folder (OPENSEARCH_PORT, OPENSEARCH_CACHE), so no other test ever sees the fault; the
shared node at OPENSEARCH_URL is never touched. Stopped (by its own PID file) when the context ends; a test
may stop and start it in between (same port, same data: what it held is still there after the restart)."""

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


class PrivateNode:
    """One node on one port in one folder; `start` and `stop` as often as a test needs."""

    def __init__(self, folder: Path, port: int | None = None):
        self.env = node_env(port or free_port(), folder)
        self.url = f"http://127.0.0.1:{self.env['OPENSEARCH_PORT']}"

    def start(self) -> str:
        started = subprocess.run([str(SCRIPT), "start"], env=self.env, capture_output=True, text=True, timeout=900)
        if started.returncode != 0:
            raise RuntimeError(f"the private node did not start: {started.stderr[-2000:]}")
        return started.stdout.strip().splitlines()[-1]

    def stop(self) -> None:
        subprocess.run([str(SCRIPT), "stop"], env=self.env, capture_output=True, text=True, timeout=300)


@contextmanager
def private_node(folder: Path):
    """Start a node on a free port in `folder`; yields its URL."""
    node = PrivateNode(folder)
    url = node.start()
    try:
        yield url
    finally:
        node.stop()
