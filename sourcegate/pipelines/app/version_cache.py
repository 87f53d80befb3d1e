"""Serving from an object store: each index version downloaded once into a local cache, verified.

`query` and `verify` with `--artifacts s3://…` (embedded backend) read through `CachedStore`: LIVE and the
manifest come from the store on every call; the version's files are downloaded once into
`<cache>/<manifest sha256>/runs/<version>/index/` (SOURCEGATE_CACHE, default ~/.cache/sourcegate/versions)
and opened only after they verify against that manifest (G2). A cache entry is keyed by the manifest's
hash, so a version that changed on the store (it never should, G1) can never be served from a stale copy.

Several `query` processes may share one cache: each downloads into a folder of its own
(`<hash>.part-<pid>-<random>`) and renames it into place in one step. The first rename wins; a later one
finds the entry there, keeps it and removes only its own folder. Keys and the version name become local paths only
through object_store.local_path.

The cache keeps the KEEP entries used last, and every entry a process reads: a process holds a shared `flock` on
the entry's pin (`.pins/<hash>`) from before it looks the entry up until its searcher is gone, and a fill evicts an
older entry only when it gets that pin exclusively (at once, never waiting). A long-running `serve` following
promotions on an object store so holds one version's copy, not one per night it ever served; an entry is never
deleted under a process reading it, and one evicted just before a process pins it is downloaded again. What a
killed process left (`.part-…`, `.evicted-…`, `.damaged-…` folders) is removed by a later eviction once an hour old.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
import time
import weakref
from pathlib import Path

from sourcegate.artifact_io import run_folder as rf
from sourcegate.pipelines.search.embedded import EmbeddedSearcher, EmbeddedStore
from sourcegate.pipelines.versions import manifest as mf
from sourcegate.pipelines.versions import segments
from sourcegate.pipelines.versions.object_store import ObjectStore, local_path

CACHE_ENV = "SOURCEGATE_CACHE"
KEEP = 3  # entries kept besides those in use: the live version's, the one before (a rollback) and one more
PINS = ".pins"
ENTRY = re.compile(r"[0-9a-f]{64}")  # a manifest hash: an entry's name (".part-…" and ".evicted-…" folders are not)
LEFTOVER = re.compile(r"[0-9a-f]{64}\.(?:part|evicted|damaged)-(\d+)(?:-.*)?")  # a fill's or an eviction's, by pid
LEFTOVER_S = 3600.0  # a leftover folder this old whose process is gone was left by a kill: removed
log = logging.getLogger(__name__)


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "sourcegate" / "versions")


class CachedStore:
    """The read side of an embedded store whose artifacts live on an object store."""

    def __init__(self, uri: str, root: Path | None = None):
        self.store = ObjectStore.from_uri(uri)
        self.root = root or cache_root()

    def live(self) -> str | None:
        data = self.store.get("LIVE")
        return (data.decode().strip() or None) if data else None

    def manifest(self, version: str) -> dict | None:
        data = self.store.get(f"runs/{version}/index/manifest.json")
        return json.loads(data) if data else None

    def versions(self) -> list[str]:
        return sorted({k.split("/")[1] for k in self.store.listing("runs/") if k.endswith("/index/manifest.json")})

    def promotions(self) -> list[dict]:
        return [json.loads(self.store.get(k)) for k in sorted(self.store.listing("promotions/"))]

    def local(self, version: str) -> EmbeddedStore:
        """The cached copy of `version` (downloaded when absent), as a local embedded store pinned while it lives
        (its `pin`: the entry is never evicted under it)."""
        manifest = self.manifest(version)
        if manifest is None:
            raise FileNotFoundError(f"no complete index version {version} in {self.store.uri}")
        entry = self.root / mf.manifest_hash(manifest)
        pinned = Pin(entry)  # first: an evictor holding it exclusively finishes before this looks the entry up
        if local_path(entry, f"runs/{version}/index/manifest.json").is_file():
            os.utime(entry)  # used now: the last to be evicted
        else:
            fill(self.store, entry, f"runs/{version}/index/")
            evict(self.root, keep=KEEP)
        store = EmbeddedStore(entry / rf.RUNS, entry / "LIVE")
        store.pin = pinned
        return store

    def verify(self, version: str, hashes: bool = True) -> dict:
        return self.local(version).verify(version, hashes=hashes)

    def open(self, version: str | None = None, hashes: bool = True) -> EmbeddedSearcher:
        version = version or self.live()
        if version is None:
            raise FileNotFoundError(f"no live index ({self.store.url('LIVE')} missing); run `sourcegate run` first")
        store = self.local(version)
        searcher = store.open(version, hashes=hashes)
        searcher.pin = store.pin  # the entry stays while the searcher reads it
        return searcher


class Pin:
    """A shared flock on an entry's pin file, released when this object is gone (or `release`d)."""

    def __init__(self, entry: Path):
        pins = entry.parent / PINS
        pins.mkdir(parents=True, exist_ok=True)
        fd = os.open(pins / entry.name, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while an evictor removes this entry (it never waits itself)
        self.release = weakref.finalize(self, os.close, fd)


def evict(root: Path, keep: int = KEEP) -> list[str]:
    """Remove the entries beyond the `keep` used last that no process pins; returns their names. The pin files
    stay (a few bytes each): removing one could let a waiting reader lock a file no evictor looks at."""
    used: dict[Path, float] = {}
    for path in root.iterdir():
        if ENTRY.fullmatch(path.name):
            with contextlib.suppress(FileNotFoundError):  # another process evicted it meanwhile
                used[path] = path.stat().st_mtime
    entries = sorted(used, key=used.__getitem__)
    evicted = []
    for entry in entries[: max(len(entries) - keep, 0)]:
        fd = os.open(root / PINS / entry.name, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a process reads it
            aside = root / f"{entry.name}.evicted-{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):  # another evictor took it first
                entry.rename(aside)
                shutil.rmtree(aside, ignore_errors=True)
                evicted.append(entry.name)
        finally:
            os.close(fd)
    if evicted:
        log.info(
            "version cache %s: evicted %d entr%s no process reads",
            root,
            len(evicted),
            "y" if len(evicted) == 1 else "ies",
        )
    sweep(root)
    return evicted


def sweep(root: Path) -> None:
    """Remove the folders a killed process left (a download, an entry set aside): those over LEFTOVER_S old whose
    process is gone (a download's folder keeps the time it was made however long the download runs)."""
    for path in root.iterdir():
        match = LEFTOVER.fullmatch(path.name)
        if not match or running(int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):  # another process swept it meanwhile
            if time.time() - path.stat().st_mtime > LEFTOVER_S:
                shutil.rmtree(path, ignore_errors=True)


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def fill(store: ObjectStore, entry: Path, prefix: str) -> None:
    """Download `prefix` into a folder of this process's own, then rename it to `entry` in one step; when
    another process's rename came first, keep theirs (same manifest hash, same bytes) and drop ours."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{entry.name}.part-{os.getpid()}-", dir=entry.parent))
    try:
        paths = {key: local_path(tmp, key) for key in store.listing(prefix)}  # all checked before any download
        for key, path in paths.items():
            segments.download(store, key, path)
        try:
            tmp.rename(entry)  # atomic; fails when `entry` exists (a non-empty folder)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            if not local_path(entry, f"{prefix}manifest.json").is_file():  # a damaged entry: set aside, replaced
                aside = Path(tempfile.mkdtemp(prefix=f"{entry.name}.damaged-{os.getpid()}-", dir=entry.parent))
                with contextlib.suppress(FileNotFoundError):  # another process set it aside first
                    entry.rename(aside / entry.name)
                shutil.rmtree(aside, ignore_errors=True)
                try:
                    tmp.rename(entry)
                except OSError:
                    if not local_path(entry, f"{prefix}manifest.json").is_file():
                        raise
                    # ...and put its own copy in place first: that one is kept
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing left once renamed
