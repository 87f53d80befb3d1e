"""Ingest: a corpus source -> documents.parquet, quarantine.jsonl and manifest.parquet.

Two sources: a folder of Markdown articles (optional YAML front matter) and a BEIR
corpus.jsonl. Bad input never crashes the run and is never dropped silently: each bad
document goes to the quarantine file with a reason, and the counts land in run.json.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from pipelines.io import write_parquet, write_text

DOCUMENT_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("title", pa.string()),
        ("body", pa.string()),  # Markdown without front matter and title line, or plain text
        ("format", pa.string()),  # markdown | plain
        ("source", pa.string()),  # file path or file:line, relative to the corpus root
        ("content_hash", pa.string()),
    ]
)
MANIFEST_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("content_hash", pa.string()),
        ("status", pa.string()),
    ]
)
MARKDOWN_SUFFIXES = {".md", ".markdown"}


@dataclass
class IngestResult:
    documents: Path
    quarantine: Path
    manifest: Path
    counts: dict


class Rejected(Exception):
    """A document that goes to quarantine; the message is the reason."""


def ingest(
    source: str | Path,
    out_dir: str | Path,
    *,
    fmt: str = "markdown",
    max_doc_bytes: int = 200_000,
    previous_documents: str | Path | None = None,
) -> IngestResult:
    """Read `source`, write documents/quarantine/manifest into `out_dir`."""
    source, out_dir = Path(source), Path(out_dir)
    if not source.exists():
        raise FileNotFoundError(f"corpus source not found: {source}")
    reader = read_markdown_folder if fmt == "markdown" else read_beir_corpus
    docs, rejected = [], []
    seen: set[str] = set()
    for origin, parsed in reader(source, max_doc_bytes):
        if isinstance(parsed, Rejected):
            rejected.append({"source": origin, "reason": str(parsed)})
            continue
        if parsed["doc_id"] in seen:
            rejected.append(
                {
                    "source": origin,
                    "doc_id": parsed["doc_id"],
                    "reason": f"duplicate id {parsed['doc_id']!r} (first occurrence kept)",
                }
            )
            continue
        seen.add(parsed["doc_id"])
        parsed["source"] = origin
        parsed["content_hash"] = content_hash(parsed)
        docs.append(parsed)
    docs.sort(key=lambda d: d["doc_id"])

    documents = write_parquet(pa.Table.from_pylist(docs, schema=DOCUMENT_SCHEMA), out_dir / "documents.parquet")
    quarantine = write_text(
        "".join(json.dumps(r, sort_keys=True) + "\n" for r in rejected), out_dir / "quarantine.jsonl"
    )
    manifest_rows = diff_manifest(docs, previous_documents)
    manifest = write_parquet(pa.Table.from_pylist(manifest_rows, schema=MANIFEST_SCHEMA), out_dir / "manifest.parquet")
    counts = {s: sum(r["status"] == s for r in manifest_rows) for s in ("added", "changed", "deleted", "unchanged")}
    counts.update(documents=len(docs), quarantined=len(rejected), quarantine_reasons=_reason_counts(rejected))
    return IngestResult(documents, quarantine, manifest, counts)


def content_hash(doc: dict) -> str:
    h = hashlib.sha256()
    for field in ("doc_id", "title", "body", "format"):
        h.update(doc[field].encode("utf-8") + b"\x00")
    return h.hexdigest()


def diff_manifest(docs: list[dict], previous_documents: str | Path | None) -> list[dict]:
    """What this run saw against the previous run: added / changed / unchanged / deleted."""
    before: dict[str, str] = {}
    if previous_documents and Path(previous_documents).exists():
        t = pq.read_table(previous_documents, columns=["doc_id", "content_hash"])
        before = dict(zip(t["doc_id"].to_pylist(), t["content_hash"].to_pylist()))
    rows = []
    for d in docs:
        old = before.get(d["doc_id"])
        status = "added" if old is None else "unchanged" if old == d["content_hash"] else "changed"
        rows.append({"doc_id": d["doc_id"], "content_hash": d["content_hash"], "status": status})
    now = {d["doc_id"] for d in docs}
    rows += [{"doc_id": i, "content_hash": h, "status": "deleted"} for i, h in sorted(before.items()) if i not in now]
    return rows


def _reason_counts(rejected: list[dict]) -> dict:
    out: dict[str, int] = {}
    for r in rejected:
        key = r["reason"].split(" (")[0].split(":")[0]
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


# --- Markdown folder -------------------------------------------------------------

_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.S)
_TITLE_LINE = re.compile(r"\A\s*#[ \t]+(.+?)[ \t]*#*[ \t]*(?:\r?\n|\Z)")


def read_markdown_folder(root: Path, max_doc_bytes: int):
    """Yield (relative path, document dict | Rejected) for every file under root, sorted."""
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not _hidden(p, root)):
        rel = path.relative_to(root).as_posix()
        try:
            yield rel, parse_markdown(path, root, max_doc_bytes)
        except Rejected as exc:
            yield rel, exc


def parse_markdown(path: Path, root: Path, max_doc_bytes: int) -> dict:
    data = path.read_bytes()
    if len(data) > max_doc_bytes:
        raise Rejected(f"over size cap: {len(data)} bytes > {max_doc_bytes}")
    if b"\x00" in data:
        raise Rejected("binary file: contains NUL bytes")
    if path.suffix.lower() not in MARKDOWN_SUFFIXES:
        raise Rejected(f"not a Markdown file: suffix {path.suffix or '(none)'!r}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Rejected(f"invalid UTF-8: byte {exc.start}") from None
    text = text.lstrip("\ufeff")
    meta: dict = {}
    if text.startswith("---"):
        m = _FRONT_MATTER.match(text)
        if not m:
            raise Rejected("malformed front matter: opening --- without a closing ---")
        try:
            meta = yaml.safe_load(m.group(1)) or {}
        except yaml.YAMLError as exc:
            raise Rejected(f"malformed front matter: {str(exc).splitlines()[0]}") from None
        if not isinstance(meta, dict):
            raise Rejected("malformed front matter: not a mapping")
        text = text[m.end() :]
    title = str(meta.get("title") or "").strip()
    m = _TITLE_LINE.match(text)
    if m:
        title = title or m.group(1).strip()
        text = text[m.end() :]
    if not title:
        raise Rejected("missing title: no front-matter title and no '# ' heading")
    body = text.strip()
    if not re.search(r"\w", re.sub(r"(?m)^#+.*$", "", body)):
        raise Rejected("empty body")
    doc_id = str(meta.get("id") or path.relative_to(root).with_suffix("").as_posix())
    return {"doc_id": doc_id, "title": title, "body": body, "format": "markdown"}


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


# --- BEIR corpus.jsonl ------------------------------------------------------------


def read_beir_corpus(source: Path, max_doc_bytes: int):
    """Yield (corpus.jsonl:line, document | Rejected). `source` is the dataset folder or the file."""
    path = source / "corpus.jsonl" if source.is_dir() else source
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            origin = f"{path.name}:{lineno}"
            if not raw.strip():
                continue
            try:
                yield origin, parse_beir_line(raw, max_doc_bytes)
            except Rejected as exc:
                yield origin, exc


def parse_beir_line(raw: bytes, max_doc_bytes: int) -> dict:
    if len(raw) > max_doc_bytes:
        raise Rejected(f"over size cap: {len(raw)} bytes > {max_doc_bytes}")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise Rejected(f"invalid UTF-8: byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise Rejected(f"malformed JSON: {exc.msg}") from None
    if not isinstance(obj, dict) or not str(obj.get("_id", "")).strip():
        raise Rejected("missing _id")
    text = str(obj.get("text") or "").strip()
    if not text:
        raise Rejected("empty body")
    # BEIR titles are optional by format (many datasets have none), so no title is allowed here.
    return {"doc_id": str(obj["_id"]), "title": str(obj.get("title") or "").strip(), "body": text, "format": "plain"}
