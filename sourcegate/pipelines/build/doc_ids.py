"""Document ids from corpus file paths: a deterministic, readable mapping into the id alphabet.

The id alphabet (`ingest.safe_id`): letters, marks, digits and ID_PUNCTUATION, starting with a letter,
digit or '_'; at most MAX_ID_CHARS. Chunk labels are "<doc_id>#<section>" and eval sets name ids, so
an id never holds '#', '/' or a control character, and a name already in the alphabet keeps its id
exactly (the demo corpus's ids, and every eval set written against them, do not move).

The mapping, for a path relative to the corpus root (docs/ingest.md says the same for users):
  1. the suffix of the file is dropped and every part is NFC-normalised (a folder copied from macOS,
     which stores names decomposed, gets the ids it had on Linux);
  2. a name holding a character of Unicode category C (control such as a tab or newline, format such as
     a bidi override or a zero-width space, an undecodable byte, private use, unassigned, which includes
     the noncharacters) is hostile:
     `HostileName`, the file is quarantined;
  3. each whitespace character becomes '_';
  4. letters, marks, digits and ID_PUNCTUATION are kept; every other character becomes '+' and the
     two upper-case hex digits of each of its UTF-8 bytes ('[' -> '+5B', '#' -> '+23');
  5. a part that does not start with a letter, digit or '_' gets a leading '_';
  6. the parts are joined with ':' (folders);
  7. an id longer than MAX_ID_CHARS keeps its first characters and ends in '-' + 16 hex digits of the
     SHA-256 of the whole mapped id.
Steps 3, 5 and 7, and a name that literally holds '+' and two hex digits, can map two paths to one id;
ingest then quarantines every file of that id, each naming the others.
"""

from __future__ import annotations

import hashlib
import unicodedata
from pathlib import PurePosixPath

ID_PUNCTUATION = "_-.:+@(),'"
MAX_ID_CHARS = 200
_HASH_CHARS = 16


class HostileName(ValueError):
    """A file name that is no ordinary name (control or invisible characters, bytes that are not UTF-8)."""


def id_from_path(relative: str | PurePosixPath) -> str:
    """The document id of the corpus file at `relative` (a POSIX path under the corpus root)."""
    parts = PurePosixPath(relative).with_suffix("").parts
    return _bounded(":".join(_id_part(unicodedata.normalize("NFC", part)) for part in parts))


def id_from_beir(raw: str) -> str:
    """The document id of a BEIR line's `_id`: itself when it is already in the alphabet (every id of SciFact and
    NFCorpus), else mapped as one part of a path is (steps 1-5 and 7, no suffix dropped), so a collection whose ids
    are URIs or page titles is read, not quarantined: '<dbpedia:Paris>' -> '_+3Cdbpedia:Paris+3E'. The qrels' corpus
    ids are mapped by this same function (`beir_queries.document_id`), so judgements still name their documents."""
    return _bounded(_id_part(unicodedata.normalize("NFC", raw), "_id"))


def _bounded(doc_id: str) -> str:
    if len(doc_id) > MAX_ID_CHARS:
        digest = hashlib.sha256(doc_id.encode("utf-8")).hexdigest()[:_HASH_CHARS]
        doc_id = f"{doc_id[: MAX_ID_CHARS - _HASH_CHARS - 1]}-{digest}"
    return doc_id


def _id_part(name: str, what: str = "file name") -> str:
    if not name:
        raise HostileName(f"{what} is empty")
    _refuse_hostile(name, what)
    mapped = "".join(_id_chars(ch) for ch in name)
    return mapped if unicodedata.category(mapped[0])[0] in "LN" or mapped[0] == "_" else "_" + mapped


def _id_chars(ch: str) -> str:
    if ch.isspace():
        return "_"
    if unicodedata.category(ch)[0] in "LMN" or ch in ID_PUNCTUATION:
        return ch
    return "".join(f"+{byte:02X}" for byte in ch.encode("utf-8"))


def _refuse_hostile(name: str, what: str = "file name") -> None:
    for i, ch in enumerate(name):
        category = unicodedata.category(ch)
        if "\udc80" <= ch <= "\udcff":  # os.fsdecode's surrogateescape: a byte that is not UTF-8
            raise HostileName(f"{what} is not UTF-8: byte 0x{ord(ch) - 0xDC00:02X} at character {i}")
        if category[0] == "C":  # noncharacters are unassigned (Cn); a tab or newline is a control (Cc)
            raise HostileName(f"{what} holds {_kind(category)} U+{ord(ch):04X} at character {i}")


def _kind(category: str) -> str:
    kinds = {"Cc": "a control character", "Cf": "an invisible format character", "Cs": "a lone surrogate"}
    return kinds.get(category, "a private-use, unassigned or noncharacter code point")
