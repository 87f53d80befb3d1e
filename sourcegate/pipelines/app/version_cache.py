"""Serving from an object store: each index version downloaded once into a local cache, verified.

`query` and `verify` with `--artifacts s3://…` (embedded backend) read through `CachedStore`: LIVE and the
manifest come from the store on every call; the version's files are downloaded once into
`<cache>/<manifest sha256>/runs/<version>/index/` (SOURCEGATE_CACHE, default ~/.cache/sourcegate/versions)
and opened only after they verify against that manifest (G2). A cache entry is keyed by the manifest's
hash, so a version that changed on the store (it never should, G1) can never be served from a stale copy.

Several `query` processes may share one cache: each downloads into a folder of its own
(`<hash>.part-<pid>-<random>`) and renames it into place in one step. The first rename wins; a later one
finds the entry there, keeps it and removes only its own folder, so an entry is never deleted or replaced
under a process serving it. Keys and the version name become local paths only through
object_store.local_path.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

from sourcegate.artifact_io import run_folder as rf
from sourcegate.pipelines.search.embedded import EmbeddedSearcher, EmbeddedStore
from sourcegate.pipelines.versions import manifest as mf
from sourcegate.pipelines.versions import segments
from sourcegate.pipelines.versions.object_store import ObjectStore, local_path

CACHE_ENV = "SOURCEGATE_CACHE"


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
        """The cached copy of `version` (downloaded when absent), as a local embedded store."""
        manifest = self.manifest(version)
        if manifest is None:
            raise FileNotFoundError(f"no complete index version {version} in {self.store.uri}")
        entry = self.root / mf.manifest_hash(manifest)
        if not local_path(entry, f"runs/{version}/index/manifest.json").is_file():
            fill(self.store, entry, f"runs/{version}/index/")
        return EmbeddedStore(entry / rf.RUNS, entry / "LIVE")

    def verify(self, version: str, hashes: bool = True) -> dict:
        return self.local(version).verify(version, hashes=hashes)

    def open(self, version: str | None = None, hashes: bool = True) -> EmbeddedSearcher:
        version = version or self.live()
        if version is None:
            raise FileNotFoundError(f"no live index ({self.store.url('LIVE')} missing); run `sourcegate run` first")
        return self.local(version).open(version, hashes=hashes)


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
