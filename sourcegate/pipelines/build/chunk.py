"""Chunk: documents.parquet -> chunks (no embeddings yet).

A chunk is article title + section heading + section body, so every chunk carries body
text and the embedding measures what the section says, not just what it is called.
Sections longer than the embedding model's token budget are split into overlapping
windows on word boundaries; a run with no word boundary inside the budget (one huge word
or token) is hard-split, so no chunk exceeds the budget, and a document needing more than
`chunking.max_split_pieces` such pieces is quarantined as degenerate. Chunk ids are stable: a hash of (doc id, section, ordinal, text).

A document's chunks are a pure function of the document, the settings, the tokenizer and
this module's code, so a nightly run re-chunks only what changed: `chunker_key` fingerprints
all but the document, and rows of an unchanged document (same content hash) are reused.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa

from sourcegate.pipelines.batches import iter_batches, write_batches

# CommonMark's ATX heading of levels 2-6 (up to 3 spaces before it; a closing run of '#' only after a space: "C#"
# keeps its '#'), its setext level-2 underline, and a code fence (``` or ~~~), inside which nothing is a heading.
_HEADING = re.compile(r"^ {0,3}#{2,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_SETEXT_2 = re.compile(r"^ {0,3}-+[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_NOT_PARAGRAPH = re.compile(r"^(?: {4}|\t| {0,3}(?:[-*+>]|\d{1,9}[.)])(?:[ \t]|$))")  # code, list item, quote


def slug(text: str) -> str:
    """Section id: NFKC, case-folded, runs of anything but letters and digits (of any script) become '-'.
    An ASCII heading gives what `[^a-z0-9]+` did; "Über uns" keeps its Ü and a heading in Japanese its characters."""
    return re.sub(r"[\W_]+", "-", unicodedata.normalize("NFKC", text).casefold()).strip("-")


def section_ids(headings: Iterable[str]) -> list[str]:
    """One id per section of a document, unique within it: a repeated heading's id takes -2, -3, ... (the next free
    one), and a heading with no letter or digit is `section`, so a label never names two sections or the lead."""
    ids, used = [], set()
    for heading in headings:
        base = slug(heading) or ("section" if heading else "")
        at, n = base, 1
        while at in used:
            n += 1
            at = f"{base}-{n}"
        used.add(at)
        ids.append(at)
    return ids


def headings(lines: list[str]) -> Iterator[tuple[int, int, str]]:
    """(first line, line after it, text) of each section heading: `## Text` or a one-line paragraph underlined with
    `---`, never a line inside a fenced code block (a shell comment `## install` in a snippet is code)."""
    fence = ""
    for i, line in enumerate(lines):
        m = _FENCE.match(line)
        if fence:  # closed by a fence of the same character, at least as long, with nothing after it
            if m and m[1][0] == fence[0] and len(m[1]) >= len(fence) and not line[m.end() :].strip():
                fence = ""
        elif m and not (m[1][0] == "`" and "`" in line[m.end() :]):  # a backtick fence's info string has no backtick
            fence = m[1]
        elif h := _HEADING.match(line):
            yield i, i + 1, h[1].strip()
        elif _SETEXT_2.match(line) and i and lines[i - 1].strip() and (i == 1 or not lines[i - 2].strip()):
            above = lines[i - 1]
            if not (_HEADING.match(above) or _FENCE.match(above) or _NOT_PARAGRAPH.match(above)):
                yield i - 1, i + 1, above.strip()


def split_sections(body: str, fmt: str) -> list[tuple[str, str]]:
    """[(section heading, section body)], the lead paragraph(s) under heading ''."""
    if fmt != "markdown":
        return [("", body.strip())]
    lines = body.split("\n")
    sections, heading, start = [], "", 0
    for first, after, text in headings(lines):
        sections.append((heading, "\n".join(lines[start:first]).strip()))
        heading, start = text, after
    sections.append((heading, "\n".join(lines[start:]).strip()))
    return [(h, b) for h, b in sections if re.search(r"\w", b)]


def chunk_id(doc_id: str, section: str, ordinal: int, text: str) -> str:
    h = hashlib.sha256("\x1f".join([doc_id, section, str(ordinal), text]).encode("utf-8"))
    return h.hexdigest()[:24]


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# Characters a chunk may hold per token of budget. A token standing for more is text the
# model cannot see (a 150 KB word is one [UNK]); the densest 256-token window of SciFact
# holds 6.5 characters a token.
MAX_CHARS_PER_TOKEN = 16
MIN_BODY_TOKENS = 16  # a title and heading must leave at least this much room for body text


class Degenerate(Exception):
    """A document that cannot be chunked within the budget; the message is the quarantine reason."""


def cut(body: str, tok, budget: int, overlap: int, max_chars: int) -> list[tuple[str, bool]]:
    """[(piece, hard-split?)]: overlapping windows on word boundaries; a run of text with no boundary
    within the budget (one over-long word or token) is hard-split, so every piece re-encodes to at
    most `budget` tokens and `max_chars` characters."""
    enc = tok.encode(body, add_special_tokens=False)
    n = len(enc.ids)
    soft: list[tuple[str, bool]] = []
    if n <= budget:
        soft = [(body, False)]
    else:
        words, offsets = enc.word_ids, enc.offsets

        def inside_word(i: int) -> bool:
            return words[i] is not None and words[i] == words[i - 1]

        start = 0
        while True:
            end = min(start + budget, n)
            while start + 1 < end < n and inside_word(end):
                end -= 1  # never cut a word in two ...
            hard = end < n and inside_word(end)
            if hard:
                end = min(start + budget, n)  # ... unless the word alone is longer than the budget
            soft.append((body[offsets[start][0] : offsets[end - 1][1]], hard))
            if end >= n:
                break
            start = max(end - overlap, start + 1)
            while start < end and inside_word(start):
                start += 1
    pieces = []
    for piece, hard in soft:
        # A window cut on word boundaries re-encodes to its in-context count (WordPiece tokenises
        # word by word), so only hard cuts and character-heavy windows are re-encoded.
        parts = fit(piece, tok, budget, max_chars) if hard or len(piece) > max_chars else [piece]
        pieces += [(p, hard or len(parts) > 1) for p in parts]
    return pieces


def fit(text: str, tok, budget: int, max_chars: int) -> list[str]:
    """`text` if it re-encodes within the budget, else its halves (cut at the space nearest the middle,
    or mid-run when the middle half has none), recursively."""
    if len(text) <= max_chars and len(tok.encode(text, add_special_tokens=False).ids) <= budget:
        return [text]
    if len(text) < 2:
        return [text]
    mid = _middle(text)
    return [p for half in (text[:mid], text[mid:]) if half.strip() for p in fit(half.strip(), tok, budget, max_chars)]


def _middle(text: str) -> int:
    mid, reach = len(text) // 2, len(text) // 4
    for d in range(reach + 1):
        for i in (mid - d, mid + d):
            if 0 < i < len(text) and text[i].isspace():
                return i
    return mid


def chunk_document(doc: dict, tok, max_tokens: int, overlap: int, max_split_pieces: int = 32) -> list[dict]:
    """The document's chunk rows; raises Degenerate when it cannot be chunked sanely within the budget."""
    rows, hard_pieces, max_chars = [], 0, max_tokens * MAX_CHARS_PER_TOKEN
    sections, repeats = split_sections(doc["body"], doc["format"]), Counter()
    for (section, body), section_id in zip(sections, section_ids(h for h, _ in sections)):
        repeats[section] += 1  # a repeated heading's chunks hash its count too: two equal sections, two chunk ids
        id_key = section if repeats[section] == 1 else f"{section}\x1f{repeats[section]}"
        header = "\n".join(x for x in (doc["title"], section) if x)
        header_tokens = len(tok.encode(header + "\n", add_special_tokens=False).ids)
        budget = max_tokens - 2 - header_tokens
        if budget < MIN_BODY_TOKENS or len(header) > max_chars // 2:
            raise Degenerate(
                f"degenerate document: title and heading take {header_tokens} tokens and {len(header)} characters"
                f" of the {max_tokens}-token chunk (section {section[:40]!r})"
            )
        for ordinal, (piece, hard) in enumerate(cut(body, tok, budget, overlap, max_chars - len(header) - 1)):
            hard_pieces += hard
            text = f"{header}\n{piece}" if header else piece
            rows.append(
                {
                    "chunk_id": chunk_id(doc["doc_id"], id_key, ordinal, text),
                    "doc_id": doc["doc_id"],
                    "title": doc["title"],
                    "section": section,
                    "section_id": section_id,
                    "body": piece,
                    "text": text,
                    "text_hash": text_hash(text),
                    "ordinal": ordinal,
                }
            )
    if hard_pieces > max_split_pieces:
        raise Degenerate(
            f"degenerate document: over-long token runs need {hard_pieces} hard-split pieces"
            f" (chunking.max_split_pieces is {max_split_pieces})"
        )
    return rows


def chunker_key(tokenizer_file: str | Path, max_tokens: int, overlap: int, max_split_pieces: int = 32) -> str:
    """Everything besides the document that its chunks depend on: the settings, the tokenizer's file and the library
    that runs it, this code, and the Unicode tables its slugs and word splits read (NFKC, `\\w`)."""
    import tokenizers

    h = hashlib.sha256(f"{max_tokens}\x1f{overlap}\x1f{max_split_pieces}\x1f".encode())
    h.update(f"{tokenizers.__version__}\x1f{unicodedata.unidata_version}\x1f".encode())
    h.update(Path(tokenizer_file).read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:24]


CHUNK_TEXT_SCHEMA = pa.schema(
    [
        ("chunk_id", pa.string()),
        ("doc_id", pa.string()),
        ("title", pa.string()),
        ("section", pa.string()),
        ("section_id", pa.string()),
        ("body", pa.string()),
        ("text", pa.string()),
        ("text_hash", pa.string()),
        ("ordinal", pa.int64()),
    ]
)


class PreviousChunks:
    """An earlier run's chunk rows, document by document, read in step with this run's documents.

    Both runs' documents.parquet are sorted by doc id (ingest sorts them) and chunks follow their
    documents, so one forward pass over each file finds every reusable document: memory holds a
    batch, never the earlier run. An unchanged document is one with the same content hash (which
    covers its id); a file out of order only costs reuse, never correctness.
    """

    def __init__(self, documents_parquet: str | Path, chunks_parquet: str | Path, rows: int | None = None):
        self._docs = (
            r for t in iter_batches(documents_parquet, ["doc_id", "content_hash"], rows) for r in t.to_pylist()
        )
        self._chunks = (r for t in iter_batches(chunks_parquet, rows=rows) for r in t.to_pylist())
        self._doc = next(self._docs, None)
        self._chunk = next(self._chunks, None)

    def rows_for(self, doc_id: str, content_hash: str) -> list[dict]:
        """The earlier run's rows of this document if its content is unchanged, else []."""
        while self._doc is not None and self._doc["doc_id"] < doc_id:
            self._skip_rows(self._doc["doc_id"])
            self._doc = next(self._docs, None)
        if self._doc is None or self._doc["doc_id"] != doc_id:
            return []
        rows = self._skip_rows(doc_id)
        same = self._doc["content_hash"] == content_hash
        self._doc = next(self._docs, None)
        return rows if same else []

    def _skip_rows(self, doc_id: str) -> list[dict]:
        """Consume (and return) the chunk rows of `doc_id` and of any document sorting before it."""
        rows = []
        while self._chunk is not None and self._chunk["doc_id"] <= doc_id:
            if self._chunk["doc_id"] == doc_id:
                rows.append(self._chunk)
            self._chunk = next(self._chunks, None)
        return rows


def chunk_batches(
    documents_parquet: str | Path,
    tok,
    *,
    max_tokens: int = 256,
    overlap: int = 32,
    max_split_pieces: int = 32,
    previous: PreviousChunks | None = None,
    rejected: list[dict] | None = None,
    rows: int | None = None,
    rechunked: list[int] | None = None,
) -> Iterator[list[dict]]:
    """Chunk rows of every document, in document order, one list per batch of documents.

    `previous` (an earlier run with the same `chunker_key`) supplies the rows of unchanged
    documents, which are not re-tokenised (the rows are exactly what chunking would give).
    A degenerate document is appended to `rejected` ({source, doc_id, reason}), or raises
    Degenerate when no `rejected` list is given. `rechunked[0]` counts documents chunked afresh.
    """
    for table in iter_batches(documents_parquet, rows=rows):
        out = []
        for doc in table.to_pylist():
            reused = previous.rows_for(doc["doc_id"], doc["content_hash"]) if previous else []
            if reused:
                out += reused
                continue
            if rechunked is not None:
                rechunked[0] += 1
            try:
                out += chunk_document(doc, tok, max_tokens, overlap, max_split_pieces)
            except Degenerate as exc:
                if rejected is None:
                    raise
                rejected.append({"source": doc["source"], "doc_id": doc["doc_id"], "reason": str(exc)})
        yield out


def chunk_documents(documents_parquet: str | Path, tok, **settings) -> list[dict]:
    """Every chunk row in one list (small corpora and tests; the pipeline streams `chunk_batches`)."""
    return [row for batch in chunk_batches(documents_parquet, tok, **settings) for row in batch]


def write_chunks(batches: Iterable[list[dict]], path: str | Path) -> int:
    """chunks.text.parquet from batches of rows, one batch in memory at a time; returns the rows."""
    tables = (pa.Table.from_pylist(b, schema=CHUNK_TEXT_SCHEMA) for b in batches)
    return write_batches(tables, path, CHUNK_TEXT_SCHEMA)
