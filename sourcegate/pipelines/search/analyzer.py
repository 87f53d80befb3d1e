"""The one text analyser BM25 uses, at index and query time, on both backends.

NFKC-normalise -> lowercase -> word tokens (``\\w+``: letters, digits, underscore) -> drop
English stopwords -> Snowball English stemmer (Porter2, via PyStemmer).

The OpenSearch side is :func:`opensearch_analysis`, built from the same pieces: a ``mapping``
char filter holding the NFKC image of every code point whose word tokens NFKC changes (the
node has no ICU plugin), a ``pattern`` tokenizer splitting on ``[^\\p{L}\\p{N}_]+`` (what
Python's ``\\w`` is), ``lowercase``, a ``stop`` filter with :data:`STOPWORDS` and the ``snowball``
English stemmer. What still differs: NFKC also composes a letter with a following combining
accent (``e`` + U+0301 -> ``é``), which a per-character mapping cannot; and Python lowercases with
full case mapping, Lucene with simple (only U+0130 differs).

NFKC and ``lower()`` rather than casefold: casefold turns ``ß`` into ``ss`` and ``ς`` into ``σ``,
which Lucene's ``lowercase`` does not, and parity between the backends matters more here.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

import Stemmer

ANALYZER_ID = "en-nfkc-stop74-snowball"  # stored with every BM25 index: the query side must match it

_WORD = re.compile(r"\w+")

# English function words; the set `term_coverage` also ignores. Removing them matters most
# for long natural-language questions, where "what", "does", "the" would otherwise add score.
STOPWORDS = frozenset(
    [
        "a",
        "about",
        "after",
        "all",
        "also",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "been",
        "before",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "for",
        "from",
        "had",
        "has",
        "have",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "me",
        "my",
        "no",
        "not",
        "of",
        "on",
        "or",
        "our",
        "so",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "too",
        "up",
        "us",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)


@functools.lru_cache(maxsize=1)
def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


def normalise(text: str) -> str:
    return unicodedata.normalize("NFKC", text).lower()


def words(text: str) -> list[str]:
    """Normalised, lowercased word tokens, no stopword removal or stemming (term coverage uses these)."""
    return _WORD.findall(normalise(text))


def analyze(text: str) -> list[str]:
    """BM25 terms of a text: words without stopwords, stemmed."""
    return _stemmer().stemWords([w for w in words(text) if w not in STOPWORDS])


@functools.lru_cache(maxsize=1)
def nfkc_mappings() -> tuple[str, ...]:
    """``mapping`` char-filter rules: each code point whose word tokens NFKC changes -> its NFKC image."""

    def esc(s: str) -> str:
        return "".join(f"\\u{u:04x}" for u in _utf16(s))

    rules = []
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        n = unicodedata.normalize("NFKC", c)
        if n != c and _WORD.findall(c.lower()) != _WORD.findall(n.lower()):
            rules.append(f"{esc(c)}=>{esc(n)}")
    return tuple(rules)


def _utf16(s: str) -> list[int]:
    b = s.encode("utf-16-be")
    return [int.from_bytes(b[i : i + 2], "big") for i in range(0, len(b), 2)]


def opensearch_analysis() -> dict:
    """Index ``settings.analysis`` defining the analyser ``sourcegate_en`` (the same steps as :func:`analyze`)."""
    return {
        "char_filter": {"sourcegate_nfkc": {"type": "mapping", "mappings": list(nfkc_mappings())}},
        "tokenizer": {"sourcegate_words": {"type": "pattern", "pattern": "[^\\p{L}\\p{N}_]+"}},
        "filter": {
            "sourcegate_stop": {"type": "stop", "stopwords": sorted(STOPWORDS)},
            "sourcegate_stem": {"type": "snowball", "language": "English"},
        },
        "analyzer": {
            "sourcegate_en": {
                "type": "custom",
                "char_filter": ["sourcegate_nfkc"],
                "tokenizer": "sourcegate_words",
                "filter": ["lowercase", "sourcegate_stop", "sourcegate_stem"],
            }
        },
    }
