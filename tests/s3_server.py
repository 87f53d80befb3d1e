"""A real S3-compatible server for the s3 tests: moto's server, a separate process on loopback.

moto lives in its own venv (`make moto` -> .venv-moto; requirements-moto.lock): its botocore caps
python-dateutil below 3, the pipeline's lock pins 4.0.0. MOTO_SERVER names another moto_server binary.
The credentials are test values, passed to the pipeline only through the standard AWS environment.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sg-test-secret-7f3a9c1e"  # a test asserts it appears in no artifact and no log
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "sgtestkey", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1"}


def binary() -> Path:
    return Path(os.environ.get("MOTO_SERVER") or ROOT / ".venv-moto" / "bin" / "moto_server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """One moto_server process on 127.0.0.1:<port>; start/stop may be called again (the outage test)."""

    def __init__(self, port: int, log: Path):
        self.port, self.log, self.proc = port, log, None

    @property
    def env(self) -> dict:
        return CREDENTIALS | {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}"}

    def start(self) -> S3Server:
        exe = binary()
        if not exe.exists():
            raise RuntimeError(f"no moto_server at {exe}: run `make moto` (or set MOTO_SERVER)")
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(self.port)], stdout=out, stderr=out)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto_server exited {self.proc.returncode}; see {self.log}")
            time.sleep(0.2)
        raise RuntimeError(f"moto_server did not listen on {self.port} within 60 s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None

    def bucket(self, name: str) -> str:
        """Create bucket `name` (the deployer's job in production); returns its s3:// URI."""
        from pyarrow import fs

        s3 = fs.S3FileSystem(
            access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            secret_key=SECRET,
            region="us-east-1",
            endpoint_override=f"127.0.0.1:{self.port}",
            scheme="http",
            allow_bucket_creation=True,
        )
        s3.create_dir(name)
        return f"s3://{name}"


class Relay:
    """A loopback TCP relay in front of the server: `close()` makes the endpoint go away for its clients
    while the server keeps its objects (moto holds them in memory: a restarted server starts empty); it counts
    the bytes each way (benchmarks/s3_night.py reads them)."""

    def __init__(self, target_port: int):
        self.target_port, self.lock = target_port, threading.Lock()
        self.sent = self.received = 0  # bytes client -> store (uploads) and store -> client (downloads)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.open = True
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self.open:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.sockets += [client, upstream]
            pair = [client, upstream, 2]  # closed when both directions are done: no descriptor kept per request
            for a, b, up in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pipe, args=(a, b, up, pair), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, up: bool, pair: list) -> None:
        try:
            while data := src.recv(1 << 20):
                dst.sendall(data)
                with self.lock:
                    if up:
                        self.sent += len(data)
                    else:
                        self.received += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self.lock:
                pair[2] -= 1
                done = pair[2] == 0
                if done:
                    self.sockets = [s for s in self.sockets if s not in pair[:2]]
            if done:
                for s in pair[:2]:
                    s.close()

    def counts(self) -> tuple[int, int]:
        """Bytes relayed so far: (to the store, from the store), HTTP headers included."""
        with self.lock:
            return self.sent, self.received

    def close(self) -> None:
        self.open = False
        self.listener.close()
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
