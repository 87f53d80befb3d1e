"""A worker's local cache of content-addressed store objects: what makes a night's reads follow the change.

Every object it holds is named by its content (a segment `<sha256>.parquet`, its `<sha256>.digests`, its rows
decoded `<sha256>.arrow`, or a whole rebuilt file `file-<sha256>`), and such an object never changes on the store, so a hit needs no
request and can never be stale. A worker that published a table or ran the task before keeps what it
wrote or rebuilt; a task that lands on a fresh worker downloads what it reads once. Nothing else shares it:
the store stays the only thing tasks share, and an empty or missing cache changes what is read, not
what is computed (every rebuilt file is checked against its sha256). Another task or thread sharing the folder
may trim an entry between its look-up and its read: a reader treats the entry it then cannot find as a miss.

SOURCEGATE_SEGMENT_CACHE names the folder (default ~/.cache/sourcegate/segments; `off` keeps nothing),
SOURCEGATE_SEGMENT_CACHE_GB bounds it (default 4): past it, the least recently used entries go (and temporaries a
killed process left, once an hour old).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

CACHE_ENV = "SOURCEGATE_SEGMENT_CACHE"
LIMIT_ENV = "SOURCEGATE_SEGMENT_CACHE_GB"
DEFAULT_GB = 4.0
LEFTOVER_S = 3600.0  # a temporary untouched for this long was left by a killed process: removed by trim


class ObjectCache:
    """Content-addressed files under `root` (None: a cache that keeps nothing)."""

    def __init__(self, root: Path | None, limit_bytes: int):
        self.root, self.limit_bytes = root, limit_bytes

    @classmethod
    def from_env(cls, env=os.environ) -> ObjectCache:
        where = env.get(CACHE_ENV) or str(Path.home() / ".cache" / "sourcegate" / "segments")
        limit = int(float(env.get(LIMIT_ENV) or DEFAULT_GB) * 1e9)
        return cls(None if where == "off" else Path(where), limit)

    def get(self, name: str) -> Path | None:
        """The cached file called `name`, marked as used; None when absent."""
        if self.root is None:
            return None
        path = self.root / name
        try:
            os.utime(path)
        except FileNotFoundError:
            return None
        return path

    def put(self, src: Path, name: str, link: bool = False) -> Path | None:
        """Keep `src` as `name`: a copy, or with `link` a hard link where the disk allows (a staged scratch
        folder's file, published and about to be removed); the cached path, or None when nothing is kept."""
        return self.place(name, lambda tmp: (link and linked(src, tmp)) or shutil.copyfile(src, tmp))

    def put_bytes(self, data: bytes, name: str) -> None:
        self.place(name, lambda tmp: tmp.write_bytes(data))

    def place(self, name: str, write) -> Path | None:
        """`write(temp path)` in the cache folder, moved into place as `name` (kept as it is when there)."""
        if self.root is None:
            return None
        path = self.root / name
        if self.get(name) is not None:
            return path
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{name}.", suffix=".tmp")
        os.close(fd)
        try:
            write(Path(tmp))
            os.replace(tmp, path)  # another process's copy of the same content may land first: same bytes
        finally:
            Path(tmp).unlink(missing_ok=True)
        self.trim()
        return path

    def copy_to(self, name: str, dest: Path, size: int | None = None) -> bool:
        """The cached `name` as `dest`: a hard link where the disk allows (the steps replace a file to change it,
        never rewrite it in place), else a copy; False when absent or not `size` bytes long (damaged: dropped), also
        when another task trims it between the look-up and the copy."""
        path = self.get(name)
        if path is None:
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.part")
        try:
            if size is not None and path.stat().st_size != size:
                self.drop(name)
                return False
            if not linked(path, tmp):
                shutil.copyfile(path, tmp)
        except FileNotFoundError:
            tmp.unlink(missing_ok=True)
            return False
        tmp.replace(dest)
        return True

    def drop(self, name: str) -> bool:
        """Remove `name` (damaged, or no longer wanted); whether it was there."""
        if self.root is None:
            return False
        try:
            (self.root / name).unlink()
            return True
        except FileNotFoundError:
            return False

    def trim(self) -> None:
        """Drop the least recently used entries until the cache fits its limit."""
        entries = []
        for p in self.root.iterdir():
            try:  # another task or staging thread may drop an entry between the listing and its stat
                st = p.stat()
            except FileNotFoundError:
                continue
            if p.name.startswith("."):  # place's temporary: being written, or left by a killed process
                # by its ctime: a temporary hard-linked to an old file has that file's mtime, but a new ctime
                if p.name.endswith(".tmp") and time.time() - st.st_ctime > LEFTOVER_S:
                    p.unlink(missing_ok=True)
                continue
            entries.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries, key=lambda e: e[0]):
            if total <= self.limit_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size


def linked(src: Path, dest: Path) -> bool:
    """Hard-link `src` as `dest` (replacing it); False where the disk does not allow it (another device)."""
    try:
        dest.unlink(missing_ok=True)
        os.link(src, dest)
        return True
    except OSError:
        return False
