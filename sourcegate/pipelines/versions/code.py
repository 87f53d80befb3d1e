"""The code version a verdict is bound to: the package's version plus a hash of its installed source.

It means the same with or without git (a container image has no `.git`): any edit of a module changes it.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from sourcegate.pipelines import models

# The sourcegate package: what a night runs (steps, evaluation, artifact files and the DAGs' wiring), hashed by
# paths relative to it (the modules keep the relative paths they had at the repository root), so a checkout and
# an installed wheel of one source agree.
ROOT = Path(__file__).resolve().parents[2]


def source_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def source_hash(root: Path = ROOT) -> str:
    """SHA-256 over each source file's relative path and content, in path order."""
    digest = hashlib.sha256()
    for path in source_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """'<package version>+src.<first 12 hex of the source hash>', e.g. '0.1.0+src.3f2a9c1d0b7e'."""
    return f"{models.package_version('sourcegate') or 'unpackaged'}+src.{source_hash()[:12]}"
