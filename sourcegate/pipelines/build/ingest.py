"""Ingest: a corpus source -> documents.parquet, quarantine.jsonl and manifest.parquet.

Two sources: a folder of Markdown (optional YAML front matter) and HTML articles, and a BEIR
corpus.jsonl. Bad input never crashes the run and is never dropped silently: each bad
document goes to the quarantine file with a reason, and the counts land in run.json.
How ids and titles are made, and which formats are read: docs/ingest.md.
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
import pyarrow.parquet as pq
import yaml

from sourcegate.artifact_io import run_folder as rf
from sourcegate.artifact_io import write_jsonl
from sourcegate.pipelines.batches import batch_rows, write_batches
from sourcegate.pipelines.build import quarantine as quarantine_file
from sourcegate.pipelines.build.doc_ids import ID_PUNCTUATION, MAX_ID_CHARS, HostileName, id_from_beir, id_from_path
from sourcegate.pipelines.build.html import HTML_SUFFIXES, NoText, decode_html, parse_html

DOCUMENT_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("title", pa.string()),
        ("title_source", pa.string()),  # front_matter | heading | html_title | file_name | beir | none
        # Markdown without front matter and title line (an HTML page's text with '##' headings), or plain text
        ("body", pa.string()),
        ("format", pa.string()),  # markdown | plain: how the body is read (the chunker cuts markdown at headings)
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


class EmptyCorpus(ValueError):
    """A corpus that gave no document: an empty or unmounted folder is never indexed (exit 2, with its counts)."""


def empty_corpus(source: str | Path, counts: dict, quarantine: Path, fmt: str = "markdown") -> EmptyCorpus:
    """The error for a corpus that gave no document, with what its files became instead (and, for a BEIR dataset
    read as a folder of articles, the format that reads it)."""
    became = [f"{counts['quarantined']} file(s) quarantined, see {quarantine}"] if counts["quarantined"] else []
    became += [f"{counts['skipped']} skipped"] if counts["skipped"] else []
    beir = fmt == "markdown" and (Path(source) / "corpus.jsonl").is_file()
    hint = " It holds corpus.jsonl: a BEIR dataset is read with corpus.format: beir (--format beir)." if beir else ""
    return EmptyCorpus(
        f"{source}: no document read: {', '.join(became) or 'no article file in it'}. An empty or unmounted "
        f"corpus folder is never indexed.{hint}"
    )


@dataclass(frozen=True)
class Skipped:
    """Corpus entries the walker does not read, by design rather than fault (docs/ingest.md "What is read"):
    listed in skipped.jsonl with the reason and how many files they hold, and counted in run.json."""

    reason: str
    files: int = 1


SKIPPED_FILE = rf.SKIPPED
HIDDEN_FOLDER = "hidden folder: not walked (a tool's files, such as .git, not articles)"
HIDDEN_FILE = "hidden file without an article suffix: not read (a tool's file, such as .DS_Store or .gitignore)"


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
    if fmt == "markdown" and not source.is_dir():
        raise NotADirectoryError(f"corpus source {source} is a file: a corpus is a folder of Markdown or HTML articles")
    if fmt == "markdown" and out_dir.resolve().is_relative_to(source.resolve()):
        raise ValueError(
            f"{out_dir} is inside the corpus folder {source}: the next night would read its own files (config, eval "
            "sets, reports) as articles; keep the artifacts folder (and init's --out) outside the corpus"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    reader = read_corpus_folder if fmt == "markdown" else read_beir_corpus
    rejected: list[dict] = []
    skipped: list[dict] = []
    staging = out_dir / ".documents.staging.tmp"
    spill = out_dir / ".duckdb.tmp"

    def staged():
        batch = []
        for seq, (origin, parsed) in enumerate(reader(source, max_doc_bytes)):
            if isinstance(parsed, Rejected):
                rejected.append({"seq": seq, "source": origin, "reason": str(parsed)})
                continue
            if isinstance(parsed, Skipped):
                skipped.append({"source": origin, "reason": parsed.reason, "files": parsed.files})
                continue
            batch.append({**parsed, "source": origin, "content_hash": content_hash(parsed), "seq": seq})
            if len(batch) >= batch_rows(rows):
                yield pa.Table.from_pylist(batch, schema=STAGING_SCHEMA)
                batch = []
        yield pa.Table.from_pylist(batch, schema=STAGING_SCHEMA)

    try:
        write_batches(staged(), staging, STAGING_SCHEMA)
        with _duckdb(spill) as con:
            con.execute(f"CREATE VIEW staged AS {CLAIMANTS.format(staged=_literal(staging))}")
            rejected += duplicate_ids(con, keep_first=fmt != "markdown")
            kept = "nth = 1" if fmt != "markdown" else "claimants = 1"
            fields = ", ".join(DOCUMENT_SCHEMA.names)
            docs = con.sql(f"SELECT {fields} FROM staged WHERE {kept} ORDER BY doc_id").to_arrow_reader(
                batch_rows(rows)
            )
            count = write_batches((pa.Table.from_batches([b]) for b in docs), out_dir / rf.DOCUMENTS, DOCUMENT_SCHEMA)
            manifest_rows = diff_manifest(con, out_dir / rf.DOCUMENTS, previous_documents, rows)
            write_batches(manifest_rows, out_dir / rf.INGEST_MANIFEST, MANIFEST_SCHEMA)
            statuses = dict(
                con.execute(
                    "SELECT status, count(*) FROM read_parquet(?) GROUP BY status", [str(out_dir / rf.INGEST_MANIFEST)]
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
    counts.update(write_skipped(out_dir, skipped))
    return IngestResult(out_dir / rf.DOCUMENTS, quarantine, out_dir / rf.INGEST_MANIFEST, counts)


def write_skipped(out_dir: Path, skipped: list[dict]) -> dict:
    """skipped.jsonl (one line per skipped file or folder, in walking order) and its counts for run.json:
    files skipped in all, and by reason."""
    write_jsonl(skipped, out_dir / SKIPPED_FILE)
    reasons: dict[str, int] = {}
    for entry in skipped:
        reasons[entry["reason"]] = reasons.get(entry["reason"], 0) + entry["files"]
    return {"skipped": sum(reasons.values()), "skipped_reasons": reasons}


STAGING_SCHEMA = DOCUMENT_SCHEMA.append(pa.field("seq", pa.int64()))
# Each staged document with its place among the documents claiming its id (in reading order) and their number.
CLAIMANTS = """SELECT *, row_number() OVER (PARTITION BY doc_id ORDER BY seq) AS nth,
       count(*) OVER (PARTITION BY doc_id) AS claimants FROM read_parquet({staged})"""
# Ids claimed more than once, each with its claimants' sources in reading order.
DUPLICATES = """SELECT doc_id, list(seq ORDER BY seq), list(source ORDER BY seq) FROM staged
WHERE claimants > 1 GROUP BY doc_id ORDER BY min(seq)"""


def duplicate_ids(con, keep_first: bool) -> list[dict]:
    """Quarantine rows for the documents sharing an id.

    A BEIR corpus keeps the first line of an id (a dataset's repeated line). In a folder, two files of one
    id are two different articles and neither is the right one: every file of that id is quarantined,
    naming the others, so the night never serves whichever happens to sort first.
    """
    rows = []
    for doc_id, seqs, sources in con.execute(DUPLICATES).fetchall():
        for i, (seq, origin) in enumerate(zip(seqs, sources)):
            if keep_first and i == 0:
                continue
            others = ", ".join(repr(o) for o in sources if o != origin)
            reason = (
                f"duplicate id: {doc_id!r} (first occurrence kept)"
                if keep_first
                else f"duplicate id: {doc_id!r} (also the id of {others}; none of them kept)"
            )
            rows.append({"seq": seq, "source": origin, "doc_id": doc_id, "reason": reason})
    return rows


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
    """What the document says (its title_source is not part of it: a title is the same text wherever it came from)."""
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


def removed_documents(night: rf.RunFolder) -> dict[str, str]:
    """{doc id: the run whose ingest found it deleted} for every document a run of this artifacts folder up to
    `night` found deleted, newest first (a document removed three nights ago is still removed tonight, though the
    nights between diffed against a corpus without it). The caller asks only of documents absent tonight."""
    runs = sorted((p.parent.name for p in (night.root / rf.RUNS).glob(f"*/{rf.INGEST_MANIFEST}")), reverse=True)
    removed: dict[str, str] = {}
    for run_id in (r for r in runs if rf.RUN_ID.match(r) and r <= night.run_id):
        path = night.sibling(run_id) / rf.INGEST_MANIFEST
        for doc_id in (
            pq.read_table(path, columns=["doc_id"], filters=[("status", "=", "deleted")]).column(0).to_pylist()
        ):
            removed.setdefault(doc_id, run_id)
    return removed


# --- a corpus folder: Markdown and HTML articles ------------------------------------

_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.S)
_TITLE_LINE = re.compile(r"\A\s*#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*(?:\r?\n|\Z)")  # "# C#" keeps its "#"
_SETEXT_TITLE = re.compile(r"\A\s*([^#\s][^\n]*?)[ \t]*\n {0,3}=+[ \t]*(?:\n|\Z)")  # "Title" over a line of "="


def read_corpus_folder(root: Path, max_doc_bytes: int):
    """Yield (relative path, document dict | Rejected | Skipped) for every entry under root, sorted.

    Symlinks are never followed, so nothing outside the root is ever opened: one that
    resolves outside the root is quarantined as such; one inside it is quarantined too,
    its target being ingested once, under its own path. Hidden folders and hidden files
    without an article suffix are skipped, named and counted (`corpus_entries`).
    """
    root = root.resolve()  # a corpus root given as a link means its target
    for path, skipped in corpus_entries(root):
        relative = path.relative_to(root)
        rel = relative.as_posix()
        if skipped:
            yield (rel + "/" if skipped.reason == HIDDEN_FOLDER else rel), skipped
            continue
        try:
            yield rel, parse_article(read_regular_file(path, root, max_doc_bytes), relative)
        except Rejected as exc:
            yield rel, exc


def is_article_name(name: str) -> bool:
    """A file name with a suffix the corpus reader reads (`..md` and `.faq.md` too: the suffix says article)."""
    return Path(name).suffix.lower() in MARKDOWN_SUFFIXES | HTML_SUFFIXES


def corpus_entries(root: Path) -> list[tuple[Path, Skipped | None]]:
    """Every file, symlink and special file under root, without descending into linked or hidden folders; each
    with None (to be read) or why it is skipped. A hidden folder (.git, .obsidian) is one entry, skipped with the
    number of entries under it; a hidden file is read when its suffix is an article's (a page named `..md` is
    a page) and skipped otherwise."""
    found: list[tuple[Path, Skipped | None]] = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        here = Path(folder)
        hidden = [d for d in dirs if d.startswith(".")]
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [(here / d, Skipped(HIDDEN_FOLDER, entries_under(here / d))) for d in hidden]
        found += [(here / d, None) for d in dirs if (here / d).is_symlink()]  # judged, never walked
        for name in files:
            hidden_file = name.startswith(".") and not is_article_name(name)
            found.append((here / name, Skipped(HIDDEN_FILE) if hidden_file else None))
    return sorted(found, key=lambda entry: entry[0])


def entries_under(folder: Path) -> int:
    """How many entries the walker would have judged under `folder` (a link counts once, as itself)."""
    if folder.is_symlink():
        return 1
    count = 0
    for here, dirs, files in os.walk(folder, followlinks=False):
        count += len(files) + sum(1 for d in dirs if (Path(here) / d).is_symlink())
    return count


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


def parse_article(data: bytes, relative: Path) -> dict:
    """The document in a corpus file's bytes, read by its suffix; `relative` is its path under the root."""
    if b"\x00" in data:
        raise Rejected("binary file: contains NUL bytes")
    suffix = relative.suffix.lower()
    if suffix not in MARKDOWN_SUFFIXES | HTML_SUFFIXES:
        raise Rejected(f"not a Markdown or HTML file: suffix {relative.suffix or '(none)'!r}")
    try:
        file_id = id_from_path(relative.as_posix())
    except HostileName as exc:
        raise Rejected(f"unsafe file name: {exc}") from None
    read = parse_markdown if suffix in MARKDOWN_SUFFIXES else parse_html_page
    doc_id, title, title_source, body = read(data)
    if not title:
        title, title_source = title_from_file_name(relative.name), "file_name"
    if not re.search(r"\w", re.sub(r"(?m)^#+.*$", "", body)):
        raise Rejected("empty body")
    return document(doc_id or file_id, title, body, "markdown", title_source)


def parse_markdown(data: bytes) -> tuple[str, str, str, str]:
    """(front-matter id or '', title or '', its source, body) of a Markdown file."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Rejected(f"invalid UTF-8: byte {exc.start}") from None
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")  # a Windows or old Mac file reads as any
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
    source = "front_matter" if title else ""
    m = _TITLE_LINE.match(text) or _SETEXT_TITLE.match(text)
    if m:
        title, source = (title, source) if title else (m.group(1).strip(), "heading")
        text = text[m.end() :]
    return _front_matter_string(meta, "id"), title, source, text.strip()


def parse_html_page(data: bytes) -> tuple[str, str, str, str]:
    """('', title or '', its source, body with Markdown headings) of an HTML file."""
    try:
        text = decode_html(data)
    except UnicodeDecodeError as exc:
        raise Rejected(f"invalid UTF-8: byte {exc.start} (and no other charset declared)") from None
    except (LookupError, UnicodeError) as exc:
        raise Rejected(f"undecodable HTML: {exc}") from None
    try:
        title, source, body = parse_html(text)
    except NoText as exc:
        raise Rejected(str(exc)) from None
    return "", title, source, body


def title_from_file_name(name: str) -> str:
    """A readable title from a file name: no suffix, '_' as spaces, a slug's '-' too, first letter upper-cased.

    'weird name ü.md' -> 'Weird name ü'; 'lost-and-found.html' -> 'Lost and found'; 'iPhone_setup.md' -> 'iPhone setup'.
    """
    stem = Path(name).stem if Path(name).suffix else name
    words = stem.replace("_", " ")
    if " " not in stem.replace("_", " ").strip():  # a slug: its hyphens separate words
        words = words.replace("-", " ")
    words = " ".join(unicodedata.normalize("NFC", words).split())
    if words and not any(ch.isupper() for ch in words):
        words = words[0].upper() + words[1:]
    return words or stem


def _front_matter_string(meta: dict, key: str) -> str:
    value = meta.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):  # a list or mapping must not become "['a', 'b']"
        raise Rejected(f"{key} is not a string: YAML {type(value).__name__} {_short(value)} (quote it)")
    return value.strip()


# --- what every document must be, whatever its source ---------------------------------

# Lone surrogates (json.loads lets "\ud800" through), noncharacters and NUL are not text.
_NOT_TEXT = re.compile(
    "[\x00\ud800-\udfff\ufdd0-\ufdef" + "".join(chr(p << 16 | 0xFFFE) + chr(p << 16 | 0xFFFF) for p in range(17)) + "]"
)


def document(doc_id: str, title: str, body: str, fmt: str, title_source: str) -> dict:
    """A checked document: valid Unicode, NFC-normalised (before any hash), a safe id."""
    fields = {"id": doc_id, "title": title, "body": body}
    for name, value in fields.items():
        m = _NOT_TEXT.search(value)
        if m:
            kind = "lone surrogate" if "\ud800" <= m.group() <= "\udfff" else "noncharacter"
            kind = "NUL" if m.group() == "\x00" else kind
            raise Rejected(f"invalid Unicode: {kind} U+{ord(m.group()):04X} in {name} at character {m.start()}")
    doc_id, title, body = (unicodedata.normalize("NFC", v) for v in fields.values())
    return {"doc_id": safe_id(doc_id), "title": title, "title_source": title_source, "body": body, "format": fmt}


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

BOM = "\ufeff".encode()


def read_beir_corpus(source: Path, max_doc_bytes: int):
    """Yield (corpus.jsonl:line, document | Rejected). `source` is the dataset folder or the file."""
    path = source / "corpus.jsonl" if source.is_dir() else source
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            origin = f"{path.name}:{lineno}"
            if lineno == 1:
                raw = raw.removeprefix(BOM)  # a file saved by a Windows tool: its first document is no less a document
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
    text, title = ((obj.get(key) or "").strip() for key in ("text", "title"))
    if not text and title:  # BEIR reads a document as title + text: a title alone is a document
        text, title = title, ""
    if not text:
        raise Rejected("empty body")
    # BEIR titles are optional by format (many datasets have none), so no title is allowed here.
    try:
        mapped = id_from_beir(str(doc_id))  # a URI or a page title as an id is read, not quarantined
    except HostileName as exc:
        raise Rejected(f"unsafe id: {exc}") from None
    return document(mapped, title, text, "plain", "beir" if title else "none")
