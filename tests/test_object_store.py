"""Artifacts on an object store (issue 23), against a real S3-compatible server (moto_server, tests/s3_server.py).

Unit tests of the write-once and staging rules use pyarrow's local filesystem (no server, fast tier); the
tests that say S3 works talk to the server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pyarrow import fs as pafs

from sourcegate.artifact_io import run_folder as rf
from sourcegate.pipelines.app import staging
from sourcegate.pipelines.versions import segments
from sourcegate.pipelines.versions.object_store import (
    ObjectStore,
    WriteOnceViolation,
    endpoint_from_env,
    sha256_path,
    split_uri,
)
from tests.promotable import PROMOTABLE, promotable_sections

ROOT = Path(__file__).resolve().parents[1]


def local_store(tmp_path) -> ObjectStore:
    """The same ObjectStore over pyarrow's local filesystem: the rules, without a server."""
    (tmp_path / "bucket" / "prefix").mkdir(parents=True)
    return ObjectStore("s3://bucket/prefix", pafs.LocalFileSystem(), str(tmp_path / "bucket" / "prefix"))


def test_uri_and_environment_parsing():
    assert split_uri("s3://nights/demo/") == ("nights", "demo")
    with pytest.raises(ValueError, match="no credentials") as refused:
        split_uri("s3://key:secret@nights/demo")
    assert "secret" not in str(refused.value) and "s3://nights/demo" in str(refused.value)  # never echoed
    with pytest.raises(ValueError, match="expected s3://"):
        split_uri("gs://nights/demo")
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1", "AWS_SECRET_ACCESS_KEY": "x"}
    assert endpoint_from_env(env) == {"endpoint_override": "127.0.0.1:9000", "scheme": "http", "region": "eu-west-1"}
    assert endpoint_from_env(env | {"AWS_ENDPOINT_URL_S3": "https://s3.local"})["endpoint_override"] == "s3.local"


def test_a_run_is_named_by_its_id_or_by_the_folder_or_uri_a_night_printed():
    from sourcegate.pipelines.app.cli import run_id_of

    for named in (
        "20261207-123435",
        "artifacts/runs/20261207-123435",
        "s3://b/sg/runs/20261207-123435/",
        "runs/20261207-123435",
    ):
        assert run_id_of(named) == "20261207-123435"
    assert run_id_of("s3://b/sg/20261207-123435") == "s3://b/sg/20261207-123435"  # not a run folder: refused later


def test_write_once_refuses_other_bytes_and_keeps_same_bytes(tmp_path):
    store = local_store(tmp_path)
    src = tmp_path / "a.bin"
    src.write_bytes(b"version one")
    assert store.upload_once(src, "runs/r1/index/a.bin") is True
    assert store.upload_once(src, "runs/r1/index/a.bin") is False  # same bytes: left as is
    src.write_bytes(b"version two")
    with pytest.raises(WriteOnceViolation, match="other content"):
        store.upload_once(src, "runs/r1/index/a.bin")
    assert store.get("runs/r1/index/a.bin") == b"version one"


def test_an_object_deleted_between_look_up_and_read_is_absent_not_an_error(tmp_path, monkeypatch):
    # a lock object released by its holder while a waiting writer reads it (CI, 2026-12-03: FileNotFoundError)
    store = local_store(tmp_path)
    store.put(".sourcegate.lock.json", b"{}")
    store.delete(".sourcegate.lock.json")
    monkeypatch.setattr(store, "size", lambda key: 2)  # the look-up saw it, the read does not
    assert store.get(".sourcegate.lock.json") is None


class FailingReads(pafs.LocalFileSystem):
    """pyarrow's local filesystem whose next `failures` reads fail as a GET racing a DELETE or PUT does on S3, and
    whose next `torn` reads return the first half of the object (a GET of the size looked up before a longer object
    replaced it)."""

    failures = torn = 0

    def open_input_stream(self, path):
        if self.failures:
            self.failures -= 1
            raise OSError("AWS Error INTERNAL_FAILURE during GetObject operation: Failed to flush response stream")
        if self.torn:
            self.torn -= 1
            with super().open_input_stream(path) as whole:
                data = whole.read()
            return pa.BufferReader(data[: len(data) // 2])
        return super().open_input_stream(path)


def test_an_object_deleted_or_replaced_during_its_read_is_absent_or_read_again(tmp_path, monkeypatch):
    # CI, 2026-12-06: a claim deleted between pyarrow's size look-up and its GET surfaced as this OSError, which
    # is not a FileNotFoundError, and killed a writer waiting for the lock
    store = local_store(tmp_path)
    store.fs = FailingReads()
    claim = json.dumps({"holder": "writer a", "expires": 1765000000.25}).encode()
    store.put("claim.json", claim)
    store.fs.failures = 1
    assert store.get("claim.json") == claim  # replaced mid-read: read again
    store.fs.torn = 1
    assert store.get("claim.json") == claim  # a torn read is never returned as the object
    store.fs.failures = 1
    sizes = iter([len(claim), None])
    monkeypatch.setattr(store, "size", lambda key: next(sizes))  # seen, then gone by the second look
    assert store.get("claim.json") is None
    monkeypatch.undo()
    store.fs.failures = 3
    with pytest.raises(OSError, match="Failed to flush"):  # failing every time while it exists is the store's error
        store.get("claim.json")


class CrashesAfterOneDelete(pafs.LocalFileSystem):
    """pyarrow's local filesystem whose process dies (an exception here) after it deleted one object."""

    deleted = 0

    def delete_file(self, path):
        if self.deleted:
            raise OSError("killed")
        super().delete_file(path)
        self.deleted += 1


def test_a_version_deleted_halfway_is_incomplete_not_complete_with_files_missing(tmp_path):
    """G2: a version is complete only while its manifest exists; retention deleting it last left a version listed
    complete (its manifest there) with its files gone after a crash midway."""
    store = local_store(tmp_path)
    for name in ("a.bin", "bm25.json", "chunks.parquet", "embeddings.npy", "manifest.json", "z.bin"):
        store.put(f"runs/r1/index/{name}", name.encode())
    store.put("runs/r1/run.json", b"{}")
    store.fs = CrashesAfterOneDelete()
    with pytest.raises(OSError, match="killed"):
        store.delete_prefix("runs/r1/")
    assert not store.exists("runs/r1/index/manifest.json") and len(store.listing("runs/r1/")) == 6


def test_publish_writes_manifests_last_records_as_objects_and_live_once(tmp_path):
    store = local_store(tmp_path)
    scratch = tmp_path / "scratch"
    (scratch / "runs" / "r1" / "index").mkdir(parents=True)
    for name in ("chunks.parquet", "index/embeddings.npy", "index/manifest.json", "run.json"):
        (scratch / "runs" / "r1" / name).write_text(name)
    (scratch / "LIVE").write_text("r1\n")
    (scratch / "LIVE.decision.json").write_text('{"version": "r1"}')  # what promote wrote beside LIVE
    from sourcegate.pipelines.versions import promotions

    promotions.append_record(promotions.promotion_record("r1", None, "abc", "cli"), scratch / "promotions.jsonl")
    order = []
    real_upload = store.upload
    store.upload = lambda src, key: (order.append(key), real_upload(src, key))[1]
    staging.publish(store, scratch, staging.Snapshot())
    assert order[-1] == "runs/r1/index/manifest.json"
    assert store.get("LIVE") == b"r1\n"
    assert json.loads(store.get("LIVE.decision.json")) == {"version": "r1"}  # the proven decision beside LIVE
    records = store.listing("promotions/")
    assert len(records) == 1 and json.loads(store.get(next(iter(records))))["version"] == "r1"


def test_publish_refuses_to_move_live_that_moved_since_it_was_staged(tmp_path):
    """The steps judged "never move LIVE backwards" against the staged LIVE: if another writer promoted since,
    this writer writes neither LIVE nor its promotion record."""
    from sourcegate.pipelines.versions import promotions

    store = local_store(tmp_path)
    store.put("LIVE", b"v2\n")  # promoted by another writer after this one staged v0
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "LIVE").write_text("v1\n")
    promotions.append_record(promotions.promotion_record("v1", "v0", "abc", "cli"), scratch / "promotions.jsonl")
    with pytest.raises(staging.LiveMoved, match="'v2', not 'v0' as staged.*'v1' was not promoted"):
        staging.publish(store, scratch, staging.Snapshot(live="v0"))
    assert store.get("LIVE") == b"v2\n"
    assert store.listing("promotions/") == {}


def test_a_failed_live_put_leaves_no_promotion_record_claiming_it(tmp_path, monkeypatch):
    """The record went up before LIVE: a LIVE PUT that failed left a log naming v1 promoted (rollback's default
    target, retention's trust) while LIVE stayed v0. As in a local artifacts folder, LIVE goes first."""
    from sourcegate.pipelines.versions import promotions
    from sourcegate.pipelines.versions.object_store import StoreUnavailable

    store = local_store(tmp_path)
    store.put("LIVE", b"v0\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    snap = staging.stage(store, scratch, None, staging.Reads())
    (scratch / "LIVE").write_text("v1\n")
    (scratch / "LIVE.decision.json").write_text('{"version": "v1"}')
    promotions.append_record(promotions.promotion_record("v1", "v0", "abc", "cli"), scratch / "promotions.jsonl")
    order, real_put = [], store.put

    def put(key, data):
        order.append(key.split("/")[0])
        if key == "LIVE":
            raise OSError("AWS Error NETWORK_CONNECTION during PutObject operation")
        real_put(key, data)

    monkeypatch.setattr(store, "put", put)
    with pytest.raises(StoreUnavailable, match="LIVE was not changed"):
        staging.publish(store, scratch, snap)
    assert store.get("LIVE") == b"v0\n" and store.listing("promotions/") == {}
    monkeypatch.setattr(store, "put", lambda key, data: (order.append(key.split("/")[0]), real_put(key, data)))
    order.clear()
    staging.publish(store, scratch, snap)  # the retry
    assert order == ["LIVE.decision.json", "LIVE", "promotions"]
    assert store.get("LIVE") == b"v1\n" and len(store.listing("promotions/")) == 1


def test_a_record_on_the_store_holding_a_line_separator_does_not_hide_the_next_promotion(tmp_path):
    """publish took the records past the count staged: one record read back as none (its --actor held U+2028)
    shifted that count, and the next promotion's record was never published although LIVE moved."""
    from sourcegate.pipelines.versions import promotions

    store = local_store(tmp_path)
    store.put("LIVE", b"v0\n")
    first = promotions.promotion_record("v0", None, None, "ops\u2028on call")
    store.put(staging.record_key(first), json.dumps(first, ensure_ascii=False).encode())
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    snap = staging.stage(store, scratch, None, staging.Reads())
    (scratch / "LIVE").write_text("v1\n")
    promotions.append_record(promotions.promotion_record("v1", "v0", None, "cli"), scratch / "promotions.jsonl")
    staging.publish(store, scratch, snap)
    records = [json.loads(store.get(k)) for k in sorted(store.listing("promotions/"))]
    assert [(r["version"], r["actor"]) for r in records] == [("v0", "ops\u2028on call"), ("v1", "cli")]


def test_staging_reads_what_a_step_reads_and_only_records_of_the_rest():
    keys = {f"runs/{r}/{n}": 1 for r in ("r1", "r2", "r3") for n in ("chunks.parquet", "run.json")}
    assert staging.previous_of(keys, "r4") == "r3" and staging.previous_of(keys, "r1") is None
    night = staging.roles_of(staging.NIGHT, "r4", "r3", "r1")
    assert staging.wanted("runs/r2/run.json", staging.NIGHT, night)  # every run's records
    assert not staging.wanted("runs/r2/chunks.parquet", staging.NIGHT, night)
    assert staging.wanted("runs/r3/chunks.parquet", staging.NIGHT, night)  # the previous run (embed cache)
    assert not staging.wanted("runs/r3/index/embeddings.npy", staging.NIGHT, night)  # a version's files: to open it
    assert staging.wanted("runs/r4/index/embeddings.npy", staging.NIGHT, night)
    embed = staging.STEP_READS["embed"]
    roles = staging.roles_of(embed, "r4", "r3", "r1")
    assert staging.wanted("runs/r4/chunks.text.parquet", embed, roles)
    assert staging.wanted("runs/r3/chunks.parquet", embed, roles)
    assert not staging.wanted("runs/r4/documents.parquet", embed, roles)
    assert not staging.wanted("runs/r1/chunks.parquet", embed, roles)  # the live run: not what embed reads


def test_a_staged_step_sees_placeholders_of_what_it_does_not_read_and_publishes_only_what_it_wrote(tmp_path):
    store = local_store(tmp_path)
    for key, body in {"runs/r1/run.json": b"{}", "runs/r1/chunks.parquet": b"vectors", "LIVE": b"r1\n"}.items():
        store.put(key, body)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    snap = staging.stage(store, scratch, "r2", staging.STEP_READS["ingest"])
    assert (scratch / "runs/r1/chunks.parquet").read_bytes() == b""  # listed, not downloaded
    assert (scratch / "runs/r1/run.json").read_bytes() == b"{}"
    (scratch / "runs/r2").mkdir(parents=True)
    (scratch / "runs/r2/run.json").write_text("{}")
    staging.publish(store, scratch, snap)
    assert store.get("runs/r1/chunks.parquet") == b"vectors" and store.get("runs/r2/run.json") == b"{}"


def test_an_embed_shard_downloads_only_the_row_groups_of_its_slice(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sourcegate.pipelines.batches import read_rows, shard_range

    store = local_store(tmp_path)
    import hashlib

    texts = ["".join(hashlib.sha256(f"{i}-{j}".encode()).hexdigest() for j in range(16)) for i in range(90)]
    table = pa.table({"text_hash": [f"h{i:03d}" for i in range(90)], "text": texts})  # barely compressible
    src = tmp_path / "chunks.text.parquet"
    pq.write_table(table, src, row_group_size=10)
    store.upload(src, "runs/r2/chunks.text.parquet")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    reads = staging.Reads(shard=("chunks.text.parquet", 1, 3))
    staging.stage(store, scratch, "r2", reads)
    local = scratch / "runs/r2/chunks.text.parquet"
    start, stop = shard_range(90, 1, 3)
    assert pa.concat_tables(read_rows(local, start, stop)) == table.slice(start, stop - start)
    assert local.stat().st_size == src.stat().st_size
    downloaded = store.download_rows("runs/r2/chunks.text.parquet", tmp_path / "again.parquet", lambda n: (start, stop))
    assert downloaded < src.stat().st_size / 2  # 3 of 9 row groups, the header and the footer


# --- against the real server ---------------------------------------------------------------------------


# The config's relative paths (corpus, eval sets, baseline, combiner) made absolute: the CLI resolves them
# against its working directory, and every command here runs in its own empty one.
RELATIVE_KEYS = (
    ("corpus", "path"),
    ("evals", "calibration_set"),
    ("evals", "precision_set"),
    ("evals", "baseline"),
    ("evals", "check_set"),
    ("evals", "check_moves"),
    ("answerability", "combiner"),
)


def project_config(dest: Path) -> Path:
    import yaml

    body = yaml.safe_load((ROOT / "config" / "pipeline.yaml").read_text())
    for section, values in promotable_sections().items():  # a gate that can pass (tests/promotable.py)
        body[section].update(values)
    for section, key in RELATIVE_KEYS:
        body[section][key] = str(ROOT / body[section][key])
    dest.write_text(yaml.safe_dump(body, sort_keys=False))
    return dest


def sourcegate_argv(args, config: Path) -> list[str]:
    return [sys.executable, "-m", "sourcegate.pipelines.app.cli", "--config", str(config), *args]


def sourcegate(args, env, cwd, config: Path, timeout=1800) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | env | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(
        sourcegate_argv(args, config),
        env=full,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


HOLDER = """
import sys, time
from sourcegate.pipelines import config
from sourcegate.pipelines.release.lock import writer_lock
cfg = config.load(None, {"artifacts": sys.argv[1], "lock.timeout_s": 120})
with writer_lock(cfg, "writer " + sys.argv[2]):
    with open(sys.argv[3], "a") as log:
        log.write(f"start {sys.argv[2]} {time.time()}\\n")
    time.sleep(3)
    with open(sys.argv[3], "a") as log:
        log.write(f"end {sys.argv[2]} {time.time()}\\n")
"""


@pytest.mark.s3
def test_two_writers_with_separate_working_directories_are_serialised_by_the_lock_object(s3_server, tmp_path):
    uri = s3_server.bucket("locks-two-writers") + "/nightly"
    log = tmp_path / "holds.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | s3_server.env | {"PYTHONPATH": str(ROOT)}
    procs = []
    for name in ("a", "b"):
        cwd = tmp_path / f"worker-{name}"
        cwd.mkdir()
        procs.append(subprocess.Popen([sys.executable, "-c", HOLDER, uri, name, str(log)], cwd=cwd, env=env))
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    events = [line.split() for line in log.read_text().splitlines()]
    assert [e[0] for e in events] == ["start", "end", "start", "end"]  # never two holders at once
    assert events[0][1] == events[1][1] and events[2][1] == events[3][1] != events[0][1]
    assert float(events[2][2]) >= float(events[1][2])
    assert not any((tmp_path / f"worker-{n}" / ".sourcegate.lock").exists() for n in ("a", "b"))


@pytest.mark.s3
def test_an_expired_lock_object_is_broken_and_a_live_one_is_named(s3_server, monkeypatch, caplog):
    from sourcegate.pipelines.release import object_lock
    from sourcegate.pipelines.release.lock import LockHeld

    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    store = ObjectStore.from_uri(s3_server.bucket("locks-stale") + "/n")
    gone = {"pid": 1, "host": "another-host", "command": "sourcegate run x", "since": "then", "token": "t"}
    store.put(object_lock.claim_key("t"), json.dumps(gone | {"expires": 0}).encode())
    lease = object_lock.acquire_object(store, "me", timeout_s=0)
    assert "broke the stale lock of pid 1 on another-host" in caplog.text
    assert not store.exists(object_lock.claim_key("t"))
    with pytest.raises(LockHeld, match="locked by pid"):
        object_lock.acquire_object(store, "second", timeout_s=0)
    lease.release()
    assert store.listing(object_lock.CLAIMS) == {}  # released: no claim left
    assert json.loads(store.get(object_lock.LOCK_KEY))["generation"] == lease.generation  # the fence record stays


def all_text(folder: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def nights(s3_server, tmp_path_factory):
    """Two real nights on the server: a first one, then (after a query-free outage night that fails to
    publish) `outage-night` rerun to completion. Each command in its own empty working directory."""
    from types import SimpleNamespace

    from tests.s3_server import Relay

    tmp = tmp_path_factory.mktemp("s3-nights")
    n = SimpleNamespace(tmp=tmp, uri=s3_server.bucket("demo-nights") + "/sourcegate")
    n.env = s3_server.env | {"SOURCEGATE_CACHE": str(tmp / "cache")}
    n.config = project_config(tmp / "pipeline.yaml")
    n.store = ObjectStore.from_uri(n.uri, fs=_server_fs(s3_server))
    n.work, n.outage = tmp / "night-1", tmp / "night-2"
    n.work.mkdir(), n.outage.mkdir()
    n.night = sourcegate(["run", "--artifacts", n.uri, "--quiet"], n.env, n.work, n.config)
    assert n.night.returncode == 0, n.night.stderr[-3000:]
    # --quiet: the summary first, and no library's INFO line (GX pinned one at INFO)
    assert n.night.stdout.startswith("run ") and "INFO" not in n.night.stderr, n.night.stderr[-3000:]
    n.first = n.store.get("LIVE").decode().strip()
    n.first_keys, n.first_records = n.store.listing(), len(n.store.listing("promotions/"))

    # The server goes away during the next night (its endpoint closes: moto keeps objects only in memory, so
    # the night talks to it through a relay that is closed). The steps run on scratch and first meet the
    # store again when they publish, whatever they computed, so this night runs without the cross-encoder
    # (its evaluation is most of a night's time; the verdict does not matter to a night that cannot publish).
    relay = Relay(s3_server.port)
    args = ["run", "--artifacts", n.uri, "--quiet", "--run-id", "outage-night", "--reranker", "none"]
    proc = subprocess.Popen(
        sourcegate_argv(args, n.config),
        env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        | n.env
        | {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{relay.port}", "PYTHONPATH": str(ROOT)},
        cwd=n.outage,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_stage(proc)
    relay.close()
    n.out, n.err = proc.communicate(timeout=1800)
    n.outage_code = proc.returncode
    n.live_after_outage = n.store.get("LIVE").decode().strip()
    n.outage_keys = n.store.listing("runs/outage-night/")

    n.rerun = sourcegate(
        ["run", "--artifacts", n.uri, "--quiet", "--run-id", "outage-night"], n.env, n.outage, n.config
    )
    assert n.rerun.returncode == 0, n.rerun.stderr[-3000:]
    return n


@pytest.mark.s3
@pytest.mark.models
def test_a_whole_night_to_the_server_then_a_query_from_it(nights, tmp_path):
    n = nights
    assert f"artifacts: {n.uri}/runs/" in n.night.stdout
    assert f"runs/{n.first}/index/manifest.json" in n.first_keys and f"runs/{n.first}/report.html" in n.first_keys
    assert n.first_records == 1
    assert not (n.work / "artifacts").exists()  # nothing written to a local artifacts folder
    info = json.loads(n.store.get(f"runs/{n.first}/run.json"))
    assert info["config"]["artifacts"] == n.uri  # where it is published, not the scratch folder it ran in
    published = json.loads(n.store.get("LIVE.decision.json"))  # the decision proven for what LIVE serves, on the store
    assert published["version"] == n.store.get("LIVE").decode().strip()

    answer = sourcegate(
        ["query", "Can I bring my bike on the train?", "--artifacts", n.uri, "--json"], n.env, tmp_path, n.config
    )
    assert answer.returncode == 0, answer.stderr[-3000:]
    assert json.loads(answer.stdout)["passages"]
    assert list((n.tmp / "cache").iterdir())  # downloaded once, keyed by the manifest hash
    verify = sourcegate(["verify", n.first, "--artifacts", n.uri], n.env, tmp_path, n.config)
    assert verify.returncode == 0 and "ok" in verify.stdout
    n.outputs = [answer.stdout, answer.stderr, verify.stdout, verify.stderr]


@pytest.mark.s3
@pytest.mark.models
def test_serving_from_the_store_reads_the_kept_text_vectors_its_verdict_bound(nights, monkeypatch):
    """`serve` and `query --all-signals` on s3:// artifacts fetch the live version's text_vectors.parquet and read it
    only as its gate.json bound it (the check is the local one: tests/test_serve_proven.py alters a file)."""
    from sourcegate.pipelines import config
    from sourcegate.pipelines.app.factories import serving_for

    n = nights
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in n.env.items():
        monkeypatch.setenv(name, value)
    live = n.store.get("LIVE").decode().strip()
    bound = json.loads(n.store.get(f"runs/{live}/gate.json"))["evaluated"]["kept"][rf.TEXT_VECTORS]
    serving = serving_for(config.load(n.config, {"artifacts": n.uri}), all_signals=True)  # the signals that read them
    assert serving.kept_vectors == bound["rows"] > 0 and not serving.overridden


@pytest.mark.s3
@pytest.mark.models
def test_a_second_night_of_the_same_corpus_writes_no_row_of_its_tables_again(nights, tmp_path):
    """The rerun night's large tables and arrays are pointers to the first night's segments: the same rows, not
    written twice, and rebuilt byte for byte (the index verifies: the query test above and the rollback below)."""
    n = nights
    for name in (rf.CHUNKS, "index/embeddings.npy"):  # the demo's files of 256 KiB or more
        first = segments.read_pointer(n.store, f"runs/{n.first}/{name}")
        second = segments.read_pointer(n.store, f"runs/outage-night/{name}")
        assert first is not None and second is not None, name
        assert second.segments == first.segments, name  # no new segment: no row written again
        segments.download(n.store, f"runs/outage-night/{name}", tmp_path / name)
        assert sha256_path(tmp_path / name) == second.sha256
    assert all(len(k.split("/")) == 2 for k in n.store.listing(segments.PREFIX))  # content-addressed, flat


@pytest.mark.s3
@pytest.mark.models
def test_the_server_gone_mid_night_is_exit_2_leaves_live_and_the_rerun_completes(nights):
    n = nights
    assert n.outage_code == 2, (n.out[-2000:], n.err[-2000:])
    assert f"object store {n.uri} failed while publishing" in n.err and "LIVE was not changed" in n.err, n.err[-2000:]
    assert "Traceback" not in n.err
    assert n.live_after_outage == n.first
    assert not n.outage_keys  # nothing of the failed night was published
    assert n.store.get("LIVE").decode().strip() == "outage-night"  # the rerun completed and promoted


@pytest.mark.s3
@pytest.mark.models
def test_no_credential_in_any_artifact_or_log(nights, s3_server, tmp_path):
    from tests.s3_server import SECRET

    n = nights
    copy = tmp_path / "copy"
    for key in n.store.listing():
        n.store.download(key, copy / key)
    texts = [all_text(copy), all_text(n.tmp / "cache"), all_text(n.work), all_text(n.outage)]
    texts += [n.night.stdout, n.night.stderr, n.out, n.err, n.rerun.stdout, n.rerun.stderr, *getattr(n, "outputs", [])]
    texts.append(s3_server.log.read_text(errors="replace"))
    assert all(texts[:1]) and not any(SECRET in text for text in texts)


# --- maintenance commands on the store (rollback, runs, diff, accept) -----------------------------------------


@pytest.mark.s3
@pytest.mark.models
def test_runs_lists_the_runs_on_the_store(nights, tmp_path):
    out = sourcegate(["runs", "--artifacts", nights.uri, "--json"], nights.env, tmp_path, nights.config)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r["run"]: r for r in json.loads(out.stdout)}
    assert set(rows) == {nights.first, "outage-night"}
    assert all(r["verdict"] == "passed" for r in rows.values()), rows


@pytest.mark.s3
@pytest.mark.models
def test_diff_joins_two_runs_on_the_store(nights, tmp_path):
    args = ["diff", nights.first, "outage-night", "--artifacts", nights.uri, "--json"]
    out = sourcegate(args, nights.env, tmp_path, nights.config)
    assert out.returncode == 0, out.stderr[-3000:]
    diff = json.loads(out.stdout)
    assert diff["a"] == f"{nights.uri}/runs/{nights.first}" and diff["b"] == f"{nights.uri}/runs/outage-night"
    assert diff["n"] > 0  # every question of both runs joined
    assert not list(tmp_path.iterdir())  # read-only: nothing local, nothing left in the working directory


@pytest.mark.s3
@pytest.mark.models
def test_accept_reads_a_run_on_the_store(nights, tmp_path):
    baseline, fitted = tmp_path / "out" / "baseline.json", tmp_path / "out" / "combiner.json"
    # accept moves the check questions a new threshold has seen into the fit set: copies, never the project's files
    sets = {key: tmp_path / Path(PROMOTABLE[key]).name for key in ("evals.calibration_set", "evals.check_set")}
    for key, copy in sets.items():
        copy.write_text((ROOT / PROMOTABLE[key]).read_text())
    # a new decision retires the check set it saw: the next-check set beside it takes its place
    fresh = {"id": "n-a-1", "question": "Where do I buy a day pass?", "label": "answer", "kind": "single"}
    (tmp_path / "next.jsonl").write_text(json.dumps(fresh | {"expected": ["fares-and-passes#day-passes"]}) + "\n")
    roles = [
        (sets["evals.calibration_set"].name, "fit"),
        (sets["evals.check_set"].name, "check"),
        ("next.jsonl", "next-check"),
    ]
    (tmp_path / "sets.yaml").write_text("sets:\n" + "".join(f"  - file: {f}\n    role: {r}\n" for f, r in roles))
    moves = [f"evals.check_moves={tmp_path / 'check_moves.jsonl'}"]
    overrides = [f"{key}={copy}" for key, copy in sets.items()] + moves + [f"answerability.combiner={fitted}"]
    printed = f"{nights.uri}/runs/{nights.first}"  # the run as the night printed it (`artifacts: s3://…/runs/<id>`)
    args = [a for o in overrides for a in ("--set", o)] + ["accept", printed, "--artifacts", nights.uri]
    work = tmp_path / "work"
    work.mkdir()
    out = sourcegate([*args, "--out", str(baseline)], nights.env, work, nights.config)
    assert out.returncode == 0, out.stderr[-3000:]
    precision = json.loads(nights.store.get(f"runs/{nights.first}/precision.json"))
    accepted = json.loads(baseline.read_text())
    assert accepted["accepted_from"] == nights.first
    assert set(accepted["questions"]["precision"]) == set(precision["per_question"])
    assert fitted.is_file() and not list(work.iterdir())
    assert accepted["check_moved"]["next_check"] == str(tmp_path / "next.jsonl")
    assert "role: retired" in (tmp_path / "sets.yaml").read_text()


@pytest.mark.s3
@pytest.mark.models
def test_rollback_on_the_store_is_verified_logged_and_promote_goes_forward_again_when_forced(nights, tmp_path):
    n = nights
    records = len(n.store.listing("promotions/"))
    back = sourcegate(["rollback", "--artifacts", n.uri], n.env, tmp_path, n.config)
    assert back.returncode == 0, back.stderr[-3000:]
    assert f"outage-night -> {n.first}" in back.stdout
    assert n.store.get("LIVE").decode().strip() == n.first
    logged = [json.loads(n.store.get(k)) for k in sorted(n.store.listing("promotions/"))]
    assert len(logged) == records + 1 and logged[-1]["kind"] == "rollback" and logged[-1]["version"] == n.first
    promote = ["promote", f"{n.uri}/runs/outage-night", "--artifacts", n.uri]
    undone = sourcegate(promote, n.env, tmp_path, n.config)  # the version the rollback left: only when forced
    assert undone.returncode == 2 and "a rollback moved LIVE away from it" in undone.stderr, undone.stderr[-3000:]
    forward = sourcegate([*promote, "--force"], n.env, tmp_path, n.config)
    assert forward.returncode == 0, forward.stderr[-3000:]
    assert n.store.get("LIVE").decode().strip() == "outage-night"
    assert len(n.store.listing("promotions/")) == records + 2
    assert not (tmp_path / "artifacts").exists()


def _server_fs(server):
    from tests.s3_server import CREDENTIALS

    return pafs.S3FileSystem(
        access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region="us-east-1",
        endpoint_override=f"127.0.0.1:{server.port}",
        scheme="http",
    )


def _wait_for_stage(proc, timeout=600):
    """Until the night has staged its inputs and is running its steps (a scratch folder exists)."""
    import glob
    import tempfile
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if glob.glob(os.path.join(tempfile.gettempdir(), "sourcegate-stage-*", "runs", "outage-night", "run.json")):
            return
        time.sleep(0.5)
    out, err = proc.communicate() if proc.poll() is not None else ("", "(still running)")
    raise AssertionError(f"the night never reached its steps: {out[-1500:]} {err[-1500:]}")


def test_the_one_filesystem_builder_takes_a_connection_for_its_block_only(monkeypatch):
    """object_store.s3_filesystem: inside `connection(options)` the options (an Airflow connection's), else the
    AWS environment; connection_options fills what a connection leaves out from the environment."""
    from sourcegate.pipelines.versions import object_store

    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1"}
    extra = {"endpoint_url": "https://s3.internal:8443", "aws_session_token": "tok"}
    assert object_store.connection_options("k", "s", extra, env) == {
        "endpoint_override": "s3.internal:8443",
        "scheme": "https",
        "region": "eu-west-1",
        "access_key": "k",
        "secret_key": "s",
        "session_token": "tok",
    }
    assert object_store.connection_options(None, None, {}, env) == object_store.endpoint_from_env(env)  # SDK chain
    with pytest.raises(ValueError, match="both login"):
        object_store.connection_options(None, "s", {}, env)
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    assert object_store.s3_filesystem().region == "us-west-2"
    with object_store.connection({"region": "ap-south-1", "access_key": "k", "secret_key": "s"}):
        assert object_store.s3_filesystem().region == "ap-south-1"
    assert object_store.s3_filesystem().region == "us-west-2"


def kept_objects(store: ObjectStore, tmp_path: Path) -> dict[str, bytes]:
    """Three runs on the store: r1 and r2 evaluated (each kept text vectors and rerank logits, r2 the newer), r3
    loaded and not yet evaluated. Returns what was put, by key."""
    import numpy as np

    from sourcegate.pipelines.retrieval import kept

    bodies = {}
    for run, value in (("r1", 1.0), ("r2", 2.0)):
        for name, width, dtype in (
            ("text_vectors.parquet", 3, np.float32),
            ("rerank_pairs.parquet", 1, np.float64),
            ("answer_pairs.parquet", 1, np.float64),
        ):
            src = tmp_path / f"{run}-{name}"
            kept.save(src, "fp", {kept.text_key(run): np.full(width, value)}, width, dtype)
            bodies[f"runs/{run}/{name}"] = src.read_bytes()
    for run in ("r1", "r2", "r3"):
        bodies[f"runs/{run}/run.json"] = b"{}"
        bodies[f"runs/{run}/chunks.parquet"] = b"chunks"
    for key, body in bodies.items():
        store.put(key, body)
    return bodies


def test_evaluate_stages_the_newest_earlier_evaluations_kept_values(tmp_path):
    keys = {f"runs/{r}/{n}": 1 for r in ("r1", "r2") for n in staging.KEPT} | {"runs/r3/chunks.parquet": 1}
    assert staging.earlier_evaluation_of(keys, "r3") == "r2" and staging.earlier_evaluation_of(keys, "r2") == "r1"
    assert staging.earlier_evaluation_of(keys, "r1") is None
    for step in ("evaluate", "evaluate_live"):
        reads = staging.STEP_READS[step]
        roles = staging.roles_of(reads, "r3", "r3", None, "r2")
        assert all(staging.wanted(f"runs/r2/{n}", reads, roles) for n in staging.KEPT)
        assert not staging.wanted("runs/r1/text_vectors.parquet", reads, roles)  # only the newest earlier one
        assert not staging.wanted("runs/r2/chunks.parquet", reads, roles)
    night = staging.roles_of(staging.NIGHT, "r4", "r3", None, "r1")  # the previous run never evaluated
    assert staging.wanted("runs/r1/rerank_pairs.parquet", staging.NIGHT, night)
    store = local_store(tmp_path)
    bodies = kept_objects(store, tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    snap = staging.stage(store, scratch, "r3", staging.STEP_READS["evaluate"])
    for name in staging.KEPT:
        assert (scratch / "runs/r2" / name).read_bytes() == bodies[f"runs/r2/{name}"]
        assert (scratch / "runs/r1" / name).read_bytes() == b""  # listed, not downloaded
    staging.publish(store, scratch, snap)
    assert all(store.get(k) == body for k, body in bodies.items())  # read-only: nothing written back


@pytest.mark.s3
def test_an_evaluate_task_on_the_server_reads_the_kept_values_instead_of_computing_them(
    s3_env, s3_server, make_cfg, tmp_path, caplog
):
    """The DAG's evaluate task on the S3 server: the earlier evaluation's kept text vectors and rerank logits are
    staged with their bytes (RunFolder.earlier_evaluation finds them, kept.load reads them), nothing is written back."""
    import numpy as np

    from sourcegate.artifact_io.run_folder import RunFolder
    from sourcegate.pipelines.retrieval import kept

    uri = s3_server.bucket("kept-values") + "/nightly"
    store = ObjectStore.from_uri(uri)
    bodies = kept_objects(store, tmp_path)
    with staging.task_staged(make_cfg(artifacts=uri), "evaluate", "r3") as local:
        earlier = RunFolder(local, "r3").earlier_evaluation()
        assert earlier is not None and earlier.run_id == "r2"
        vectors = kept.load(earlier / "text_vectors.parquet", "fp", 3)
        logits = kept.load(earlier / "rerank_pairs.parquet", "fp", 1, np.float64)
    assert "computing again" not in caplog.text
    assert [v.tolist() for v in vectors.values()] == [[2.0, 2.0, 2.0]] and list(logits.values())[0][0] == 2.0
    assert {k: store.get(k) for k in bodies} == bodies and not store.exists("runs/r3/text_vectors.parquet")
