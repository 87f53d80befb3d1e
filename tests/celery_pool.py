"""A real Celery pool for tests/test_celery_night.py: a Redis broker and `airflow celery worker` processes.

The broker is Debian's `redis-server` (`make system-deps`) on a free loopback port, nothing persisted. Each worker
runs in a UTS namespace of its own (`unshare --uts`, root), so it has its own host name, as the containers of
docker-compose.yml do: the task instances it runs record it, and so does every lock record its tasks write. A
worker has its own working directory, TMPDIR, task directories and log folder: the workers share no disk, only the
metadata DB (the home) and the API, as Airflow requires. `kill` is a machine going away: SIGKILL to the worker and
every process under it, at once.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.s3_server import free_port


def redis_binary() -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("no redis-server on PATH: run `make system-deps` (Debian's redis-server)")
    return exe


class RedisBroker:
    """One redis-server on 127.0.0.1:<port>, in memory only (no snapshot, no append-only file)."""

    def __init__(self, folder: Path):
        self.folder, self.port, self.proc = folder, free_port(), None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisBroker:
        argv = [redis_binary(), "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"]
        with open(self.folder / "redis.log", "ab") as log:
            self.proc = subprocess.Popen([*argv, "--dir", str(self.folder)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited {self.proc.returncode}; see {self.folder / 'redis.log'}")
            if self.ping():
                return self
            time.sleep(0.1)
        raise RuntimeError(f"redis-server did not answer PING on {self.port} within 30 s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


class Worker:
    """`airflow celery worker` named `name` (host name and Celery node name), with its own folders under `folder`."""

    def __init__(self, name: str, folder: Path):
        self.name, self.folder, self.proc = name, folder, None
        self.cwd, self.scratch, self.task_dirs, self.logs = (folder / d for d in ("cwd", "tmp", "tasks", "logs"))
        for d in (self.cwd, self.scratch, self.task_dirs, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        self.log = folder / "worker.log"

    def env(self, cluster_env: dict) -> dict:
        """The cluster's environment with this worker's own disk: staging, task directories, task logs, and the
        port its log server serves them on (as the UI would read them from it)."""
        return cluster_env | {
            "TMPDIR": str(self.scratch),
            "SG_TASK_DIRS": str(self.task_dirs),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        }

    def start(self, cluster_env: dict, concurrency: int = 1) -> Worker:
        if shutil.which("unshare") is None:
            raise RuntimeError("no unshare (util-linux): each worker needs a host name of its own")
        airflow = [sys.executable, "-m", "airflow", "celery", "worker", "--celery-hostname", self.name]
        argv = [
            *("unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', self.name),  # $0: the host name
            *airflow,
            *("--concurrency", str(concurrency), "--pid", str(self.folder / "worker.pid")),
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                env=self.env(cluster_env),
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def ready(self) -> bool:
        """Celery logs `celery@<name> ready.` once it consumes from the broker."""
        self.check_running()
        return f"celery@{self.name} ready." in self.log.read_text(errors="replace")

    def check_running(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"celery worker {self.name} exited {self.proc.returncode}:\n{tail}")

    def processes(self) -> list[psutil.Process]:
        """The worker and every process under it (its pool, each task's supervisor and task process)."""
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stopped(self) -> list[psutil.Process]:
        """Processes under the worker stopped at a pause point (SOURCEGATE_STOP_AT: SIGSTOP, state T)."""
        out = []
        for p in self.processes()[1:]:
            try:
                if p.status() == psutil.STATUS_STOPPED:
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out

    def kill(self) -> list[int]:
        """SIGKILL the worker and everything under it, as a machine going away; returns the pids killed."""
        procs = self.processes()
        sigkill(procs)
        psutil.wait_procs(procs, timeout=30)
        self.proc.wait(timeout=30)
        return [p.pid for p in procs]

    def stop(self) -> None:
        """Celery's warm shutdown (SIGTERM), then SIGKILL whatever is left (a task stopped at a pause point)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        procs = self.processes()
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=60)
        sigkill(procs)
        self.proc.wait(timeout=30)


def sigkill(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
