"""Should-decline candidates that borrow a corpus's own names: the ask no article covers, worded with the
corpus's vocabulary.

On the demo, the off-topic questions that beat every relevance signal were of this kind, a corpus place or
service with an everyday ask (docs/calibration.md): the corpus's names make them look answerable to a
bi-encoder, BM25 and a cross-encoder alike. A maintainer of any corpus can get such candidates without writing
them: the corpus's titles, headings and capitalised names, each put in an ask that a handbook-like article does
not answer (a price in a foreign currency, who founded it, an opinion, someone's personal data, a comparison with
something the corpus never names, a timetable years ahead). They are candidates, never labels: a person confirms
that the corpus cannot answer each before it is used to place or check a threshold (the `review` field says so).
"""

from __future__ import annotations

import random
import re
from collections import Counter

from sourcegate.evals.evalset import section_label

# Asks a corpus of articles about a service or a product does not answer, whatever name fills them: each names
# what is absent (another currency, the past, a judgement, a private person, a far-away thing, a far-off date).
TEMPLATES = (
    "how much is {name} in japanese yen",
    "what does {name} cost in euros if i pay from germany",
    "who founded {name} and in what year",
    "history of {name} before 1950?",
    "what was {name} called originally, like 100 years ago",
    "honestly is {name} worth it or overrated? your opinion",
    "do you personally like {name}",
    "home address and phone number of whoever runs {name}",
    "what is the salary of the manager in charge of {name}",
    "is {name} better than the tokyo metro",
    "compare {name} with the london underground",
    "{name} vs uber which one is cheaper in new york",
    "what will {name} be like on july 14 2039",
    "{name} schedule for christmas day 2035",
    "write me a poem about {name}",
    "stock price of {name} today",
    "{name} reviews on tripadvisor",
    "weather at {name} this weekend, will it rain",
    "who is the ceo of {name} married to",
    "translate {name} into klingon",
)

# common words a capitalised run may open with ("The", "If", "Every"): never the start of a name
_COMMON = (
    "a an the if in on at for to of and or but so as by with from this that these those it its is are be was "
    "when where what which who why how you your we our they their he she his her i my all any each every no not "
    "some most many more one two three yes please note also only other after before during while until under over "
    "between within without about into onto across along around up down out new see call use ask"
)
STOP_STARTS = frozenset(_COMMON.split())
MAX_NAME_WORDS = 6
MIN_NAME_CHARS = 3
# a capitalised run of words (Title Case or ACRONYMS, digits allowed after the first), optionally joined by
# "of"/"and"/"&" as names often are ("Lost and Found", "Office of Civil Rights"); not by "the", which joins a
# verb to a name ("Ride the Night Owl")
_NAME = re.compile(
    r"\b(?:[A-Z][A-Za-z0-9'’.-]*[A-Za-z0-9]|[A-Z]{2,})"
    r"(?:[ \t]+(?:(?:of|and|&)[ \t]+)?(?:[A-Z][A-Za-z0-9'’.-]*[A-Za-z0-9]|[A-Z]{2,}|\d+[A-Za-z]?(?![.,]\d)))*"
)
# a number ends a name ("Route 40"); the whole part of a decimal does not ("95% CI 0.85-1.2" names no "CI 0")
_SENTENCE_START = re.compile(r"(?:^|[.!?:;]\s+|\n\s*)$")


def _clean(name: str) -> str:
    return " ".join(name.split()).strip(" .,;:-'’")


def label_words(texts: list[str]) -> frozenset[str]:
    """Upper-case words the texts also use in lower case: a structured text's labels ("DESIGN", "METHODS",
    "RESULTS" in an abstract), not acronyms ("RRT", "HIV" are never written "rrt", "hiv")."""
    lower, upper = set(), set()
    for text in texts:
        lower.update(re.findall(r"\b[a-z]{2,}\b", text))
        upper.update(re.findall(r"\b[A-Z]{2,}\b", text))
    return frozenset(word for word in upper if word.lower() in lower)


def text_names(text: str, labels: frozenset[str] = frozenset()) -> list[str]:
    """Capitalised names in running text: runs of two or more capitalised words anywhere, and single
    capitalised words or acronyms that do not start a sentence (so "Buses" opening a sentence is not a name).
    A run loses the common words it opens or ends with ("The Valley Line", "OBJECTIVE To") and the `labels`
    (`label_words`) it opens with: a label starts a sentence, as a full stop does."""
    names = []
    for m in _NAME.finditer(text):
        words = _clean(m.group(0)).split()
        at_start = bool(_SENTENCE_START.search(text[: m.start()]))
        while words and (words[0].lower() in STOP_STARTS or words[0] in labels):
            at_start = at_start or words[0] in labels
            words = words[1:]
        while words and words[-1].lower() in STOP_STARTS:
            words = words[:-1]
        name = " ".join(words)
        if not words or len(words) > MAX_NAME_WORDS or len(name) < MIN_NAME_CHARS:
            continue
        if len(words) == 1 and at_start and not words[0].isupper():
            continue
        names.append(name)
    return names


def name_counts(sections: list[dict]) -> dict[str, int]:
    """The corpus's own names and how often it uses them: article titles and section headings (each counting
    twice: the corpus naming its own subject) and the capitalised names of the text (`text_names`), one spelling
    per name (the commonest), counts merged across spellings. `sections`: dicts with "title", "heading" and
    "text" (a section's body)."""
    counts: Counter[str] = Counter()
    labels = label_words([s.get("text") or "" for s in sections])
    for s in sections:
        for field in ("title", "heading"):
            words = _clean(s.get(field) or "").split()
            if words and words[0].lower() in ("the", "a", "an"):
                words = words[1:]
            # a heading that opens with a common word is a phrase ("What to include"), not a name
            if words and len(words) <= MAX_NAME_WORDS and words[0].lower() not in STOP_STARTS:
                counts[" ".join(words)] += 2
        counts.update(text_names(s.get("text") or "", labels))
    spelling: dict[str, str] = {}
    merged: Counter[str] = Counter()
    for name, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        spelling.setdefault(name.lower(), name)
        merged[name.lower()] += count
    return {spelling[lower]: count for lower, count in merged.items()}


def corpus_names(sections: list[dict], min_count: int = 2) -> list[str]:
    """The names of `name_counts` used at least `min_count` times (a capitalised word seen once is not taken for
    a name), most frequent first, ties alphabetical."""
    counts = name_counts(sections)
    return sorted((n for n, c in counts.items() if c >= min_count), key=lambda n: (-counts[n], n))


def _as_typed(name: str, rng: random.Random) -> str:
    """Users type names lower-case about half the time; acronyms keep their capitals."""
    if rng.random() < 0.5:
        return " ".join(w if w.isupper() and len(w) > 1 else w.lower() for w in name.split())
    return name


def borrowing_candidates(sections: list[dict], n: int, seed: int) -> list[dict]:
    """`n` should-decline candidates (eval-set rows, kind "borrowing") pairing the corpus's own names
    (`corpus_names`) with asks no article covers (`TEMPLATES`); deterministic for `seed`. Names are spread: each
    name is used once before any is used twice, and no (name, ask) pair twice. Fewer than `n` only when the
    corpus has fewer names than that times the asks."""
    if n < 0:
        raise ValueError(f"n={n}: the number of candidates cannot be negative")
    counts = name_counts(sections)
    names = corpus_names(sections)
    if not names:
        raise ValueError("no names found in the sections (titles, headings or capitalised words): nothing to borrow")
    rng = random.Random(seed)
    # the commonest names first (the vocabulary a question most likely borrows), in a seeded order within a count
    order = sorted(names, key=lambda name: (-counts[name], rng.random()))
    asks = {name: rng.sample(range(len(TEMPLATES)), len(TEMPLATES)) for name in order}
    rows, seen = [], set()
    for round_ in range(len(TEMPLATES)):
        for name in order:
            if len(rows) >= n:
                return rows
            template = TEMPLATES[asks[name][round_]]
            question = template.format(name=_as_typed(name, rng))
            if question.lower() in seen:
                continue
            seen.add(question.lower())
            rows.append(
                {
                    "id": f"cand-{len(rows) + 1:03d}",
                    "question": question,
                    "label": "decline",
                    "kind": "borrowing",
                    "review": f"generated from {name!r}: a person must confirm the corpus cannot answer it",
                }
            )
    return rows


def sections_of_chunks(chunks: list[dict]) -> list[dict]:
    """A version's chunk rows (chunks.parquet: doc_id, title, section, section_id, body) as its sections, in
    order: {"id": its label (evalset.section_label), "title", "heading", "text": the section's bodies joined}."""
    by_id: dict[str, dict] = {}
    for c in chunks:
        key = section_label(c["doc_id"], c["section_id"])
        s = by_id.setdefault(key, {"id": key, "title": c["title"], "heading": c["section"], "text": []})
        s["text"].append(c["body"])
    return [{**s, "text": "\n".join(s["text"])} for s in by_id.values()]
