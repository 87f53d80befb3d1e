"""What a trained answer model learned of a corpus, and how much of today's corpus that is.

A model trained on a corpus's own text and questions knows that corpus's sections and nothing else: its scores on a
section it never saw (or on another corpus) are not the scores its threshold was placed on. Training records what it
learned (`learned_corpus.json` beside the weights: the content hash of every section and of every chunk of the version
it paired against); each night measures today's chunks against that record. A generic model (trained on no corpus of
ours, e.g. SQuAD) has no record and no share: the share applies to corpus-specific models only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import pyarrow.parquet as pq

from sourcegate.evals.evalset import section_label

FILE = "learned_corpus.json"
HASH_CHARS = 16  # 64 bits per chunk: collisions are negligible at millions of chunks, and the record stays small
SHOW_NEW = 20  # new section ids named in run.json (all are counted)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HASH_CHARS]


def content_hashes(chunks_parquet: str | Path) -> tuple[dict[str, str], set[str]]:
    """Per section (named as a label names it: `doc#section`, or `doc` with no sections), a hash of its chunks' texts in
    order; and every chunk text's hash."""
    table = pq.read_table(chunks_parquet, columns=["doc_id", "section_id", "ordinal", "text"])
    rows = sorted(zip(*(table[c].to_pylist() for c in ("doc_id", "section_id", "ordinal", "text"))))
    texts: dict[str, list[str]] = {}
    for doc, section, _, text in rows:
        texts.setdefault(section_label(doc, section), []).append(text)
    sections = {key: _digest("\x1e".join(parts)) for key, parts in texts.items()}
    return sections, {_digest(text) for *_, text in rows}


def record(chunks_parquet: str | Path, version: str | None, note: str | None = None) -> dict:
    """What a model trained against the version in `chunks_parquet` learned of its corpus."""
    sections, chunks = content_hashes(chunks_parquet)
    return {
        "version": version,
        "sections": dict(sorted(sections.items())),
        "chunks": sorted(chunks),
        "hash": f"sha256 of the chunk text (of a section: its chunks' texts in order), first {HASH_CHARS} hex digits",
        **({"note": note} if note else {}),
    }


def write(folder: str | Path, learned: Mapping) -> Path:
    path = Path(folder) / FILE
    path.write_text(json.dumps(learned, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def read(folder: str | Path) -> dict | None:
    """The record of a model folder (an ensemble's top folder holds one for all its members), None without one."""
    path = Path(folder) / FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def share(learned: Mapping, sections: Mapping[str, str], chunks: Iterable[str]) -> dict:
    """How much of today's corpus (its sections' and chunks' hashes) the model learned: the shares of sections it saw
    with the same content and of chunks it saw, and the sections it never saw (new, or changed since)."""
    # records written before sections were named as labels name them kept a `doc#` for an article with no sections
    seen_sections = {k.removesuffix("#"): h for k, h in (learned.get("sections") or {}).items()}
    seen_chunks = set(learned.get("chunks") or ())
    chunks = list(chunks)
    same = [k for k, h in sections.items() if seen_sections.get(k) == h]
    changed = sorted(k for k, h in sections.items() if k in seen_sections and seen_sections[k] != h)
    new = sorted(k for k in sections if k not in seen_sections)
    return {
        "learned_version": learned.get("version"),
        "sections": round(len(same) / len(sections), 4) if sections else 0.0,
        "chunks": round(sum(c in seen_chunks for c in chunks) / len(chunks), 4) if chunks else 0.0,
        "n_sections": len(sections),
        "n_chunks": len(chunks),
        "new_sections": len(new),
        "changed_sections": len(changed),
        "new_examples": new[:SHOW_NEW],
        "changed_examples": changed[:SHOW_NEW],
    }


def _recipes(folder: Path) -> list[dict]:
    """The recipe of a model folder, or of each member of an ensemble folder."""
    paths = [folder / "recipe.json"]
    ensemble = folder / "ensemble.json"
    if ensemble.is_file():
        members = json.loads(ensemble.read_text(encoding="utf-8")).get("members") or []
        paths = [folder / m / "recipe.json" for m in members]
    return [json.loads(p.read_text(encoding="utf-8")) for p in paths if p.is_file()]


def corpus_specific(folder: str | Path) -> bool:
    """Trained on a corpus's own questions (`sourcegate train-in-domain`), whether or not it records which."""
    folder = Path(folder)
    return read(folder) is not None or any("train-in-domain" in str(r.get("command", "")) for r in _recipes(folder))


def measure(folder: str | Path, chunks_parquet: str | Path, min_share: float) -> dict:
    """run.json's `answer_model_corpus`: the model's scope (generic, or trained on a corpus) and, for a corpus-
    specific one, how much of today's corpus it learned and whether that is enough to gate (`min_share` of the
    sections). One that records no corpus has learned nothing we can check: it is not enough."""
    folder = Path(folder)
    if not corpus_specific(folder):
        return {"scope": "generic", "path": str(folder)}
    learned = read(folder)
    measured = share(learned, *content_hashes(chunks_parquet)) if learned else None
    enough = measured is not None and measured["sections"] >= min_share
    if measured is None:
        why = f"{folder} records no corpus it learned ({FILE})"
    else:
        why = f"{folder} learned {measured['sections']:.0%} of today's sections (at least {min_share:.0%} needed)"
    return {"scope": "corpus", "path": str(folder), "share": measured, "min_share": min_share, "enough": enough} | (
        {} if enough else {"why": why}
    )
