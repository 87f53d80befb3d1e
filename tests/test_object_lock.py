"""The fenced writer lock of an s3:// artifacts prefix, hostile object keys, and the shared version cache.

Every test that says the lock works talks to the real S3-compatible server (moto_server, tests/s3_server.py)
from real processes or threads; leases are a second or two (`lock.lease_s`), so each test takes seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pyarrow import fs as pafs

from sourcegate.pipelines import config
from sourcegate.pipelines.app import staging
from sourcegate.pipelines.app.version_cache import CachedStore
from sourcegate.pipelines.release import object_lock
from sourcegate.pipelines.release.lock import writer_lock
from sourcegate.pipelines.versions import promotions
from sourcegate.pipelines.versions.holder import LockHeld, LockLost
from sourcegate.pipelines.versions.object_store import ObjectStore, UnsafeKey, local_path

ROOT = Path(__file__).resolve().parents[1]
MOTO_PYTHON = Path(os.environ.get("MOTO_SERVER") or ROOT / ".venv-moto" / "bin" / "moto_server").with_name("python")


def env_for(s3_server) -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | s3_server.env | {"PYTHONPATH": str(ROOT)}


def cfg_for(uri: str, timeout: float = 0.0, lease: float = 1.5) -> config.PipelineConfig:
    return config.load(None, {"artifacts": uri, "lock.timeout_s": timeout, "lock.lease_s": lease})


# --- keys ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["/etc/passwd", "runs/../../x", "runs/r1/..", "./runs/r1", "runs\\r1", "runs//r1", "runs/r1/", "", "a/\x00b"]
    + ["runs/\x1b[2Jx", "runs/r1/\x7f"],
)
def test_a_key_that_could_leave_its_folder_is_refused_naming_it(tmp_path, key):
    with pytest.raises(UnsafeKey) as err:
        local_path(tmp_path, key)
    assert repr(key) in str(err.value)


def test_an_ordinary_key_is_its_path_under_the_folder(tmp_path):
    assert (
        local_path(tmp_path, "runs/20261205-1/index/manifest.json") == tmp_path / "runs/20261205-1/index/manifest.json"
    )
    assert local_path(tmp_path, "runs/r 1/é.parquet") == tmp_path / "runs" / "r 1" / "é.parquet"


def put_raw(s3_server, bucket: str, keys: list[str]) -> None:
    """Write objects with exactly these keys through another S3 client (boto3, in moto's venv): pyarrow.fs
    normalises a path before it sends it, a hostile writer does not."""
    code = (
        "import boto3, sys\n"
        "c = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1')\n"
        "for k in sys.argv[3:]:\n"
        "    c.put_object(Bucket=sys.argv[2], Key=k, Body=b'hostile')\n"
    )
    env = env_for(s3_server)
    subprocess.run([str(MOTO_PYTHON), "-c", code, env["AWS_ENDPOINT_URL"], bucket, *keys], env=env, check=True)


@pytest.mark.s3
def test_a_key_with_dot_dot_on_the_store_is_refused_before_anything_is_staged(s3_server, s3_env, tmp_path, monkeypatch):
    import tempfile

    uri = s3_server.bucket("hostile-key-stage") + "/n"
    hostile = "runs/r1/../../../escape.txt"
    put_raw(s3_server, "hostile-key-stage", ["n/runs/r0/run.json", f"n/{hostile}"])
    scratch_parent = tmp_path / "tmp"
    scratch_parent.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_parent))  # where staging's scratch folder is made
    staging_it = staging.locked_staged(cfg_for(uri), "hostile", None, staging.Reads())
    with pytest.raises(UnsafeKey, match=r"runs/r1/\.\./\.\./\.\./escape\.txt"), staging_it:
        pass
    assert not list(tmp_path.rglob("escape.txt"))  # nothing written outside (or inside) the scratch folder
    assert not list(scratch_parent.iterdir())  # and the scratch folder removed


@pytest.mark.s3
def test_a_key_with_dot_dot_in_a_cached_version_is_refused(s3_server, s3_env, tmp_path):
    uri = s3_server.bucket("hostile-key-cache") + "/n"
    store = ObjectStore.from_uri(uri)
    store.put("runs/v1/index/manifest.json", json.dumps({"version": "v1", "files": {}}).encode())
    put_raw(s3_server, "hostile-key-cache", ["n/runs/v1/index/../../../../../escape.txt"])
    cache = tmp_path / "cache"
    with pytest.raises(UnsafeKey, match="escape.txt"):
        CachedStore(uri, cache).local("v1")
    assert not list(tmp_path.rglob("escape.txt"))
    assert [p.name for p in cache.iterdir() if p.name != ".pins"] == []  # its own download folder removed too


# --- the lease -------------------------------------------------------------------------------------

# Writer A in its own process: takes the lock, stages, moves LIVE to v1 in its scratch folder (as promote does),
# says so, and publishes when its stdin closes. The test freezes it (SIGSTOP) past its lease meanwhile.
WRITER_A = """
import sys
from pathlib import Path
from sourcegate.pipelines import config
from sourcegate.pipelines.app import errors, staging
from sourcegate.pipelines.versions import promotions
cfg = config.load(None, {"artifacts": sys.argv[1], "lock.timeout_s": 0.0, "lock.lease_s": float(sys.argv[2])})
try:
    with staging.locked_staged(cfg, "writer A", None, staging.Reads()) as local:
        root = Path(local)
        (root / "LIVE").write_text("v1\\n")
        promotions.append_record(promotions.promotion_record("v1", "v0", "a" * 64, "writer A"),
                                 root / promotions.PROMOTIONS_LOG)
        (root / "runs" / "v1" / "note.txt").write_text("written by A")
        print("staged", flush=True)
        sys.stdin.read()
except Exception as exc:
    print(errors.exit_line(exc, "writer A", ""), file=sys.stderr)
    sys.exit(errors.ERROR)
"""


def seed_store(uri: str) -> ObjectStore:
    store = ObjectStore.from_uri(uri)
    for run in ("v0", "v1", "v2"):
        store.put(f"runs/{run}/run.json", json.dumps({"run_id": run}).encode())
    store.put(staging.LIVE, b"v0\n")
    return store


@pytest.mark.s3
def test_a_writer_whose_lease_lapsed_cannot_publish_over_a_newer_holders_promotion(s3_server, s3_env):
    uri = s3_server.bucket("fenced-lapse") + "/n"
    store = seed_store(uri)
    lease = 1.5
    a = subprocess.Popen(
        [sys.executable, "-c", WRITER_A, uri, str(lease)],
        env=env_for(s3_server),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert a.stdout.readline().strip() == "staged", a.stderr.read()
        os.kill(a.pid, signal.SIGSTOP)  # A freezes: no renewal, no progress (a GC pause, a suspended VM)
        # B waits for A's lease to lapse, breaks it, promotes v2 and publishes (B's own lease need not be short)
        with staging.locked_staged(cfg_for(uri, timeout=30, lease=30), "writer B", None, staging.Reads()) as b:
            (Path(b) / "LIVE").write_text("v2\n")
            promotions.append_record(
                promotions.promotion_record("v2", "v0", "b" * 64, "writer B"),
                Path(b) / promotions.PROMOTIONS_LOG,
            )
        assert store.get(staging.LIVE) == b"v2\n"
    finally:
        os.kill(a.pid, signal.SIGCONT)
    _, err = a.communicate(timeout=120)  # A wakes up and tries to publish v1
    assert a.returncode == 2, err
    assert "LockLost" in err and "writer A" in err and "writer B" in err, err  # names both holders
    assert store.get(staging.LIVE) == b"v2\n"  # LIVE stays on the newer promotion
    records = [json.loads(store.get(k)) for k in sorted(store.listing(staging.PROMOTIONS_PREFIX))]
    assert [r["version"] for r in records] == ["v2"]  # A logged nothing
    assert not store.exists("runs/v1/note.txt")  # A wrote nothing at all


@pytest.mark.s3
def test_renewal_keeps_a_long_running_holder_past_its_lease(s3_server, s3_env):
    store = ObjectStore.from_uri(s3_server.bucket("lease-renewal") + "/n")
    # a lease long enough that a loaded machine's scheduling delays never starve the renewal thread past it
    lease = object_lock.acquire_object(store, "long night", timeout_s=0, lease_s=5.0)
    until = time.monotonic() + 11.0  # two leases and more: every contender meanwhile is refused
    while time.monotonic() < until:
        with pytest.raises(LockHeld, match="long night"):
            object_lock.acquire_object(ObjectStore.from_uri(store.uri), "second", timeout_s=0, lease_s=5.0)
        time.sleep(0.5)
    assert lease.why_lost(0.0) is None  # still its holder after two leases: not superseded, its claim unexpired
    lease.release()
    object_lock.acquire_object(store, "after", timeout_s=0, lease_s=2.0).release()  # released: free at once


@pytest.mark.s3
def test_two_writers_racing_for_the_lock_never_both_hold_it(s3_server, s3_env):
    """B looks, finds the lock free, and its PUT is delayed; A looks, PUTs and wins meanwhile. A read-back
    lock lets B win too once its PUT lands; claims listed after the PUT make B see A and wait."""
    uri = s3_server.bucket("lock-race") + "/n"
    store_a, store_b = ObjectStore.from_uri(uri), ObjectStore.from_uri(uri)
    b_looked = threading.Event()
    real_put = store_b.put

    def delayed_put(key, data):
        if not b_looked.is_set():
            b_looked.set()
            time.sleep(1.5)
        real_put(key, data)

    store_b.put = delayed_put
    holds: dict[str, tuple[float, float, int]] = {}

    def hold(name: str, store: ObjectStore) -> None:
        lease = object_lock.acquire_object(store, f"writer {name}", timeout_s=30)
        start = time.monotonic()
        time.sleep(3)
        holds[name] = (start, time.monotonic(), lease.generation)
        lease.release()

    b = threading.Thread(target=hold, args=("b", store_b))
    b.start()
    assert b_looked.wait(30)
    hold("a", store_a)
    b.join(60)
    (_, a_end, a_gen), (b_start, _, b_gen) = holds["a"], holds["b"]
    assert b_start >= a_end  # never two holders at once
    assert b_gen > a_gen  # every acquisition a newer generation


@pytest.mark.s3
def test_a_superseded_holder_is_named_with_its_successor_and_fenced(s3_server, s3_env):
    store = ObjectStore.from_uri(s3_server.bucket("fence-token") + "/n")
    first = object_lock.acquire_object(store, "writer one", timeout_s=0, lease_s=60)
    first.check()
    # a second writer whose clock runs a lease ahead sees the first one's lease as lapsed and takes over
    ahead = object_lock.acquire_object(store, "writer two", timeout_s=0, lease_s=60, clock=lambda: time.time() + 61)
    assert ahead.generation == first.generation + 1
    with pytest.raises(LockLost, match=r"writer one.*superseded by.*writer two") as err:
        first.check()  # its own clock says 60 s are left: the fence record says otherwise
    assert f"generation {first.generation}" in str(err.value) and f"generation {ahead.generation}" in str(err.value)
    assert first.renew() is False  # and it stops renewing
    ahead.release()
    first.release()  # deletes only its own claim
    third = object_lock.acquire_object(store, "writer three", timeout_s=0, lease_s=60)
    assert third.generation == ahead.generation + 1  # releasing never resets the generation
    third.release()


@pytest.mark.s3
def test_embed_shards_share_the_lock_and_are_fenced_by_a_newer_exclusive_holder(s3_server, s3_env):
    uri = s3_server.bucket("shared-holders") + "/n"
    cfg = cfg_for(uri, timeout=0, lease=60)
    shard_held, done = threading.Event(), threading.Event()

    def other_shard() -> None:
        with writer_lock(cfg, "embed shard 2", shared=True):
            shard_held.set()
            done.wait(30)

    t = threading.Thread(target=other_shard)
    t.start()
    assert shard_held.wait(30)
    try:
        # two shards at once, and an exclusive writer kept out
        with writer_lock(cfg, "embed shard 1", shared=True), pytest.raises(LockHeld, match="embed shard"):
            object_lock.acquire_object(ObjectStore.from_uri(uri), "promote", timeout_s=0, lease_s=60)
    finally:
        done.set()
        t.join(30)
    store = ObjectStore.from_uri(uri)
    shard = object_lock.acquire_object(store, "embed shard 3", timeout_s=0, lease_s=60, shared=True)
    newer = object_lock.acquire_object(store, "cleanup", timeout_s=0, lease_s=60, clock=lambda: time.time() + 61)
    with pytest.raises(LockLost, match=r"embed shard 3.*superseded by.*cleanup"):
        shard.check()
    newer.release()
    shard.release()


@pytest.mark.s3
def test_publishing_without_holding_the_lock_is_refused(s3_server, s3_env):
    uri = s3_server.bucket("publish-unlocked") + "/n"
    store = seed_store(uri)
    with pytest.raises(RuntimeError, match="without holding its writer lock"), staging.staged(cfg_for(uri)) as local:
        (Path(local) / "LIVE").write_text("v1\n")
    assert store.get(staging.LIVE) == b"v0\n"


class BeatenToDelete(pafs.LocalFileSystem):
    """pyarrow's local filesystem on which another waiter deletes each object just before this one does."""

    def delete_file(self, path):
        super().delete_file(path)  # the other waiter, first
        super().delete_file(path)


def test_two_waiters_breaking_one_lapsed_claim_both_go_on(tmp_path):
    """Both waiters saw the lapsed claim and delete it; the one that comes second must not fail (it raised
    FileNotFoundError out of acquire); releasing a claim already broken and removing a folder half removed
    by another writer are no error either."""
    (tmp_path / "store").mkdir()
    store = ObjectStore("s3://b/p", BeatenToDelete(), str(tmp_path / "store"))
    lapsed = {"pid": 1, "host": "other-host", "command": "lost", "since": "x", "token": "dead", "expires": 1.0}
    store.put(object_lock.claim_key("dead"), json.dumps(lapsed).encode())
    lease = object_lock.acquire_object(store, "merge", timeout_s=0, lease_s=30)
    assert lease.generation == 1 and not store.exists(object_lock.claim_key("dead"))
    lease.release()
    store.put("runs/r1/a.txt", b"a")
    store.delete_prefix("runs/r1/")
    assert store.listing("runs/") == {}


def test_a_lease_close_to_its_end_is_lost_not_renewed(tmp_path):
    """Renewal went on with any time left: a renewal PUT landing just after the lapse brings back a claim another
    writer broke meanwhile, and two writers hold the lock. Under a quarter of the lease left, the holder lost it."""
    (tmp_path / "store").mkdir()
    store = ObjectStore("s3://b/p", pafs.LocalFileSystem(), str(tmp_path / "store"))
    now = [1000.0]
    lease = object_lock.acquire_object(store, "merge", timeout_s=0, lease_s=40, clock=lambda: now[0])
    lease._stop.set()  # renewed by hand below
    now[0] = lease.expires - 20  # a renewal late by a third: still renewed
    assert lease.renew() and lease.expires == now[0] + 40
    now[0] = lease.expires - 9  # late by more: lost, its claim left to lapse
    assert not lease.renew() and lease.expires == now[0] + 9
    assert "9.0 s of its 40 s lease left" in lease.lost
    with pytest.raises(LockLost):
        lease.check()


# --- the version cache -----------------------------------------------------------------------------

# A `query` process opening v1 through the cache: every download slowed so two such processes overlap.
READER = """
import sys, time
from pathlib import Path
from sourcegate.pipelines.app.version_cache import CachedStore
from sourcegate.pipelines.versions.object_store import ObjectStore
real = ObjectStore.download
def slow(self, key, dest):
    time.sleep(0.2)
    real(self, key, dest)
ObjectStore.download = slow
print("ready", flush=True)
while not Path(sys.argv[3]).exists():
    time.sleep(0.01)
searcher = CachedStore(sys.argv[1], Path(sys.argv[2])).open("v1")
print(len(searcher.bm25("airport refund", 3)), flush=True)
"""


@pytest.mark.s3
def test_two_processes_filling_one_cache_entry_both_serve_and_leave_one_intact_entry(s3_server, s3_env, tmp_path):
    from sourcegate.pipelines.search.embedded import EmbeddedStore
    from tests.test_embedded_backend import synthetic_chunks

    synthetic_chunks(tmp_path / "c.parquet")
    built = EmbeddedStore(tmp_path / "built" / "runs", tmp_path / "built" / "LIVE")
    built.load("v1", str(tmp_path / "c.parquet"))
    uri = s3_server.bucket("cache-fill") + "/n"
    store = ObjectStore.from_uri(uri)
    index = tmp_path / "built" / "runs" / "v1" / "index"
    for path in sorted(p for p in index.rglob("*") if p.is_file()):
        store.upload(path, f"runs/v1/index/{path.relative_to(index).as_posix()}")
    cache, go = tmp_path / "cache", tmp_path / "go"
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", READER, uri, str(cache), str(go)],
            env=env_for(s3_server),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    assert [r.stdout.readline().strip() for r in readers] == ["ready", "ready"]
    go.touch()  # both fill the same entry at once
    outs = [r.communicate(timeout=120) for r in readers]
    assert [r.returncode for r in readers] == [0, 0], [err for _, err in outs]
    assert [out.strip() for out, _ in outs] == ["3", "3"]
    entries = sorted(p.name for p in cache.iterdir() if p.name != ".pins")
    assert len(entries) == 1 and ".part" not in entries[0]  # one entry, no download folder left behind
    EmbeddedStore(cache / entries[0] / "runs", cache / entries[0] / "LIVE").verify("v1")  # intact


def test_the_cache_keeps_what_is_in_use_and_the_entries_used_last_and_evicts_the_rest(tmp_path):
    """A long-running `serve` following promotions on an object store downloaded every night's version into the
    cache and never removed one. An entry a process reads is pinned (a shared flock) and never evicted; beyond the
    KEEP used last, the others go when the next entry is filled."""
    import os

    from sourcegate.pipelines.app import version_cache as vc

    root = tmp_path / "cache"
    entries = [root / (f"{i}" * 64) for i in range(5)]  # oldest first
    for age, entry in enumerate(reversed(entries)):
        (entry / "runs").mkdir(parents=True)
        os.utime(entry, (1_000_000 - age * 100, 1_000_000 - age * 100))
    (root / f"{'0' * 64}.part-1-x").mkdir()  # a download in progress is no entry
    reading = vc.Pin(entries[0])  # a process still reads the oldest
    assert vc.evict(root, keep=2) == [entries[1].name, entries[2].name]
    assert sorted(p.name for p in root.iterdir() if p.is_dir() and vc.ENTRY.fullmatch(p.name)) == sorted(
        e.name for e in (entries[0], entries[3], entries[4])
    )
    assert vc.evict(root, keep=2) == []  # still read
    reading.release()
    assert vc.evict(root, keep=2) == [entries[0].name]
    assert (root / f"{'0' * 64}.part-1-x").is_dir()


def test_the_folders_a_killed_process_left_in_the_version_cache_go_once_an_hour_old(tmp_path):
    """A download, an evicted or a damaged entry's folder left by a killed process was never removed."""
    from sourcegate.pipelines.app import version_cache as vc

    root = tmp_path / "cache"
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has
    left = [f"{'a' * 64}.part-{gone.pid}-x1", f"{'b' * 64}.evicted-{gone.pid}", f"{'c' * 64}.damaged-{gone.pid}-x2"]
    downloading = f"{'d' * 64}.part-{os.getpid()}-x3"  # an hour old, its process still at it
    young = f"{'e' * 64}.part-{gone.pid}-x4"
    for name in [*left, downloading, young]:
        (root / name / "runs").mkdir(parents=True)
        if name != young:
            os.utime(root / name, (time.time() - 7200,) * 2)
    assert vc.evict(root, keep=2) == []
    assert sorted(p.name for p in root.iterdir()) == sorted([downloading, young])


@pytest.mark.s3
def test_a_served_version_is_never_evicted_and_the_one_before_goes_once_unread(
    s3_server, s3_env, tmp_path, monkeypatch
):
    """As `serve` follows LIVE: it opens each new version while the one before may still answer, then drops it."""
    from sourcegate.pipelines.app import version_cache as vc
    from sourcegate.pipelines.search.embedded import EmbeddedStore
    from tests.test_embedded_backend import synthetic_chunks

    monkeypatch.setattr(vc, "KEEP", 1)
    uri = s3_server.bucket("cache-evict") + "/n"
    store = ObjectStore.from_uri(uri)
    built = EmbeddedStore(tmp_path / "built" / "runs", tmp_path / "built" / "LIVE")
    for n, version in enumerate(("v1", "v2", "v3")):
        synthetic_chunks(tmp_path / f"{version}.parquet", n=8 + n)  # other rows: another manifest, another entry
        built.load(version, str(tmp_path / f"{version}.parquet"))
        index = tmp_path / "built" / "runs" / version / "index"
        for path in sorted(p for p in index.rglob("*") if p.is_file()):
            store.upload(path, f"runs/{version}/index/{path.relative_to(index).as_posix()}")
    cache = tmp_path / "cache"

    def entries() -> int:
        return sum(1 for p in cache.iterdir() if vc.ENTRY.fullmatch(p.name))

    first = vc.CachedStore(uri, cache).open("v1")
    second = vc.CachedStore(uri, cache).open("v2")
    assert entries() == 2  # v1 is still read
    del first
    third = vc.CachedStore(uri, cache).open("v3")
    assert entries() == 2  # v1 evicted; v2 still read, v3 the one used last
    assert len(second.bm25("airport refund", 3)) == 3 and len(third.bm25("airport refund", 3)) == 3
