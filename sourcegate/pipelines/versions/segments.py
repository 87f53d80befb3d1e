"""Large run files on the object store as pointers to shared segments of rows: a night writes what changed.

A night that edits 1% of a 100k-chunk corpus changes 1% of the rows of its tables and of its index's vectors,
but each run folder holds every row (docs/benchmarks/10-s3-night.md: 701 MB written for ~2 MB of change).
On an s3:// artifacts prefix, a Parquet table or `.npy` array of at least MIN_BYTES is therefore published as a
*pointer* at its usual key (listings, placeholders and retention see the run folder as before) and its rows as
content-addressed *segments*, written once and shared by every file that holds those rows:

    runs/<run>/chunks.parquet   MAGIC, then JSON: the file's sha256, size and schema, how it was written (row
                                groups), its segments and which of their rows, in order (runs of positions)
    segments/<sha256>.parquet   rows of that schema (`.npy` for an array), never changed once written
    segments/<sha256>.digests   the 16-byte digest of each of those rows (blake2b of the row's values)

Publishing a file looks its rows up, by digest, in the segments of related pointers (staging names them: the
run's own other files, the previous and the live run's); only rows found nowhere go into a new segment. When
too few of the named rows are still used, or the list grows past MAX_SEGMENTS, the file is written whole as
one segment (compaction), so reading a file never costs much more than the file. Downloading a pointer
rebuilds the file byte for byte: the writer's row groups and defaults are reproduced, checked before a
pointer is written (a file this module cannot reproduce is uploaded whole) and again after every rebuild.
`collect` drops the segments no pointer names (after retention removed run folders), once they are an hour old.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from sourcegate.pipelines.versions.object_cache import ObjectCache
from sourcegate.pipelines.versions.object_store import ObjectStore, sha256_bytes, sha256_path

SWITCH_ENV = "SOURCEGATE_SEGMENTS"  # "off": publish every file whole (as before segments; benchmark 10 compares)
MAGIC = b"SOURCEGATE-SEGMENTS/1\n"
PREFIX = "segments/"
MIN_BYTES = 256 << 10  # smaller files are uploaded whole: a pointer and a lookup would cost more than they save
MAX_SEGMENTS = 8  # a file spread over more is compacted
MIN_USED_SHARE = 0.5  # ... as is one that would use less than this share of the rows its segments hold
KINDS = {".parquet": "parquet", ".npy": "npy"}
POINTER_LIMIT = 16 << 20  # a larger object is a whole file: no need to look at its first bytes
GRACE_S = 3600.0  # collect leaves a segment younger than this: the pointer naming it may still be on its way
CHECK_EVERY = 100  # segments collect deletes between two checks of the writer's lease


class RebuildMismatch(RuntimeError):
    """A file rebuilt from its segments does not have the sha256 its pointer records."""


@dataclass
class Pointer:
    kind: str  # "parquet" or "npy"
    sha256: str  # of the whole file
    size: int
    schema: str  # Parquet: the Arrow schema it was written with (base64, as in the footer); npy: ""
    rows: str  # what a row is (columns and types; dtype and shape): files with the same share rows
    layout: list[int]  # Parquet: rows per row group; npy: []
    segments: list[dict]  # {"sha256", "rows"}, in order
    take: list[list[int]]  # [start, count] runs of positions in the segments' rows laid end to end

    def to_bytes(self) -> bytes:
        return MAGIC + json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Pointer:
        return cls(**json.loads(data[len(MAGIC) :]))


def kind_of(key: str) -> str | None:
    return next((kind for suffix, kind in KINDS.items() if key.endswith(suffix)), None)


def segment_key(sha: str, kind: str) -> str:
    return f"{PREFIX}{sha}.{kind}"


def digests_key(sha: str) -> str:
    return f"{PREFIX}{sha}.digests"


# --- rows, their digests, and the bytes of a file ------------------------------------------------------------


def read_rows(source, kind: str, schema: str = ""):
    """A file's rows: a pyarrow Table (Parquet) or a numpy array (npy). `source`: a path or bytes; `schema` (Parquet):
    the Arrow schema to read them as (arrow_schema's), else the one the file stores."""
    if kind == "npy":
        return np.load(io.BytesIO(source) if isinstance(source, bytes) else source, allow_pickle=False)
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = pa.BufferReader(source) if isinstance(source, bytes) else source
    table = pq.read_table(source)
    return table.cast(decode_schema(schema or arrow_schema(source)))


def arrow_schema(source) -> str:
    """The Arrow schema a Parquet file was written with (base64, as the file stores it): reading names a list's
    values `element` where the writer may have said `item`, and the writer stores the schema it was given."""
    import pyarrow.parquet as pq

    metadata = pq.ParquetFile(source).metadata.metadata or {}
    if b"ARROW:schema" not in metadata:
        raise ValueError("no Arrow schema in the Parquet footer")
    return metadata[b"ARROW:schema"].decode()


def decode_schema(encoded: str):
    import base64

    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(encoded)))


def layout_of(path: Path, kind: str) -> list[int]:
    if kind != "parquet":
        return []
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def row_type(path: Path, rows, kind: str) -> str:
    """What a file's rows are: Parquet, its columns and their types as read back (a list's values are `element`
    whatever the writer named them; no metadata); npy, dtype and row shape. Equal rows of files of one row type
    have equal digests."""
    if kind == "npy":
        return f"{rows.dtype.str}{list(rows.shape[1:])}"
    import pyarrow.parquet as pq

    return hashlib.sha256(pq.read_schema(path).remove_metadata().to_string().encode()).hexdigest()


def file_bytes(rows, kind: str, layout: list[int]) -> bytes:
    """The bytes of the file holding `rows` (write_file's, in memory)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    write_file(rows, kind, layout, sink)
    return sink.getvalue().to_pybytes()


class HashingSink:
    """A write-only file that keeps nothing but the sha256 of what is written to it (for `pa.PythonFile`)."""

    closed = False

    def __init__(self):
        self.sha, self.size = hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def written_sha256(rows, kind: str, layout: list[int]) -> str:
    """The sha256 of the file write_file would write, without holding its bytes (a 200 MB table: 0.7 s, against
    1.1 s through file_bytes)."""
    import pyarrow as pa

    sink = HashingSink()
    write_file(rows, kind, layout, pa.PythonFile(sink, mode="w"))
    return sink.sha.hexdigest()


def write_file(rows, kind: str, layout: list[int], sink) -> None:
    """The file holding `rows` as the pipeline writes it, to `sink` (a pyarrow output stream: in memory, or
    `pa.OSFile` on disk): Parquet with pyarrow's defaults, one row group per `layout` entry
    (batches.write_batches); npy as np.save (the index's embeddings.npy)."""
    if kind == "npy":
        np.save(sink, rows, allow_pickle=False)
        return
    import pyarrow.parquet as pq

    table, start = rows.combine_chunks(), 0
    with pq.ParquetWriter(sink, table.schema) as writer:
        for count in layout:
            writer.write_table(table.slice(start, count), row_group_size=count)
            start += count


DIGEST_ROWS = 65_536  # rows digested at a time: memory bounded by a batch (batches.BATCH_ROWS)
KEYS = (b"sourcegate-row-a", b"sourcegate-row-b")  # two SipHash keys: 128 bits per value (pandas.util.hash_array)


def row_digests(rows, kind: str) -> list[bytes]:
    """One 16-byte digest per row (blake2b of the row's values, each column at a fixed width): equal rows of one row
    type have equal digests. In batches, each column turned into bytes by numpy or pandas, not row by row."""
    out: list[bytes] = []
    for start in range(0, len(rows), DIGEST_ROWS):
        if kind == "npy":
            part = np.ascontiguousarray(rows[start : start + DIGEST_ROWS])
            matrix = part.reshape(len(part), -1).view(np.uint8).reshape(len(part), -1)
        else:
            part = rows.slice(start, DIGEST_ROWS)
            matrix = np.hstack([column_bytes(part.column(i).combine_chunks()) for i in range(part.num_columns)])
        out += [hashlib.blake2b(row, digest_size=16).digest() for row in np.ascontiguousarray(matrix)]
    return out


def column_bytes(array) -> np.ndarray:
    """A column as one row of bytes per value, every row the same width: numbers and vectors of numbers by their
    bytes; anything else (text, nulls) by two keyed 64-bit hashes of its text and a null flag."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pandas.util import hash_array

    t, n = array.type, len(array)
    if array.null_count == 0 and (pa.types.is_list(t) or pa.types.is_fixed_size_list(t)) and n:
        values = array.flatten()
        lengths = pc.list_value_length(array).to_numpy()
        numeric = pa.types.is_floating(values.type) or pa.types.is_integer(values.type)
        if numeric and values.null_count == 0 and (lengths == lengths[0]).all():
            return np.ascontiguousarray(values.to_numpy()).view(np.uint8).reshape(n, -1)
    if array.null_count == 0 and (pa.types.is_floating(t) or pa.types.is_integer(t)):
        return np.ascontiguousarray(array.to_numpy()).view(np.uint8).reshape(n, -1)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        values = array.fill_null("").to_numpy(zero_copy_only=False)  # str objects without a Python loop
    else:
        values = np.array(["" if v is None else repr(v) for v in array.to_pylist()], dtype=object)
    hashes = [hash_array(values, hash_key=k.decode(), categorize=False).view(np.uint8).reshape(n, 8) for k in KEYS]
    nulls = array.is_null().to_numpy(zero_copy_only=False).astype(np.uint8).reshape(n, 1)
    return np.hstack([*hashes, nulls])


def runs_of(positions: list[int]) -> list[list[int]]:
    """[start, count] runs of consecutive positions."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1][1] += 1
        else:
            runs.append([p, 1])
    return runs


def assemble(parts: list, take: list[list[int]], kind: str):
    """The rows `take` names, from `parts` (the segments' rows) laid end to end."""
    if kind == "parquet":
        import pyarrow as pa

        whole = pa.concat_tables(parts)
        return pa.concat_tables([whole.slice(s, c) for s, c in take] or [whole.slice(0, 0)])
    whole = np.concatenate(parts)
    return np.concatenate([whole[s : s + c] for s, c in take]) if take else whole[:0]


def default_cache() -> ObjectCache:
    return ObjectCache.from_env()


# --- the store -----------------------------------------------------------------------------------------------


def read_pointer(store: ObjectStore, key: str) -> Pointer | None:
    """The pointer at `key`; None when the object is a whole file or absent (only its first bytes are read)."""
    try:
        with store.fs.open_input_file(store.path(key)) as f:
            if f.size() < len(MAGIC) or f.read_at(len(MAGIC), 0) != MAGIC:
                return None
            return Pointer.from_bytes(f.read_at(f.size(), 0))
    except FileNotFoundError:
        return None


def download(store: ObjectStore, key: str, dest: Path, cache: ObjectCache | None = None) -> str | None:
    """The file at `key` as `dest`: a pointer's file rebuilt from its segments (its sha256 returned: checked), any
    other object as it is (None)."""
    pointer = read_pointer(store, key)
    if pointer is None:
        store.download(key, dest)
        return None
    rebuild(store, pointer, dest, cache or default_cache())
    return pointer.sha256


def download_rows(store: ObjectStore, key: str, dest: Path, span) -> str | None:
    """ObjectStore.download_rows for a whole file (None); a pointer's file is rebuilt whole (its rows come from
    segments) and its sha256 returned."""
    if read_pointer(store, key) is not None:
        return download(store, key, dest)
    store.download_rows(key, dest, span)
    return None


def file_sha256(store: ObjectStore, key: str) -> str | None:
    """The sha256 of the file at `key` (a pointer's: the file it names); None when absent."""
    pointer = read_pointer(store, key)
    if pointer is not None:
        return pointer.sha256
    data = store.get(key)
    return None if data is None else sha256_bytes(data)


def fetch(store: ObjectStore, key: str, name: str, cache: ObjectCache, read):
    """`read(source)` of an immutable object: its cached file's path, else its bytes from the store (then kept); and
    the bytes downloaded. A cached file another task trims between the look-up and the read is a miss."""
    path = cache.get(name)
    if path is not None:
        try:
            return read(path), 0
        except FileNotFoundError:
            pass
    data = store.get(key)
    if data is None:
        raise FileNotFoundError(f"{store.url(key)} is missing: a pointer names it")
    cache.put_bytes(data, name)
    return read(data), len(data)


def as_bytes(source: Path | bytes) -> bytes:
    return source.read_bytes() if isinstance(source, Path) else source


def segment_rows(store: ObjectStore, sha: str, pointer: Pointer, cache: ObjectCache):
    """A segment's rows as `pointer` reads them, and the bytes downloaded. A Parquet segment is decoded once per
    worker: its rows are kept beside it as an Arrow IPC file, read again by memory-mapping it (decoding a 100k-row
    segment costs ~1.8 s; mapping its decoded copy ~0.004 s, docs/benchmarks/10-s3-night.md). A damaged copy only
    costs the decoding: every rebuilt file is checked against its sha256."""
    if pointer.kind == "parquet" and (decoded := read_decoded(cache, sha)) is not None:
        return decoded.cast(decode_schema(pointer.schema)), 0
    key, name = segment_key(sha, pointer.kind), f"{sha}.{pointer.kind}"
    rows, got = fetch(store, key, name, cache, lambda source: read_rows(source, pointer.kind, pointer.schema))
    if pointer.kind == "parquet":
        keep_decoded(cache, sha, rows)
    return rows, got


def decoded_name(sha: str) -> str:
    return f"{sha}.arrow"


DECODED_SHARE = 0.125  # a decoded copy larger than this share of the cache's limit is not kept: it would evict
# the segments themselves (a 1M-chunk table's copy is ~2.5 GB against the default 4 GB)


def keep_decoded(cache: ObjectCache, sha: str, table) -> None:
    """Keep a Parquet segment's rows as the worker's decoded copy (uncompressed Arrow IPC)."""
    import pyarrow as pa

    if table.nbytes > DECODED_SHARE * cache.limit_bytes:
        return

    def write(path: Path) -> None:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)

    cache.place(decoded_name(sha), write)


def read_decoded(cache: ObjectCache, sha: str):
    """The decoded copy of segment `sha` (memory-mapped), or None when the worker has none or a damaged one."""
    import pyarrow as pa

    path = cache.get(decoded_name(sha))
    if path is None:
        return None
    try:
        return pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    except (OSError, pa.ArrowInvalid):
        cache.drop(decoded_name(sha))
        return None


def segment_digests(store: ObjectStore, sha: str, cache: ObjectCache) -> list[bytes]:
    data, _ = fetch(store, digests_key(sha), f"{sha}.digests", cache, as_bytes)
    return [data[i : i + 16] for i in range(0, len(data), 16)]


def rebuild(store: ObjectStore, pointer: Pointer, dest: Path, cache: ObjectCache) -> int:
    """Write the file `pointer` describes to `dest`, checked against its sha256; the bytes downloaded. The file is
    written once, straight to disk, and kept in the worker's cache as a hard link (a staged file is replaced,
    never rewritten in place)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if cache.copy_to(f"file-{pointer.sha256}", dest, pointer.size):
        return 0
    try:
        return rebuild_from_segments(store, pointer, dest, cache)
    except RebuildMismatch:
        # a decoded copy that reads but is not its segment's rows (damaged on disk): dropped, decoded again
        dropped = [cache.drop(decoded_name(segment["sha256"])) for segment in pointer.segments]
        if not any(dropped):
            raise
        return rebuild_from_segments(store, pointer, dest, cache)


def rebuild_from_segments(store: ObjectStore, pointer: Pointer, dest: Path, cache: ObjectCache) -> int:
    parts, downloaded = [], 0
    for segment in pointer.segments:
        rows, got = segment_rows(store, segment["sha256"], pointer, cache)
        parts.append(rows)
        downloaded += got
    tmp = dest.with_name(f".{dest.name}.part")
    import pyarrow as pa

    with pa.OSFile(str(tmp), "wb") as sink:
        write_file(assemble(parts, pointer.take, pointer.kind), pointer.kind, pointer.layout, sink)
    if (sha := sha256_path(tmp)) != pointer.sha256:
        tmp.unlink()
        raise RebuildMismatch(f"{dest.name} rebuilt from its segments has sha256 {sha}, not {pointer.sha256}")
    tmp.replace(dest)
    cache.put(dest, f"file-{pointer.sha256}", link=True)
    return downloaded


def put_segment(store: ObjectStore, rows, kind: str, digests: list[bytes], cache: ObjectCache) -> dict:
    data = file_bytes(rows, kind, [len(digests)] if kind == "parquet" else [])
    sha = sha256_bytes(data)
    if not store.exists(digests_key(sha)):  # written last: a segment with its digests is complete
        store.put(segment_key(sha, kind), data)
        store.put(digests_key(sha), b"".join(digests))
    cache.put_bytes(data, f"{sha}.{kind}")
    cache.put_bytes(b"".join(digests), f"{sha}.digests")
    if kind == "parquet":
        keep_decoded(cache, sha, rows)
    return {"sha256": sha, "rows": len(digests)}


def upload(
    store: ObjectStore,
    src: Path,
    key: str,
    related,
    cache: ObjectCache,
    min_bytes: int | None = None,
    link: bool = False,
) -> Pointer | None:
    """Publish `src` at `key`: as a pointer to segments (shared with the `related` pointers' segments where the
    rows are the same) when it is a table or array of at least `min_bytes` this module can rebuild byte for byte,
    else whole. The pointer, or None when uploaded whole. The worker's cache keeps the file (`link`: by a hard
    link, for a file nothing writes again)."""
    kind = kind_of(key)
    small = src.stat().st_size < (MIN_BYTES if min_bytes is None else min_bytes)
    if kind is None or small or os.environ.get(SWITCH_ENV) == "off":
        store.upload(src, key)
        return None
    sha = sha256_path(src)
    same = next((p for p in related if p.kind == kind and p.sha256 == sha), None)
    if same is not None:  # the same file as a related one (a night that changed nothing; one shard's merge)
        store.put(key, same.to_bytes())
        return same
    try:
        rows, layout = read_rows(src, kind), layout_of(src, kind)
    except (ValueError, OSError):  # not a table or array this module reads
        rows = None
    if rows is not None:
        with ThreadPoolExecutor(1) as pool:  # Arrow writes and hashes without the GIL: beside the digests
            rebuilt = pool.submit(lambda: written_sha256(rows, kind, layout) == sha)
            digests = row_digests(rows, kind)
    if rows is None or not rebuilt.result():  # written some other way: no pointer could rebuild it
        store.upload(src, key)
        return None
    schema = arrow_schema(src) if kind == "parquet" else ""
    shape = row_type(src, rows, kind)
    known: dict[bytes, tuple[str, int]] = {}
    sizes: dict[str, int] = {}
    for other in (p for p in related if p.kind == kind and p.rows == shape):
        for segment in other.segments:
            if segment["sha256"] not in sizes:
                sizes[segment["sha256"]] = segment["rows"]
                for i, d in enumerate(segment_digests(store, segment["sha256"], cache)):
                    known.setdefault(d, (segment["sha256"], i))
    found = [known.get(d) for d in digests]
    new = [i for i, f in enumerate(found) if f is None]
    used = list(dict.fromkeys(f[0] for f in found if f))  # segments in order of first use
    held = sum(sizes[s] for s in used) + len(new)
    whole = len(used) + bool(new) > MAX_SEGMENTS or len(digests) < MIN_USED_SHARE * held
    if whole:
        segments, positions = [put_segment(store, rows, kind, digests, cache)], list(range(len(digests)))
    else:
        offset, start = {}, 0
        for s in used:
            offset[s], start = start, start + sizes[s]
        segments = [{"sha256": s, "rows": sizes[s]} for s in used]
        positions = [offset[f[0]] + f[1] if f else -1 for f in found]
        if new:
            delta = rows.take(new) if kind == "parquet" else rows[new]
            segments.append(put_segment(store, delta, kind, [digests[i] for i in new], cache))
            for j, i in enumerate(new):
                positions[i] = start + j
    pointer = Pointer(kind, sha, src.stat().st_size, schema, shape, layout, segments, runs_of(positions))
    store.put(key, pointer.to_bytes())
    cache.put(src, f"file-{sha}", link)
    return pointer


def collect(store: ObjectStore, check=lambda: None) -> int:
    """Delete the segments no pointer under runs/ names (run under the writer's exclusive lock); how many.

    A writer whose lease lapsed meanwhile must not delete what a newer holder just published: segments/ is listed
    before runs/ (a segment written after that listing is no candidate), one younger than GRACE_S is left (its
    pointer may not be written yet; an orphan goes on a later night), and `check` (lock.fence) runs before the
    first deletion and every CHECK_EVERY after it."""
    written = store.modified(PREFIX)
    named = set()
    for key in store.listing("runs/"):
        if kind_of(key) and (pointer := read_pointer(store, key)):
            named |= {s["sha256"] for s in pointer.segments}
    settled = time.time() - GRACE_S
    dropped = [k for k, t in written.items() if k[len(PREFIX) :].split(".", 1)[0] not in named and t < settled]
    for n, key in enumerate(sorted(dropped)):
        if n % CHECK_EVERY == 0:
            check()
        store.delete(key)
    return len(dropped)
