"""Large run files as pointers to shared segments of rows (sourcegate/pipelines/versions/segments.py): a night on
object storage writes the rows that changed, and every file reads back byte for byte.

The rules run on pyarrow's local filesystem (no server: fast tier); tests/test_object_store.py and the DAG
nights run the same code against the real S3 server.
"""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs

from sourcegate.artifact_io import run_folder as rf
from sourcegate.pipelines.app import staging
from sourcegate.pipelines.batches import write_batches
from sourcegate.pipelines.versions import segments
from sourcegate.pipelines.versions.holder import LockLost
from sourcegate.pipelines.versions.object_cache import ObjectCache
from sourcegate.pipelines.versions.object_store import sha256_path
from tests.test_object_store import local_store

SCHEMA = pa.schema(
    [("chunk_id", pa.string()), ("n", pa.int64()), ("score", pa.float64()), ("embedding", pa.list_(pa.float32(), 8))]
)


def table(ids, salt: str = "", edited=lambda i: i % 97 == 0) -> pa.Table:
    vectors = np.array([np.sin(np.arange(8) * (i + 1)) for i in ids], dtype=np.float32).reshape(-1, 8)
    return pa.table(
        {
            "chunk_id": [f"c{i}{salt if edited(i) else ''}" for i in ids],
            "n": list(ids),
            "score": [None if i % 13 == 0 else i / 3 for i in ids],
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 8),
        },
        schema=SCHEMA,
    )


def write(path, t: pa.Table, rows: int = 1000):
    write_batches((t.slice(i, rows) for i in range(0, t.num_rows, rows)), path, SCHEMA)
    return path


def written(store) -> int:
    """Bytes of the segment objects on the store."""
    return sum(store.listing(segments.PREFIX).values())


@pytest.fixture
def cache():
    return ObjectCache(None, 0)  # nothing kept: every read goes to the store


def test_a_changed_table_writes_only_its_changed_rows_and_reads_back_byte_for_byte(tmp_path, cache):
    store = local_store(tmp_path)
    base = write(tmp_path / "base.parquet", table(range(5000)))
    first = segments.upload(store, base, "runs/r1/chunks.parquet", [], cache, min_bytes=0)
    assert first is not None and len(first.segments) == 1 and first.segments[0]["rows"] == 5000
    full = written(store)

    # 1 row in 97 changed, 10 deleted, 20 added
    night = write(tmp_path / "night.parquet", table([*range(10, 5000), *range(9000, 9020)], salt="-edited"))
    second = segments.upload(store, night, "runs/r2/chunks.parquet", [first], cache, min_bytes=0)
    changed = sum(1 for i in range(10, 5000) if i % 97 == 0) + 20
    assert [s["rows"] for s in second.segments] == [5000, changed]
    assert written(store) - full < 0.05 * full

    for key, src in (("runs/r1/chunks.parquet", base), ("runs/r2/chunks.parquet", night)):
        segments.download(store, key, tmp_path / "back.parquet")
        assert sha256_path(tmp_path / "back.parquet") == sha256_path(src)
        assert (
            pq.ParquetFile(tmp_path / "back.parquet").metadata.num_row_groups
            == pq.ParquetFile(src).metadata.num_row_groups
        )


def test_an_array_shares_its_unchanged_rows(tmp_path, cache):
    store = local_store(tmp_path)
    vectors = np.random.default_rng(1).random((4000, 16), dtype=np.float32)
    np.save(tmp_path / "a.npy", vectors)
    first = segments.upload(store, tmp_path / "a.npy", "runs/r1/index/embeddings.npy", [], cache, min_bytes=0)
    vectors[::100] += 1.0
    np.save(tmp_path / "b.npy", vectors)
    second = segments.upload(store, tmp_path / "b.npy", "runs/r2/index/embeddings.npy", [first], cache, min_bytes=0)
    assert [s["rows"] for s in second.segments] == [4000, 40]
    segments.download(store, "runs/r2/index/embeddings.npy", tmp_path / "back.npy")
    assert sha256_path(tmp_path / "back.npy") == sha256_path(tmp_path / "b.npy")


def test_files_it_cannot_rebuild_or_too_small_are_uploaded_whole(tmp_path, cache):
    store = local_store(tmp_path)
    pq.write_table(table(range(3000)), tmp_path / "gzip.parquet", compression="gzip")  # not how the steps write
    assert segments.upload(store, tmp_path / "gzip.parquet", "runs/r1/x.parquet", [], cache, min_bytes=0) is None
    small = write(tmp_path / "small.parquet", table(range(10)))
    assert segments.upload(store, small, "runs/r1/small.parquet", [], cache) is None  # under MIN_BYTES
    (tmp_path / "notes.json").write_text("{}")
    assert segments.upload(store, tmp_path / "notes.json", "runs/r1/notes.json", [], cache, min_bytes=0) is None
    assert written(store) == 0
    for name, src in (("x.parquet", tmp_path / "gzip.parquet"), ("small.parquet", small)):
        segments.download(store, f"runs/r1/{name}", tmp_path / "back")
        assert (tmp_path / "back").read_bytes() == src.read_bytes()


def test_a_file_spread_over_too_many_segments_is_compacted(tmp_path, cache):
    store = local_store(tmp_path)
    pointers = []
    for night in range(segments.MAX_SEGMENTS + 2):
        edited = lambda i, night=night: i % 20 <= night  # noqa: E731  (each night edits more rows)
        src = write(tmp_path / f"n{night}.parquet", table(range(2000), salt="-e", edited=edited))
        pointers.append(
            segments.upload(store, src, f"runs/r{night:02d}/chunks.parquet", pointers[-1:], cache, min_bytes=0)
        )
        assert len(pointers[-1].segments) <= segments.MAX_SEGMENTS
    assert any(len(p.segments) == 1 for p in pointers[1:])  # rewritten whole once the list was full
    segments.download(store, f"runs/r{night:02d}/chunks.parquet", tmp_path / "back.parquet")
    assert sha256_path(tmp_path / "back.parquet") == sha256_path(src)


def test_collect_drops_only_the_segments_no_pointer_names(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(segments, "GRACE_S", 0)
    store = local_store(tmp_path)
    first = segments.upload(
        store, write(tmp_path / "a.parquet", table(range(3000))), "runs/r1/chunks.parquet", [], cache, min_bytes=0
    )
    night = write(tmp_path / "b.parquet", table(range(3000), salt="-b"))
    segments.upload(store, night, "runs/r2/chunks.parquet", [first], cache, min_bytes=0)
    assert segments.collect(store) == 0
    orphan = segments.upload(
        store, write(tmp_path / "c.parquet", table(range(100, 200))), "runs/r3/chunks.parquet", [], cache, min_bytes=0
    )
    store.delete_prefix("runs/r1/")
    store.delete_prefix("runs/r3/")
    assert segments.collect(store) == 2  # r3's segment and its digests; r1's rows are r2's too
    assert not store.exists(segments.segment_key(orphan.segments[0]["sha256"], "parquet"))
    segments.download(store, "runs/r2/chunks.parquet", tmp_path / "back.parquet")
    assert sha256_path(tmp_path / "back.parquet") == sha256_path(night)


class PublishedDuringListing(pafs.LocalFileSystem):
    """pyarrow's local filesystem on which another writer runs `meanwhile` right after the first listing."""

    meanwhile = None

    def get_file_info(self, paths):
        found = super().get_file_info(paths)
        if isinstance(paths, pafs.FileSelector) and self.meanwhile:
            self.meanwhile, publish = None, self.meanwhile
            publish()
        return found


def test_collect_never_deletes_what_a_newer_holder_is_publishing(tmp_path, cache, monkeypatch):
    """A writer whose lease lapsed collected from a listing of runs/ taken before a newer holder published r2, then
    deleted r2's new segment (and nothing checked its lease in between). Now: segments/ is listed first, a segment
    under an hour old is left, and the lease is checked before deleting."""
    monkeypatch.setattr(segments, "GRACE_S", 0)
    store = local_store(tmp_path)
    fs = store.fs = PublishedDuringListing()
    r1 = write(tmp_path / "a.parquet", table(range(1000)))
    dropped = segments.upload(store, r1, "runs/r1/a.parquet", [], cache, min_bytes=0)
    store.delete_prefix("runs/r1/")
    r2 = write(tmp_path / "b.parquet", table(range(5000, 6000)))
    fs.meanwhile = lambda: segments.upload(store, r2, "runs/r2/b.parquet", [], cache, min_bytes=0)
    assert segments.collect(store) == 2  # r1's segment and its digests, never r2's
    assert not store.exists(segments.segment_key(dropped.segments[0]["sha256"], "parquet"))
    segments.download(store, "runs/r2/b.parquet", tmp_path / "back.parquet")
    assert sha256_path(tmp_path / "back.parquet") == sha256_path(r2)

    store.delete("runs/r2/b.parquet")  # r2's segment an orphan, or a pointer still on its way: young, left
    monkeypatch.setattr(segments, "GRACE_S", 3600)
    assert segments.collect(store) == 0 and len(store.listing(segments.PREFIX)) == 2
    for path in (tmp_path / "bucket" / "prefix" / "segments").iterdir():
        os.utime(path, (time.time() - 7200,) * 2)

    def lost():
        raise LockLost("the lock of writer A was superseded")

    with pytest.raises(LockLost):
        segments.collect(store, lost)
    assert len(store.listing(segments.PREFIX)) == 2  # nothing deleted by a writer that lost the lock
    assert segments.collect(store) == 2  # an hour later, by one that holds it


def test_a_damaged_segment_is_an_error_not_a_different_file(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("SOURCEGATE_SEGMENT_CACHE", "off")  # a cached copy is the true file: read the store
    store = local_store(tmp_path)
    first = segments.upload(
        store, write(tmp_path / "a.parquet", table(range(3000))), "runs/r1/chunks.parquet", [], cache, min_bytes=0
    )
    key = segments.segment_key(first.segments[0]["sha256"], "parquet")
    store.put(key, segments.file_bytes(table(range(1, 3001)), "parquet", [3000]))
    with pytest.raises(segments.RebuildMismatch, match="back.parquet rebuilt from its segments has sha256"):
        segments.download(store, "runs/r1/chunks.parquet", tmp_path / "back.parquet")
    assert not (tmp_path / "back.parquet").exists() and not list(tmp_path.glob(".back.parquet*"))


def test_a_warm_cache_reads_nothing_from_the_store(tmp_path):
    store, cache = local_store(tmp_path), ObjectCache(tmp_path / "cache", 10**9)
    src = write(tmp_path / "a.parquet", table(range(3000)))
    pointer = segments.upload(store, src, "runs/r1/chunks.parquet", [], cache, min_bytes=0)
    assert segments.rebuild(store, pointer, tmp_path / "w.parquet", cache) == 0  # the publisher kept the file
    cold = ObjectCache(tmp_path / "cold", 10**9)
    assert segments.rebuild(store, pointer, tmp_path / "c.parquet", cold) > 0
    kept = cold.get(f"file-{pointer.sha256}")
    assert kept.stat().st_ino == (tmp_path / "c.parquet").stat().st_ino  # written once, kept as a hard link
    assert segments.rebuild(store, pointer, tmp_path / "c2.parquet", cold) == 0
    assert sha256_path(tmp_path / "c2.parquet") == sha256_path(src)
    with open(cold.get(f"file-{pointer.sha256}"), "r+b") as damaged:  # a cached file written to in place
        damaged.truncate(100)
    assert segments.rebuild(store, pointer, tmp_path / "c3.parquet", cold) == 0  # dropped, rebuilt from segments
    assert sha256_path(tmp_path / "c3.parquet") == sha256_path(src)
    linked = ObjectCache(tmp_path / "linked", 10**9).put(src, "file-y", link=True)  # a scratch file: no copy
    assert linked.stat().st_ino == src.stat().st_ino
    tiny = ObjectCache(tmp_path / "tiny", 1)  # past its limit: the least recently used entries go
    tiny.put(src, "file-x")
    assert list((tmp_path / "tiny").iterdir()) == []


def test_a_worker_decodes_a_segment_once_and_a_damaged_decoded_copy_costs_only_the_decoding(tmp_path, monkeypatch):
    """A pool's worker holds yesterday's segments, not tonight's files: each rebuild reads the segments' rows, from
    the decoded copy the worker keeps (the publisher keeps one too) instead of decoding the Parquet again."""
    store, publisher = local_store(tmp_path), ObjectCache(tmp_path / "publisher", 10**9)
    src = write(tmp_path / "a.parquet", table(range(3000)))
    pointer = segments.upload(store, src, "runs/r1/chunks.parquet", [], publisher, min_bytes=0)
    sha = pointer.segments[0]["sha256"]
    assert publisher.get(segments.decoded_name(sha)) is not None
    worker = ObjectCache(tmp_path / "worker", 10**9)
    for name in (f"{sha}.parquet", f"{sha}.digests"):  # yesterday's segment, not decoded, not the file
        worker.put(publisher.get(name), name)
    decoded = []
    monkeypatch.setattr(segments, "read_rows", lambda *a, _read=segments.read_rows: decoded.append(a) or _read(*a))

    def rebuilt(name: str) -> str:
        (tmp_path / "worker" / f"file-{pointer.sha256}").unlink(missing_ok=True)  # tonight's file made elsewhere
        assert segments.rebuild(store, pointer, tmp_path / name, worker) == 0
        return sha256_path(tmp_path / name)

    assert rebuilt("first.parquet") == pointer.sha256 and len(decoded) == 1
    assert rebuilt("second.parquet") == pointer.sha256 and len(decoded) == 1  # the decoded copy, mapped
    with open(worker.get(segments.decoded_name(sha)), "r+b") as damaged:
        damaged.truncate(64)
    assert rebuilt("third.parquet") == pointer.sha256 and len(decoded) == 2  # dropped, decoded again, kept
    assert rebuilt("fourth.parquet") == pointer.sha256 and len(decoded) == 2
    other = table(range(1, 3001))  # a decoded copy that reads, but is not the segment's rows
    worker.drop(segments.decoded_name(sha))
    segments.keep_decoded(worker, sha, other)
    assert segments.read_decoded(worker, sha).equals(other)
    assert rebuilt("wrong.parquet") == pointer.sha256 and len(decoded) == 3  # mismatch: dropped, decoded again
    assert segments.read_decoded(worker, sha).equals(segments.read_rows(src, "parquet"))
    small = ObjectCache(tmp_path / "small", 8 * pointer.size)  # a copy past its share would evict the segments
    assert segments.rebuild(store, pointer, tmp_path / "fifth.parquet", small) > 0
    assert small.get(f"{sha}.parquet") is not None and small.get(segments.decoded_name(sha)) is None


def test_trimming_skips_an_entry_another_worker_dropped_meanwhile(tmp_path, monkeypatch):
    cache = ObjectCache(tmp_path / "cache", 10)
    cache.put_bytes(b"x" * 8, "a.digests")
    listed = type(tmp_path).iterdir
    monkeypatch.setattr(type(tmp_path), "iterdir", lambda self: iter([*listed(self), self / "gone.parquet"]))
    cache.put_bytes(b"y" * 8, "b.digests")  # past the limit: trims, and the vanished entry is no error
    assert cache.get("b.digests") is not None and cache.get("a.digests") is None


class TrimmedAfterLookUp(ObjectCache):
    """A worker's cache shared with another task that trims each entry right after this one looked it up."""

    def get(self, name):
        path = super().get(name)
        if path is not None:
            path.unlink()
        return path


def test_a_cache_entry_trimmed_between_its_look_up_and_its_read_is_a_miss(tmp_path):
    """get() returned the entry's path, another task's trim unlinked it, and the read raised FileNotFoundError
    (staging reported it as the store unavailable): now the object is read from the store."""
    store = local_store(tmp_path)
    src = write(tmp_path / "a.parquet", table(range(3000)))
    pointer = segments.upload(store, src, "runs/r1/chunks.parquet", [], ObjectCache(tmp_path / "cache", 1 << 30), 0)
    cache = TrimmedAfterLookUp(tmp_path / "cache", 1 << 30)  # holds the file, its segment, digests, decoded rows
    sha = pointer.segments[0]["sha256"]
    assert len(segments.segment_digests(store, sha, cache)) == 3000
    rows, downloaded = segments.segment_rows(store, sha, pointer, cache)
    assert rows.num_rows == 3000 and downloaded > 0
    segments.download(store, "runs/r1/chunks.parquet", tmp_path / "back.parquet", cache)
    assert sha256_path(tmp_path / "back.parquet") == sha256_path(src)


def test_trim_removes_a_temporary_a_killed_process_left_once_an_hour_old(tmp_path, monkeypatch):
    from sourcegate.pipelines.versions import object_cache

    cache = ObjectCache(tmp_path / "cache", 1 << 20)
    cache.put_bytes(b"x" * 8, "a.digests")
    left = tmp_path / "cache" / ".b.digests.k1ll3d.tmp"
    left.write_bytes(b"y" * 8)
    cache.trim()
    assert left.exists()  # young: maybe still being written
    monkeypatch.setattr(object_cache, "LEFTOVER_S", -1.0)  # an hour later
    cache.trim()
    assert not left.exists() and cache.get("a.digests") is not None


def test_staging_publishes_a_night_as_its_changed_rows(tmp_path, monkeypatch):
    """Two runs through staging.publish: the second run's tables and arrays point at the first run's rows."""
    monkeypatch.setattr(segments, "MIN_BYTES", 0)
    monkeypatch.setattr(segments, "GRACE_S", 0)
    monkeypatch.setenv("SOURCEGATE_SEGMENT_CACHE", "off")
    store = local_store(tmp_path / "store")
    for run, salt in (("r1", ""), ("r2", "-edited")):
        scratch = tmp_path / run
        folder = rf.RunFolder(scratch, run).mkdir()
        write(folder / rf.CHUNKS, table(range(4000), salt=salt))
        shard = table(range(4000), salt=salt).cast(pq.read_schema(folder / rf.CHUNKS))  # as merge reads it: "element"
        write_batches([shard], folder / "embed" / "shard-0000.parquet", shard.schema)
        np.save(folder / "embeddings.npy", np.arange(4000 * 8, dtype=np.float32).reshape(4000, 8) + (run == "r2"))
        before = written(store)
        staging.publish(store, scratch, staging.Snapshot())
    r1, r2 = (segments.read_pointer(store, f"runs/{r}/{rf.CHUNKS}") for r in ("r1", "r2"))
    assert r2.segments[0] == r1.segments[0] and r2.segments[1]["rows"] == sum(1 for i in range(4000) if i % 97 == 0)
    shard = segments.read_pointer(store, "runs/r2/embed/shard-0000.parquet")
    assert shard.schema != r2.schema and shard.rows == r2.rows  # written under other names, rows of one type
    assert sorted(shard.segments, key=str) == sorted(r2.segments, key=str)  # the same rows: nothing new written
    assert written(store) - before < 0.6 * before  # the arrays changed whole (every row +1); the tables by 1/97
    staged = tmp_path / "staged"
    staging.stage(store, staged, "r2", staging.Reads(own=(staging.ANY,), previous=(staging.ANY,)))
    for run in ("r1", "r2"):
        for name in (rf.CHUNKS, "embeddings.npy"):
            assert sha256_path(staged / "runs" / run / name) == sha256_path(tmp_path / run / "runs" / run / name)

    # retention drops r1 (its folder gone from the staged scratch): the rows only r1 held go with it
    snap = staging.stage(store, tmp_path / "retention", "r2", staging.Reads())
    shutil.rmtree(tmp_path / "retention" / "runs" / "r1")
    r1_vectors = segments.read_pointer(store, "runs/r1/embeddings.npy").segments[0]["sha256"]
    staging.publish(store, tmp_path / "retention", snap)
    assert not store.listing("runs/r1/") and not store.exists(segments.segment_key(r1_vectors, "npy"))
    assert store.exists(segments.segment_key(r1.segments[0]["sha256"], "parquet"))  # r2 still uses r1's rows
    segments.download(store, "runs/r2/chunks.parquet", tmp_path / "again.parquet")
    assert sha256_path(tmp_path / "again.parquet") == r2.sha256
