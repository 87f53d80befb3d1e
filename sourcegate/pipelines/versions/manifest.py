"""Index version manifests: what a version holds, what it was built from, and the check that it still does.

A version is complete only once its manifest is written, last, after every file (G2). The manifest
names the inputs the version was built from (corpus hash, index config hash, model fingerprint,
code version) so a rerun of the same night can reuse it or refuse, never rebuild it (G1), and its
own hash is what a gate verdict is bound to (G3). Both backends call these small pure functions;
the OpenSearch store keeps the same manifest in the index's ``_meta``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sourcegate.pipelines.versions import stamp

MANIFEST_FILE = "manifest.json"  # inside the embedded version folder (runs/<version>/index/)
FORMAT = 1
# What a version was built from: a rerun with the same run id reuses the version when all match.
INPUT_KEYS = ("corpus_hash", "config_hash", "model_fingerprint", "code_version")
_CHUNK = 1 << 20


class IntegrityError(RuntimeError):
    """A version's files (or records) do not match its manifest, or it has none: never served."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems or [message])


class VersionConflict(RuntimeError):
    """A complete version exists under this name but was built from other inputs: never rebuilt."""


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def sha256_json(obj: Any) -> str:
    """Hash of a JSON value in canonical form (sorted keys, no whitespace)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_entries(folder: str | Path, names: Iterable[str]) -> dict[str, dict]:
    """{name: {sha256, bytes}} for each file of a version."""
    folder = Path(folder)
    return {n: {"sha256": sha256_file(folder / n), "bytes": (folder / n).stat().st_size} for n in sorted(names)}


def build_manifest(
    version: str,
    *,
    rows: int,
    dimension: int,
    inputs: Mapping | None = None,
    files: Mapping[str, Mapping] | None = None,
    created: str | None = None,
    **extra: Any,
) -> dict:
    """The manifest of one version. `inputs` holds INPUT_KEYS (and may add chunker, model_id)."""
    return {
        "format": FORMAT,
        "version": version,
        "created": created or datetime.now(UTC).isoformat(timespec="microseconds"),
        "rows": int(rows),
        "dimension": int(dimension),
        "inputs": {k: (inputs or {}).get(k) for k in INPUT_KEYS} | dict(inputs or {}),
        "files": {k: dict(v) for k, v in (files or {}).items()},
        **extra,
    }


def manifest_hash(manifest: Mapping) -> str:
    """What a gate verdict is bound to: any rebuild (new files or creation time) changes it."""
    return sha256_json(manifest)


def differences(existing: Mapping, wanted: Mapping) -> list[str]:
    """The inputs (INPUT_KEYS) that differ, as 'key: existing -> wanted' lines."""
    return [f"{k}: {existing.get(k)!r} -> {wanted.get(k)!r}" for k in INPUT_KEYS if existing.get(k) != wanted.get(k)]


def conflict(version: str, existing: Mapping, wanted: Mapping) -> VersionConflict | None:
    """The refusal to rebuild a complete version from other inputs, or None when they match."""
    diff = differences(existing.get("inputs") or {}, wanted)
    if not diff:
        return None
    return VersionConflict(
        f"index version {version} exists and is complete, but was built from other inputs "
        f"({'; '.join(diff)}); a version is never rebuilt: run again with a new run id"
    )


def write_manifest(folder: str | Path, manifest: Mapping) -> Path:
    from sourcegate.artifact_io import write_json

    return write_json(manifest, Path(folder) / MANIFEST_FILE)


def read_manifest(folder: str | Path) -> dict | None:
    """The version's manifest, or None when it has none (an incomplete version)."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"{path}: unreadable manifest ({exc})") from exc


def file_problems(folder: str | Path, manifest: Mapping, *, hashes: bool = True) -> list[str]:
    """Each file of the version that is missing or differs in size (or, with `hashes`, in SHA-256)."""
    folder = Path(folder)
    problems = []
    for name, want in sorted((manifest.get("files") or {}).items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        size = path.stat().st_size
        if size != want["bytes"]:
            problems.append(f"{path}: {size} bytes, manifest says {want['bytes']}")
        elif hashes and sha256_file(path) != want["sha256"]:
            problems.append(f"{path}: SHA-256 differs from the manifest (content changed)")
    return problems


def verify_folder(folder: str | Path, version: str, *, hashes: bool = True, proof: bool = False) -> dict:
    """The manifest of a complete, intact embedded version; IntegrityError naming each bad file otherwise.

    With `hashes`, every file's SHA-256 (then a `.verified` stamp is left, sourcegate/pipelines/versions/stamp.py);
    with `proof` too, a stamp still holding for these files stands in for the hashing (opening a version).
    """
    manifest = read_manifest(folder)
    if manifest is None:
        raise IntegrityError(
            f"index version {version} is incomplete: {Path(folder) / MANIFEST_FILE} is missing "
            "(a crashed or unfinished load); it is never opened or promoted"
        )
    names, key = list(manifest.get("files") or {}), manifest_hash(manifest)
    if hashes and proof and stamp.stamp_holds(folder, key, names):
        return manifest
    before = stamp.identities(folder, names)
    problems = file_problems(folder, manifest, hashes=hashes)
    if problems:
        raise IntegrityError(f"index version {version} is corrupt: " + "; ".join(problems), problems)
    if hashes:
        stamp.write_stamp(folder, key, before)
    return manifest


def check_model(index_manifest: Mapping | None, fingerprint: str | None, what: str = "the query embedder") -> None:
    """The query side must embed with the very weights the index was built with."""
    if index_manifest is None:
        return
    recorded = (index_manifest.get("inputs") or {}).get("model_fingerprint")
    if recorded != fingerprint:
        raise IntegrityError(
            f"index version {index_manifest.get('version')} was embedded with model fingerprint {recorded}, "
            f"but {what} has {fingerprint}: its vectors are not comparable; use the model the index was built "
            "with (embedding.model_id / model_path) or build a new version"
        )
