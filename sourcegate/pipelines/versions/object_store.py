"""Artifacts on an object store (`artifacts: s3://bucket/prefix`), through pyarrow.fs.

The steps stay pure functions over local paths (sourcegate/pipelines/app/staging.py stages their inputs and
publishes their outputs); this module is the only place that talks to the store, and it talks only
through `pyarrow.fs.S3FileSystem` (no hand-written client). Endpoint and credentials come from the
standard AWS environment: the SDK reads AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN
itself; pyarrow 26 does not read AWS_ENDPOINT_URL, so it is passed as `endpoint_override` here
(AWS_ENDPOINT_URL_S3 first, as the AWS CLI does). Inside a DAG task they may come from an Airflow
connection instead (sourcegate/dags/common.py reads it; `connection(options)` hands them to every store opened in
that block, in that task only). `s3_filesystem()` is the one place the filesystem is built. Nothing
secret is ever kept in a value this module returns or logs.

pyarrow.fs exposes no conditional PUT (If-None-Match), so "write once" is enforced by the writer that
holds the lock (sourcegate/pipelines/release/object_lock.py): an object that exists with other bytes is never
overwritten (`WriteOnceViolation`), one with the same bytes is left as it is. A key becomes a local path only
through `local_path`, which refuses one that could leave its folder (`UnsafeKey`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

SCHEMES = ("s3://",)
CHUNK = 8 << 20
MANIFEST = "/index/manifest.json"  # an index version's, under its run folder: written last, deleted first (G2)
READ_ATTEMPTS = 3  # reads of an object that another writer keeps replacing before the store's error is raised


class WriteOnceViolation(RuntimeError):
    """An immutable object already exists with different content."""


class UnsafeKey(ValueError):
    """An object key that would name a path outside the local folder it is copied into."""


def local_path(root: Path, key: str) -> Path:
    """`root / key` for an object key copied to local disk, refusing any key that could leave `root` or name
    something other than what it says: absolute, a `.` or `..` segment, an empty segment, a backslash (a
    separator on some systems), NUL or another control character. The store's listing is not trusted."""
    reason = key_problem(key)
    if reason:
        raise UnsafeKey(f"refusing the object key {key!r}: {reason}")
    return root.joinpath(*key.split("/"))


def key_problem(key: str) -> str | None:
    if not key:
        return "it is empty"
    if bad := next((c for c in key if ord(c) < 32 or ord(c) == 127), None):
        return f"it holds the control character {bad!r}"
    if "\\" in key:
        return "it holds a backslash"
    if key.startswith("/"):
        return "it is absolute"
    segments = key.split("/")
    if any(s in (".", "..") for s in segments):
        return "it has a '.' or '..' segment"
    if "" in segments:
        return "it has an empty segment"
    return None


class StoreUnavailable(RuntimeError):
    """The object store failed a request (unreachable, refused, timed out): names the store and what was asked."""


def is_remote(artifacts: str | os.PathLike) -> bool:
    return str(artifacts).startswith(SCHEMES)


def split_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/prefix` -> ("bucket", "prefix"), with a clear error for anything else."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"artifacts {uri!r}: expected s3://bucket/prefix or a local folder")
    if parsed.query or parsed.fragment or "@" in parsed.netloc:
        shown = parsed._replace(netloc=parsed.netloc.rpartition("@")[2]).geturl()  # never echo the credentials
        raise ValueError(f"artifacts {shown!r}: no credentials, query or fragment in the URI (use the AWS environment)")
    return parsed.netloc, parsed.path.strip("/")


def endpoint_from_env(env: os._Environ | dict = os.environ) -> dict:
    """S3FileSystem keyword arguments from the standard AWS endpoint and region variables (no secrets)."""
    kwargs = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        parsed = urlparse(endpoint)
        kwargs["endpoint_override"] = parsed.netloc or parsed.path
        kwargs["scheme"] = parsed.scheme or "https"
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    return kwargs


# S3FileSystem keyword arguments from an Airflow connection, for the stores opened inside `connection(...)`;
# None: the AWS environment. A context variable, not os.environ: nothing leaks into subprocesses or other tasks.
_CONNECTION: ContextVar[dict | None] = ContextVar("sourcegate_s3_connection", default=None)


def connection_options(
    login: str | None, password: str | None, extra: Mapping, env: os._Environ | dict = os.environ
) -> dict:
    """S3FileSystem keyword arguments from an AWS-style connection (the Amazon provider's fields): `login` the access
    key id, `password` the secret, `extra` {"endpoint_url", "region_name", "aws_session_token"}. What the connection
    does not state comes from the environment (endpoint, region) or the SDK's default chain (credentials)."""
    kwargs = endpoint_from_env(env)
    if extra.get("endpoint_url"):
        kwargs.update(endpoint_from_env({"AWS_ENDPOINT_URL": str(extra["endpoint_url"])}))
    if extra.get("region_name"):
        kwargs["region"] = str(extra["region_name"])
    if bool(login) != bool(password):
        raise ValueError("the AWS connection needs both login (access key id) and password (secret), or neither")
    if login:
        kwargs["access_key"], kwargs["secret_key"] = login, password
        if extra.get("aws_session_token"):
            kwargs["session_token"] = str(extra["aws_session_token"])
    return kwargs


@contextmanager
def connection(options: dict | None) -> Iterator[None]:
    """Every store opened inside this block (in this thread or task) uses `options` (connection_options), not the
    AWS environment; None: the environment."""
    token = _CONNECTION.set(options)
    try:
        yield
    finally:
        _CONNECTION.reset(token)


def s3_filesystem():
    """The one place a `pyarrow.fs.S3FileSystem` is built: from `connection(...)`'s options inside one, else from the
    standard AWS environment."""
    from pyarrow import fs as pafs

    options = _CONNECTION.get()
    kwargs = endpoint_from_env() if options is None else options
    return pafs.S3FileSystem(**kwargs, connect_timeout=5, request_timeout=30)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_path(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class ObjectStore:
    """Keys relative to one `s3://bucket/prefix`; every call is one or a few object requests."""

    uri: str
    fs: object  # pyarrow.fs.FileSystem
    root: str  # "bucket/prefix"

    @classmethod
    def from_uri(cls, uri: str, fs=None) -> ObjectStore:
        bucket, prefix = split_uri(uri)
        if fs is None:
            fs = s3_filesystem()
        return cls(uri.rstrip("/"), fs, f"{bucket}/{prefix}".rstrip("/"))

    def path(self, key: str) -> str:
        return f"{self.root}/{key.lstrip('/')}"

    def url(self, key: str) -> str:
        return f"{self.uri}/{key.lstrip('/')}"

    def listing(self, prefix: str = "") -> dict[str, int]:
        """Every object under `prefix` (recursive): key -> size."""
        return {key: info.size for key, info in self.infos(prefix).items()}

    def modified(self, prefix: str = "") -> dict[str, float]:
        """Every object under `prefix` (recursive): key -> when it was last written (seconds since the epoch; 0 when
        the store does not say)."""
        return {key: (info.mtime_ns or 0) / 1e9 for key, info in self.infos(prefix).items()}

    def infos(self, prefix: str = "") -> dict:
        """Every object under `prefix` (recursive): key -> its pyarrow FileInfo."""
        from pyarrow import fs as pafs

        base = self.path(prefix).rstrip("/")
        info = self.fs.get_file_info(base)
        if info.type != pafs.FileType.Directory:
            return {}
        found = self.fs.get_file_info(pafs.FileSelector(base, recursive=True))
        start = len(self.root) + 1
        return {i.path[start:]: i for i in found if i.type == pafs.FileType.File}

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        """The object's size in bytes; None when it does not exist."""
        from pyarrow import fs as pafs

        info = self.fs.get_file_info(self.path(key))
        return info.size if info.type == pafs.FileType.File else None

    def get(self, key: str) -> bytes | None:
        """The object's bytes, None when it does not exist (also when another process deletes it between the
        look-up and the read: a released lock object is exactly that). pyarrow reads as many bytes as the size it
        looked up when it opened the object, so an object replaced by one of another size meanwhile (a renewed lock
        claim) reads torn or fails: read again, until the size after the read is the size read."""
        for attempt in range(1, READ_ATTEMPTS + 1):
            if self.size(key) is None:
                return None
            try:
                with self.fs.open_input_stream(self.path(key)) as stream:
                    # in blocks: one read() of a large object is ~30x slower (a 208 MB segment: 92 s vs 3.7 s on moto)
                    data = b"".join(iter(lambda: stream.read(CHUNK), b""))
            except FileNotFoundError:
                return None
            except OSError:
                # deleted or replaced between the size look-up and the read: the SDK reports the store's error body,
                # larger than the buffer sized for the object, as "Failed to flush response stream" (CI, 2026-12-06)
                if attempt == READ_ATTEMPTS:
                    raise
                continue
            if self.size(key) == len(data):
                return data
        raise OSError(f"{self.url(key)} changed size while it was read, {READ_ATTEMPTS} times")

    def download(self, key: str, dest: Path) -> None:
        """The object's bytes as the file `dest` (a pointer to segments as it is: versions/segments.py rebuilds the
        file it names)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.part")
        with self.fs.open_input_stream(self.path(key)) as src, open(tmp, "wb") as out:
            while block := src.read(CHUNK):
                out.write(block)
        tmp.replace(dest)

    def download_rows(self, key: str, dest: Path, span) -> int:
        """A Parquet object's rows [start, stop) = `span(its row count)` only: a local file of the object's size holding its header,
        footer and the column chunks of the row groups that hold those rows at their offsets, zeros (a
        sparse hole) elsewhere; a reader of only those row groups (batches.read_rows) reads it as the object.
        Returns the bytes downloaded."""
        import pyarrow.parquet as pq

        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.part")
        with self.fs.open_input_file(self.path(key)) as src, open(tmp, "wb") as out:
            size = src.size()
            meta = pq.ParquetFile(src).metadata
            start, stop = span(meta.num_rows)
            footer = int.from_bytes(src.read_at(8, size - 8)[:4], "little") + 8
            ranges = [(0, 4), (size - footer, footer)] + row_group_ranges(meta, start, stop)
            out.truncate(size)
            for offset, length in ranges:
                out.seek(offset)
                out.write(src.read_at(length, offset))
        tmp.replace(dest)
        return sum(length for _, length in ranges)

    def _writable(self, key: str) -> str:
        """The key's path; a local filesystem (unit tests) needs its folders, an object store has none."""
        path = self.path(key)
        if self.fs.type_name == "local":
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        return path

    def put(self, key: str, data: bytes) -> None:
        """One PUT of the whole object: readers see the old bytes or the new ones, never a mix."""
        with self.fs.open_output_stream(self._writable(key)) as out:
            out.write(data)

    def upload(self, src: Path, key: str) -> None:
        with open(src, "rb") as fh, self.fs.open_output_stream(self._writable(key)) as out:
            while block := fh.read(CHUNK):
                out.write(block)

    def upload_once(self, src: Path, key: str, write=None, sha256=None) -> bool:
        """Write an immutable object (with `write(src, key)`, default `upload`): refuse if one exists with other
        content (`sha256(key)`: of the file the object holds, default its bytes'); True when it was written."""
        if self.exists(key):
            current = sha256(key) if sha256 else sha256_bytes(self.get(key))
            if current != sha256_path(src):
                raise WriteOnceViolation(f"refusing to overwrite {self.url(key)}: it exists with other content")
            return False
        (write or self.upload)(src, key)
        return True

    def put_once(self, key: str, data: bytes) -> bool:
        if self.exists(key):
            if self.get(key) != data:
                raise WriteOnceViolation(f"refusing to overwrite {self.url(key)}: it exists with other content")
            return False
        self.put(key, data)
        return True

    def delete(self, key: str) -> None:
        """Delete the object; one already gone is no error (two waiters breaking the same lapsed claim: pyarrow
        looks the object up before it deletes it, and raises to the one that came second)."""
        with suppress(FileNotFoundError):
            self.fs.delete_file(self.path(key))

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under `prefix`, an index version's manifest first (G2: a version is complete only
        while its manifest exists, so one half deleted by a crash is incomplete, never complete with files missing)."""
        for key in sorted(self.listing(prefix), key=lambda key: not key.endswith(MANIFEST)):
            self.delete(key)


def row_group_ranges(meta, start: int, stop: int) -> list[tuple[int, int]]:
    """(offset, length) of every column chunk of the row groups holding rows [start, stop)."""
    ranges, first = [], 0
    for group in range(meta.num_row_groups):
        rg = meta.row_group(group)
        if max(start, first) < min(stop, first + rg.num_rows):
            for c in range(rg.num_columns):
                col = rg.column(c)
                begin = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
                ranges.append((begin, col.total_compressed_size))
        first += rg.num_rows
    return ranges
