"""Serving from an object store: each index version downloaded once into a local cache, verified.

`query` and `verify` with `--artifacts s3://…` (embedded backend) read through `CachedStore`: LIVE and the
manifest come from the store on every call; the version's files are downloaded once into
`<cache>/<manifest sha256>/runs/<version>/index/` (SOURCEGATE_CACHE, default ~/.cache/sourcegate/versions)
and opened only after they verify against that manifest (G2). A cache entry is keyed by the manifest's
hash, so a version that changed on the store (it never should, G1) can never be served from a stale copy.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from pipelines.search.embedded import EmbeddedSearcher, EmbeddedStore
from pipelines.versions import manifest as mf
from pipelines.versions.object_store import ObjectStore

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
        index = entry / "runs" / version / "index"
        if not (index / "manifest.json").is_file():
            tmp = entry.with_name(entry.name + ".part")
            shutil.rmtree(tmp, ignore_errors=True)
            prefix = f"runs/{version}/index/"
            for key in self.store.listing(prefix):
                self.store.download(key, tmp / key)
            shutil.rmtree(entry, ignore_errors=True)
            tmp.rename(entry)
        return EmbeddedStore(entry / "runs", entry / "LIVE")

    def verify(self, version: str, hashes: bool = True) -> dict:
        return self.local(version).verify(version, hashes=hashes)

    def open(self, version: str | None = None, hashes: bool = True) -> EmbeddedSearcher:
        version = version or self.live()
        if version is None:
            raise FileNotFoundError(f"no live index ({self.store.url('LIVE')} missing); run `sourcegate run` first")
        return self.local(version).open(version, hashes=hashes)
