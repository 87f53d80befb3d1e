"""One writer at a time: the artifacts folder lock between real processes (and the OpenSearch alias lock)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines import config
from sourcegate.pipelines.release import lock
from sourcegate.pipelines.release.lock import HOLDER_FILE, LockHeld, writer_lock

ROOT = Path(__file__).resolve().parents[1]

# A writer in its own process: takes the lock, says so, holds it until stdin closes (or it is killed).
HOLDER = """
import sys
from sourcegate.pipelines import config
from sourcegate.pipelines.release.lock import writer_lock
cfg = config.load(None, {"artifacts": sys.argv[1], "backend.kind": sys.argv[2],
                         "backend.opensearch.index_prefix": sys.argv[3], "lock.timeout_s": float(sys.argv[4])})
with writer_lock(cfg, "test holder", shared=sys.argv[5] == "shared"):
    print("held", flush=True)
    sys.stdin.read()
print("released", flush=True)
"""


def start_holder(artifacts, kind="embedded", prefix="unused", timeout=0.0, mode="exclusive") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(artifacts), kind, prefix, str(timeout), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    line = proc.stdout.readline()
    if line.strip() != "held":
        proc.kill()
        raise AssertionError(f"holder did not take the lock: {line!r} {proc.stderr.read()}")
    return proc


def cfg_for(artifacts, timeout=0.0, kind="embedded", prefix="unused") -> config.PipelineConfig:
    overrides = {"artifacts": str(artifacts), "backend.kind": kind, "backend.opensearch.index_prefix": prefix}
    return config.load(None, overrides | {"lock.timeout_s": timeout})


def test_a_second_writer_fails_naming_the_holder(tmp_path):
    holder = start_holder(tmp_path)
    try:
        with pytest.raises(LockHeld) as err, writer_lock(cfg_for(tmp_path), "second"):
            pass
        message = str(err.value)
        assert f"pid {holder.pid} on {socket.gethostname()}" in message
        assert "test holder" in message and "since 20" in message
    finally:
        holder.communicate("")
    assert holder.returncode == 0


def test_a_second_writer_waits_for_the_holder_within_its_timeout(tmp_path):
    holder = start_holder(tmp_path)
    start = time.monotonic()
    threading.Timer(1.0, lambda: holder.stdin.close()).start()
    with writer_lock(cfg_for(tmp_path, timeout=60), "second"):
        waited = time.monotonic() - start
        record = json.loads((tmp_path / HOLDER_FILE).read_text())
        assert record["pid"] == os.getpid() and record["command"] == "second"
    holder.wait(10)
    assert waited > 0.5  # it did wait (it could not have taken the lock while the holder held it)
    assert not (tmp_path / HOLDER_FILE).exists()  # released cleanly: no record left behind


def test_a_sigkilled_holder_leaves_a_stale_record_that_the_next_writer_breaks(tmp_path, caplog):
    holder = start_holder(tmp_path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(10)
    stale = json.loads((tmp_path / HOLDER_FILE).read_text())
    assert stale["pid"] == holder.pid  # the record survives the kill ...
    assert lock.is_stale(stale)
    with caplog.at_level("WARNING"), writer_lock(cfg_for(tmp_path, timeout=0), "after the kill"):
        # ... but the kernel dropped the flock with the process: no wait, and the record is replaced.
        assert json.loads((tmp_path / HOLDER_FILE).read_text())["pid"] == os.getpid()
    assert f"broke the stale lock of pid {holder.pid}" in caplog.text


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    cfg = cfg_for(tmp_path)
    with writer_lock(cfg, "outer"), writer_lock(cfg, "inner"), writer_lock(cfg, "embed", shared=True):
        assert json.loads((tmp_path / HOLDER_FILE).read_text())["command"] == "outer"
    with writer_lock(cfg, "again"):  # fully released above
        pass


def test_shared_holders_coexist_and_keep_an_exclusive_writer_out(tmp_path):
    shard = start_holder(tmp_path, mode="shared")
    try:
        with writer_lock(cfg_for(tmp_path), "another shard", shared=True):
            pass
        with pytest.raises(LockHeld, match="another process"), writer_lock(cfg_for(tmp_path), "promote"):
            pass
    finally:
        shard.communicate("")


def test_two_cli_runs_on_one_artifacts_folder(tmp_path):
    """`sourcegate run` while another writer holds the folder: exit 2 and the holder named, before any work."""
    artifacts = tmp_path / "artifacts"
    holder = start_holder(artifacts)
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "sourcegate.pipelines.app.cli",
                "run",
                "--artifacts",
                str(artifacts),
                "--lock-timeout",
                "0",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,
        )
    finally:
        holder.communicate("")
    assert out.returncode == 2, out.stderr
    assert f"is locked by pid {holder.pid}" in out.stderr and "test holder" in out.stderr
    assert not (artifacts / "runs").exists()  # it did nothing


def test_promote_never_moves_live_backwards(make_cfg, tmp_path):
    """A version created before the live one is promoted only through the rollback path."""
    from sourcegate.artifact_io import write_json
    from sourcegate.pipelines.app import steps
    from sourcegate.pipelines.app.factories import open_store
    from tests.test_embedded_backend import synthetic_chunks
    from tests.test_verdicts import pass_gate

    cfg = make_cfg()
    synthetic_chunks(tmp_path / "c.parquet", n=6)
    # Loaded (created) in this order: "zzz-old" first, then "manual".
    for run_id, started in (("zzz-old", "2026-01-01T00:00:00+00:00"), ("manual", "2026-01-02T00:00:00+00:00")):
        folder = RunFolder(cfg.artifacts, run_id).path
        folder.mkdir(parents=True)
        write_json({"started_at": started}, folder / "run.json")
        open_store(cfg).load(run_id, str(tmp_path / "c.parquet"))
        pass_gate(cfg, run_id)  # a passed verdict bound to this version (sourcegate/pipelines/release/verdict.py)
    steps.promote_step(RunFolder(cfg.artifacts, "manual"), cfg)
    with pytest.raises(RuntimeError, match="created before the live version manual"):
        steps.promote_step(RunFolder(cfg.artifacts, "zzz-old"), cfg)  # newer by name, older by creation time
    assert open_store(cfg).live() == "manual"
    steps.promote_step(RunFolder(cfg.artifacts, "zzz-old"), cfg, allow_older=True)
    assert open_store(cfg).live() == "zzz-old"


@pytest.mark.opensearch
def test_the_opensearch_alias_lock_names_its_holder_and_breaks_a_killed_one(tmp_path, caplog, os_client):
    client = os_client
    prefix = f"locktest-{os.getpid()}"
    holder = start_holder(tmp_path / "a", kind="opensearch", prefix=prefix)
    try:
        # Another artifacts folder, same alias: the folder locks don't meet, the alias lock does.
        second = cfg_for(tmp_path / "b", kind="opensearch", prefix=prefix)
        with pytest.raises(LockHeld, match=f"alias {prefix} is locked by pid {holder.pid}"), writer_lock(second):
            pass
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        assert client.get(index=lock.LOCK_INDEX, id=prefix)["_source"]["pid"] == holder.pid  # left behind
        with caplog.at_level("WARNING"), writer_lock(second, "after the kill"):
            assert client.get(index=lock.LOCK_INDEX, id=prefix)["_source"]["pid"] == os.getpid()
        assert f"broke the stale lock of pid {holder.pid}" in caplog.text
        assert not client.exists(index=lock.LOCK_INDEX, id=prefix)  # released
    finally:
        if holder.poll() is None:
            holder.kill()
        client.delete(index=lock.LOCK_INDEX, id=prefix, ignore=[404])


# A writer on "another host" (its host name is not this one's, so its pid says nothing here) holding the alias
# lock under a short lease: renewed while it runs, taken over once it is killed and the lease runs out.
LEASED_HOLDER = """
import socket, sys
socket.gethostname = lambda: "worker-b.example"
from sourcegate.pipelines import config
from sourcegate.pipelines.release import lock
lock.ALIAS_LEASE_S = float(sys.argv[3])
cfg = config.load(None, {"artifacts": sys.argv[1], "backend.kind": "opensearch",
                         "backend.opensearch.index_prefix": sys.argv[2], "lock.timeout_s": 0.0})
with lock.writer_lock(cfg, "leased holder"):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.mark.opensearch
def test_an_alias_lock_held_on_another_host_is_renewed_while_it_works_and_taken_over_when_it_dies(
    tmp_path, caplog, os_client
):
    client, prefix, lease = os_client, f"leasetest-{os.getpid()}", 2.0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", LEASED_HOLDER, str(tmp_path / "a"), prefix, str(lease)]
    holder = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        first = client.get(index=lock.LOCK_INDEX, id=prefix)["_source"]
        assert first["host"] == "worker-b.example" and first["expires"] > time.time()
        second = cfg_for(tmp_path / "b", kind="opensearch", prefix=prefix, timeout=2.5 * lease)
        # waiting longer than one lease: the holder is alive and renews, so the lock stays its own
        with pytest.raises(LockHeld, match=f"pid {holder.pid} on worker-b.example.*lease"), writer_lock(second):
            pass
        renewed = client.get(index=lock.LOCK_INDEX, id=prefix)["_source"]
        assert renewed["token"] == first["token"] and renewed["expires"] > first["expires"]
        os.kill(holder.pid, signal.SIGKILL)  # dies without releasing; its pid means nothing on this host
        holder.wait(10)
        with caplog.at_level("WARNING"), writer_lock(second, "after the lease"):
            assert client.get(index=lock.LOCK_INDEX, id=prefix)["_source"]["pid"] == os.getpid()
        assert f"broke the stale lock of pid {holder.pid} on worker-b.example" in caplog.text
        assert "its lease ran out" in caplog.text
        assert not client.exists(index=lock.LOCK_INDEX, id=prefix)  # released
    finally:
        if holder.poll() is None:
            holder.kill()
        client.delete(index=lock.LOCK_INDEX, id=prefix, ignore=[404])


@pytest.mark.opensearch
def test_an_alias_lock_record_without_a_lease_from_another_host_is_left_for_a_human(tmp_path, os_client):
    """A record written before leases (no `expires`) by a process elsewhere may still be working: never broken."""
    client, prefix = os_client, f"leaseless-{os.getpid()}"
    record = {"pid": 1, "host": "worker-c.example", "command": "old", "since": "2026-01-01T00:00:00+00:00"}
    client.index(index=lock.LOCK_INDEX, id=prefix, body=record | {"token": "t"}, op_type="create", refresh="true")
    try:
        with (
            pytest.raises(LockHeld, match=f"delete the document {lock.LOCK_INDEX}/_doc/{prefix}"),
            writer_lock(cfg_for(tmp_path, kind="opensearch", prefix=prefix, timeout=0.5)),
        ):
            pass
    finally:
        client.delete(index=lock.LOCK_INDEX, id=prefix, ignore=[404])
