"""Ingest: a corpus source -> documents.parquet, quarantine.jsonl and manifest.parquet.

Two sources: a folder of Markdown articles (optional YAML front matter) and a BEIR
corpus.jsonl. Bad input never crashes the run and is never dropped silently: each bad
document goes to the quarantine file with a reason, and the counts land in run.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import unicodedata
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import yaml

from pipelines.batches import batch_rows, write_batches
from pipelines.build import quarantine as quarantine_file

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
    rows: int | None = None,
) -> IngestResult:
    """Read `source`, write documents/quarantine/manifest into `out_dir`.

    Streams: parsed documents are staged to Parquet a batch at a time (`rows`); duckdb then keeps the
    first occurrence of each id, sorts by id and diffs against the previous run out of core, so
    memory holds a batch and the rejected inputs, never the corpus.
    """
    source, out_dir = Path(source), Path(out_dir)
    if not source.exists():
        raise FileNotFoundError(f"corpus source not found: {source}")
    out_dir.mkdir(parents=True, exist_ok=True)
    reader = read_markdown_folder if fmt == "markdown" else read_beir_corpus
    rejected: list[dict] = []
    staging = out_dir / ".documents.staging.tmp"
    spill = out_dir / ".duckdb.tmp"

    def staged():
        batch = []
        for seq, (origin, parsed) in enumerate(reader(source, max_doc_bytes)):
            if isinstance(parsed, Rejected):
                rejected.append({"seq": seq, "source": origin, "reason": str(parsed)})
                continue
            batch.append({**parsed, "source": origin, "content_hash": content_hash(parsed), "seq": seq})
            if len(batch) >= batch_rows(rows):
                yield pa.Table.from_pylist(batch, schema=STAGING_SCHEMA)
                batch = []
        yield pa.Table.from_pylist(batch, schema=STAGING_SCHEMA)

    try:
        write_batches(staged(), staging, STAGING_SCHEMA)
        with _duckdb(spill) as con:
            con.execute(f"CREATE VIEW staged AS {FIRST_OCCURRENCE.format(staged=_literal(staging))}")
            for seq, origin, doc_id in con.execute("SELECT seq, source, doc_id FROM staged WHERE nth > 1").fetchall():
                reason = f"duplicate id: {doc_id!r} (first occurrence kept)"
                rejected.append({"seq": seq, "source": origin, "doc_id": doc_id, "reason": reason})
            fields = ", ".join(DOCUMENT_SCHEMA.names)
            docs = con.sql(f"SELECT {fields} FROM staged WHERE nth = 1 ORDER BY doc_id").to_arrow_reader(
                batch_rows(rows)
            )
            count = write_batches(
                (pa.Table.from_batches([b]) for b in docs), out_dir / "documents.parquet", DOCUMENT_SCHEMA
            )
            manifest_rows = diff_manifest(con, out_dir / "documents.parquet", previous_documents, rows)
            write_batches(manifest_rows, out_dir / "manifest.parquet", MANIFEST_SCHEMA)
            statuses = dict(
                con.execute(
                    "SELECT status, count(*) FROM read_parquet(?) GROUP BY status", [str(out_dir / "manifest.parquet")]
                ).fetchall()
            )
    finally:
        staging.unlink(missing_ok=True)
        shutil.rmtree(spill, ignore_errors=True)
    rejected = [{k: v for k, v in r.items() if k != "seq"} for r in sorted(rejected, key=lambda r: r["seq"])]
    quarantine = quarantine_file.write_stage(out_dir, "ingest", rejected)
    counts = {s: statuses.get(s, 0) for s in ("added", "changed", "deleted", "unchanged")}
    counts.update(
        documents=count, quarantined=len(rejected), quarantine_reasons=quarantine_file.reason_counts(rejected)
    )
    return IngestResult(out_dir / "documents.parquet", quarantine, out_dir / "manifest.parquet", counts)


STAGING_SCHEMA = DOCUMENT_SCHEMA.append(pa.field("seq", pa.int64()))
# The first occurrence of each id (in reading order) is the document; later ones are duplicates.
FIRST_OCCURRENCE = "SELECT *, row_number() OVER (PARTITION BY doc_id ORDER BY seq) AS nth FROM read_parquet({staged})"


def _literal(path: Path) -> str:
    """A path as a SQL string literal (for statements duckdb cannot prepare)."""
    return "'" + str(path).replace("'", "''") + "'"


@contextmanager
def _duckdb(spill: Path):
    """An in-process duckdb that sorts and joins out of core: bounded memory, spilling to `spill`."""
    import duckdb

    con = duckdb.connect()
    try:
        con.execute("SET memory_limit = '1GB'")
        con.execute("SET threads = 2")
        con.execute(f"SET temp_directory = {_literal(spill)}")
        con.execute("SET preserve_insertion_order = true")
        yield con
    finally:
        con.close()


def content_hash(doc: dict) -> str:
    h = hashlib.sha256()
    for field in ("doc_id", "title", "body", "format"):
        h.update(doc[field].encode("utf-8") + b"\x00")
    return h.hexdigest()


# Every document of this run in id order, then every document only the previous run had (in id
# order): added / changed / unchanged / deleted. duckdb sorts strings by their UTF-8 bytes, which
# is code point order, as Python's sort.
DIFF = """
SELECT coalesce(n.doc_id, p.doc_id) AS doc_id, coalesce(n.content_hash, p.content_hash) AS content_hash,
       CASE WHEN p.doc_id IS NULL THEN 'added' WHEN n.doc_id IS NULL THEN 'deleted'
            WHEN n.content_hash = p.content_hash THEN 'unchanged' ELSE 'changed' END AS status
FROM (SELECT doc_id, content_hash FROM read_parquet(?)) n
FULL OUTER JOIN ({previous}) p ON n.doc_id = p.doc_id
ORDER BY n.doc_id IS NULL, coalesce(n.doc_id, p.doc_id)
"""


def diff_manifest(con, documents: Path, previous_documents: str | Path | None, rows: int | None = None):
    """What this run saw against the previous run, as tables of manifest rows."""
    params = [str(documents)]
    if previous_documents and Path(previous_documents).exists():
        previous = "SELECT doc_id, content_hash FROM read_parquet(?)"
        params.append(str(previous_documents))
    else:
        previous = "SELECT NULL::VARCHAR AS doc_id, NULL::VARCHAR AS content_hash WHERE false"
    reader = con.sql(DIFF.format(previous=previous), params=params).to_arrow_reader(batch_rows(rows))
    return (pa.Table.from_batches([b]) for b in reader)


# --- Markdown folder -------------------------------------------------------------

_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.S)
_TITLE_LINE = re.compile(r"\A\s*#[ \t]+(.+?)[ \t]*#*[ \t]*(?:\r?\n|\Z)")


def read_markdown_folder(root: Path, max_doc_bytes: int):
    """Yield (relative path, document dict | Rejected) for every entry under root, sorted.

    Symlinks are never followed, so nothing outside the root is ever opened: one that
    resolves outside the root is quarantined as such; one inside it is quarantined too,
    its target being ingested once, under its own path.
    """
    root = root.resolve()  # a corpus root given as a link means its target
    for path in corpus_entries(root):
        rel = path.relative_to(root).as_posix()
        try:
            yield rel, parse_markdown(read_regular_file(path, root, max_doc_bytes), path, root)
        except Rejected as exc:
            yield rel, exc


def corpus_entries(root: Path) -> list[Path]:
    """Every non-hidden file, symlink and special file under root, without descending into linked folders."""
    found = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        here = Path(folder)
        found += [here / d for d in dirs if (here / d).is_symlink()]  # judged, never walked
        found += [here / f for f in files if not f.startswith(".")]
    return sorted(found)


def read_regular_file(path: Path, root: Path, max_doc_bytes: int) -> bytes:
    """The file's bytes; a symlink or special file is rejected before anything is opened."""
    if path.is_symlink():
        target = os.path.realpath(path)
        if not Path(target).is_relative_to(root):
            raise Rejected(f"symlink outside the corpus root: not read (points to {target!r})")
        raise Rejected(
            f"symlink inside the corpus root: not followed (its target {Path(target).relative_to(root).as_posix()!r}"
            " is ingested once, under its own path)"
        )
    if not stat.S_ISREG(path.lstat().st_mode):
        raise Rejected("not a regular file: a fifo, socket or device")
    # O_NOFOLLOW: a file swapped for a link after the check above is still never followed.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_doc_bytes:
            raise Rejected(f"over size cap: {size} bytes > {max_doc_bytes}")
        return fh.read(max_doc_bytes + 1)


def parse_markdown(data: bytes, path: Path, root: Path) -> dict:
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
    title = _front_matter_string(meta, "title")
    m = _TITLE_LINE.match(text)
    if m:
        title = title or m.group(1).strip()
        text = text[m.end() :]
    if not title:
        raise Rejected("missing title: no front-matter title and no '# ' heading")
    body = text.strip()
    if not re.search(r"\w", re.sub(r"(?m)^#+.*$", "", body)):
        raise Rejected("empty body")
    # Folders become ':' in a file-derived id: '/' is not in the id alphabet.
    doc_id = _front_matter_string(meta, "id") or ":".join(path.relative_to(root).with_suffix("").parts)
    return document(doc_id, title, body, "markdown")


def _front_matter_string(meta: dict, key: str) -> str:
    value = meta.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):  # a list or mapping must not become "['a', 'b']"
        raise Rejected(f"{key} is not a string: YAML {type(value).__name__} {_short(value)} (quote it)")
    return value.strip()


# --- what every document must be, whatever its source ---------------------------------

ID_PUNCTUATION = "_-.:+@(),'"
MAX_ID_CHARS = 200
# Lone surrogates (json.loads lets "\ud800" through), noncharacters and NUL are not text.
_NOT_TEXT = re.compile(
    "[\x00\ud800-\udfff\ufdd0-\ufdef" + "".join(chr(p << 16 | 0xFFFE) + chr(p << 16 | 0xFFFF) for p in range(17)) + "]"
)


def document(doc_id: str, title: str, body: str, fmt: str) -> dict:
    """A checked document: valid Unicode, NFC-normalised (before any hash), a safe id."""
    fields = {"id": doc_id, "title": title, "body": body}
    for name, value in fields.items():
        m = _NOT_TEXT.search(value)
        if m:
            kind = "lone surrogate" if "\ud800" <= m.group() <= "\udfff" else "noncharacter"
            kind = "NUL" if m.group() == "\x00" else kind
            raise Rejected(f"invalid Unicode: {kind} U+{ord(m.group()):04X} in {name} at character {m.start()}")
    doc_id, title, body = (unicodedata.normalize("NFC", v) for v in fields.values())
    return {"doc_id": safe_id(doc_id), "title": title, "body": body, "format": fmt}


def safe_id(doc_id: str) -> str:
    """`doc_id` if it is 1-200 letters, marks, digits and ID_PUNCTUATION, starting with a letter, digit or '_'.

    No '#' (it separates a section in `doc#section` labels), no path separators, no spaces or
    control characters, no leading '.' or '-'.
    """
    if len(doc_id) > MAX_ID_CHARS:
        raise Rejected(f"unsafe id: {_short(doc_id)} is longer than {MAX_ID_CHARS} characters ({len(doc_id)})")
    for i, ch in enumerate(doc_id):
        cat = unicodedata.category(ch)[0]
        if not (cat in "LN" or (i and (cat == "M" or ch in ID_PUNCTUATION)) or ch == "_"):
            raise Rejected(f"unsafe id: {_short(doc_id)}: character {ch!r} at {i} is not allowed")
    if not doc_id:
        raise Rejected("unsafe id: '' is empty")
    return doc_id


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    doc_id = obj["_id"]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        raise Rejected(f"_id is not a string: JSON {type(doc_id).__name__} {_short(doc_id)}")
    for key in ("title", "text"):
        if obj.get(key) is not None and not isinstance(obj[key], str):
            raise Rejected(f"{key} is not a string: JSON {type(obj[key]).__name__} {_short(obj[key])}")
    text = (obj.get("text") or "").strip()
    if not text:
        raise Rejected("empty body")
    # BEIR titles are optional by format (many datasets have none), so no title is allowed here.
    return document(str(doc_id), (obj.get("title") or "").strip(), text, "plain")
