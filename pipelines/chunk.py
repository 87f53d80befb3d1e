"""Chunk: documents.parquet -> chunks (no embeddings yet).

A chunk is article title + section heading + section body, so every chunk carries body
text and the embedding measures what the section says, not just what it is called.
Sections longer than the embedding model's token budget are split into overlapping
windows on word boundaries. Chunk ids are stable: a hash of (doc id, section, ordinal, text).

A document's chunks are a pure function of the document, the settings, the tokenizer and
this module's code, so a nightly run re-chunks only what changed: `chunker_key` fingerprints
all but the document, and rows of an unchanged document (same content hash) are reused.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pyarrow.parquet as pq

_HEADING = re.compile(r"(?m)^(#{2,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")


def slug(text: str) -> str:
    """Section id: lowercase, runs of anything but a-z0-9 become '-'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def split_sections(body: str, fmt: str) -> list[tuple[str, str]]:
    """[(section heading, section body)], the lead paragraph(s) under heading ''."""
    if fmt != "markdown":
        return [("", body.strip())]
    sections, heading, start = [], "", 0
    for m in _HEADING.finditer(body):
        sections.append((heading, body[start : m.start()].strip()))
        heading, start = m.group(2).strip(), m.end()
    sections.append((heading, body[start:].strip()))
    return [(h, b) for h, b in sections if re.search(r"\w", b)]


def chunk_id(doc_id: str, section: str, ordinal: int, text: str) -> str:
    h = hashlib.sha256("\x1f".join([doc_id, section, str(ordinal), text]).encode("utf-8"))
    return h.hexdigest()[:24]


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def windows(body: str, tok, budget: int, overlap: int) -> list[str]:
    """Split `body` into pieces of at most `budget` tokens, `overlap` tokens shared, on word boundaries."""
    enc = tok.encode(body, add_special_tokens=False)
    n = len(enc.ids)
    if n <= budget:
        return [body]
    words, offsets = enc.word_ids, enc.offsets

    def inside_word(i: int) -> bool:
        return words[i] is not None and words[i] == words[i - 1]

    pieces, start = [], 0
    while True:
        end = min(start + budget, n)
        while start + 1 < end < n and inside_word(end):
            end -= 1  # never cut a word in two
        pieces.append(body[offsets[start][0] : offsets[end - 1][1]])
        if end >= n:
            return pieces
        start = max(end - overlap, start + 1)
        while start < end and inside_word(start):
            start += 1


def chunk_document(doc: dict, tok, max_tokens: int, overlap: int) -> list[dict]:
    rows = []
    for section, body in split_sections(doc["body"], doc["format"]):
        header = "\n".join(x for x in (doc["title"], section) if x)
        budget = max_tokens - 2 - len(tok.encode(header + "\n", add_special_tokens=False).ids)
        for ordinal, piece in enumerate(windows(body, tok, max(budget, 16), overlap)):
            text = f"{header}\n{piece}" if header else piece
            rows.append(
                {
                    "chunk_id": chunk_id(doc["doc_id"], section, ordinal, text),
                    "doc_id": doc["doc_id"],
                    "title": doc["title"],
                    "section": section,
                    "section_id": slug(section),
                    "body": piece,
                    "text": text,
                    "text_hash": text_hash(text),
                    "ordinal": ordinal,
                }
            )
    return rows


def chunker_key(tokenizer_file: str | Path, max_tokens: int, overlap: int) -> str:
    """Everything besides the document that its chunks depend on."""
    h = hashlib.sha256(f"{max_tokens}\x1f{overlap}\x1f".encode())
    h.update(Path(tokenizer_file).read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:24]


def chunk_documents(
    documents_parquet: str | Path,
    tok,
    *,
    max_tokens: int = 256,
    overlap: int = 32,
    reuse: dict[str, list[dict]] | None = None,
) -> list[dict]:
    """Chunk rows of every document, in document order.

    `reuse` maps a content hash to that document's rows from a run with the same `chunker_key`;
    those documents are not re-tokenised (the rows are exactly what chunking would give).
    """
    docs = pq.read_table(documents_parquet).to_pylist()
    reuse = reuse or {}
    return [
        row for doc in docs for row in (reuse.get(doc["content_hash"]) or chunk_document(doc, tok, max_tokens, overlap))
    ]


def rows_by_document(documents_parquet: str | Path, chunks_parquet: str | Path) -> dict[str, list[dict]]:
    """{content hash: its chunk rows} of an earlier run, for `chunk_documents(reuse=...)`."""
    docs = pq.read_table(documents_parquet, columns=["doc_id", "content_hash"])
    by_doc: dict[str, list[dict]] = {}
    for row in pq.read_table(chunks_parquet).to_pylist():
        by_doc.setdefault(row["doc_id"], []).append(row)
    return {h: by_doc[d] for d, h in zip(docs["doc_id"].to_pylist(), docs["content_hash"].to_pylist()) if d in by_doc}
