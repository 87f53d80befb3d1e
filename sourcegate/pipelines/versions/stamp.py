"""A cheap proof that an embedded version's files are still the ones last hashed (docs/benchmarks/17-open-verified.md).

Hashing every file on every open costs a full read (about 1.5 GB a query at 1M chunks). A full SHA-256
check (at write, promote, `verify`) leaves ``.verified`` beside the manifest: the manifest's hash and each
file's identity (size, mtime_ns, ctime_ns, inode) taken before the hashing and unchanged after it. Opening
accepts the version without reading its files while every identity and the manifest still match, and
re-hashes when any changed. ctime cannot be set back by a user (`touch -d` moves it), so a rewrite in place
that keeps size and mtime still changes the identity. A stamp is a cache, not a seal: anyone who can
rewrite the files can rewrite it; `verify` never reads it.

A model folder's fingerprint is stamped the same way (`sourcegate.pipelines.models.fingerprint`), in the user's
cache rather than beside weights that may sit in a read-only site-packages.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

STAMP_FILE = ".verified"
log = logging.getLogger(__name__)


def identities(folder: str | Path, names: Iterable[str]) -> dict[str, list[int]] | None:
    """{name: [size, mtime_ns, ctime_ns, inode]} of each file, or None when one is missing."""
    out = {}
    for name in sorted(names):
        try:
            st = os.stat(Path(folder) / name)
        except FileNotFoundError:
            return None
        out[name] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    return out


def write_stamp(
    folder: str | Path, manifest_sha256: str, before: Mapping[str, list[int]] | None, at: Path | None = None
) -> None:
    """Record the files as verified under `manifest_sha256` (the hash they were checked against), if they kept the
    identity they had when the hashing began. `at`: where the stamp is kept (default: `STAMP_FILE` in `folder`)."""
    names = list(before or {})
    at = at or Path(folder) / STAMP_FILE
    if before is None or identities(folder, names) != before:
        log.warning("%s: a file changed while it was hashed; no %s stamp written", folder, at.name)
        return
    from sourcegate.artifact_io import write_json

    try:
        at.parent.mkdir(parents=True, exist_ok=True)
        write_json({"manifest_sha256": manifest_sha256, "files": dict(before)}, at)
    except OSError as exc:  # a read-only folder: the next open re-hashes, nothing is lost
        log.warning("%s: cannot write %s (%s); every open will re-hash", folder, at, exc)


def stamped(folder: str | Path, names: Iterable[str], at: Path | None = None) -> str | None:
    """The hash a stamp recorded, while every file still has the identity it had when hashed; else None."""
    try:
        stamp = json.loads((at or Path(folder) / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("files") != identities(folder, names):
        return None
    return stamp.get("manifest_sha256")


def stamp_holds(folder: str | Path, manifest_sha256: str, names: Iterable[str]) -> bool:
    """True when the stamp is for this manifest and every file has the identity it had when hashed."""
    return stamped(folder, names) == manifest_sha256
