"""Training pairs for the answer-support model made from the corpus alone: no hand-written question.

A corpus a user brings has no labelled questions. The inverse cloze task (Lee, Chang and Toutanova, 2019) makes
them from its text: a sentence cut from a passage is a pseudo-query, and the passage it was cut from, with the
sentence removed, is the passage that answers it; removing it makes the model learn what a passage says
about the sentence rather than to spot the same words (kept in a small share, as ICT does, so an exact match is
not punished). The passages the version's own retrieval ranks highest for the sentence, from other sections, are
its hard negatives: related, but not where the sentence came from. Asks that borrow the corpus's names
(`decline_candidates.borrowing_candidates`) are the should-decline questions, each with the fused top window
`answer_support` reads as negatives, as a labelled decline question is in `in_domain.training_pairs`.
"""

from __future__ import annotations

import random
import re

from sourcegate.pipelines.training.decline_candidates import borrowing_candidates, sections_of_chunks

KEEP_SHARE = 0.1  # ICT's share of pseudo-queries whose sentence stays in the positive passage
NEGATIVES = 2  # hard negatives per pseudo-query (the highest-ranked passages of other sections)
BORROWING_SHARE = 0.25  # borrowing asks per pseudo-query: their window of negatives evens the labels out
MIN_WORDS = 6  # a shorter sentence ("Call 555-0100.") says too little to be asked about
MAX_WORDS = 40
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def sentences(body: str) -> list[str]:
    """The sentences of a passage body with MIN_WORDS to MAX_WORDS words (line breaks end a sentence too)."""
    found = []
    for line in body.splitlines():
        for s in _SENTENCE_END.split(line.strip()):
            s = s.strip()
            if MIN_WORDS <= len(s.split()) <= MAX_WORDS:
                found.append(s)
    return found


def section_key(chunk: dict) -> str:
    return f"{chunk['doc_id']}#{chunk['section_id']}"


def without(text: str, sentence: str) -> str:
    """`text` with the first occurrence of `sentence` cut out, the space around it closed up."""
    at = text.index(sentence)
    return (text[:at].rstrip(" ") + " " + text[at + len(sentence) :].lstrip(" ")).strip().replace(" \n", "\n")


def pseudo_queries(chunks: list[dict], n: int, seed: int, keep_share: float = KEEP_SHARE) -> list[dict]:
    """Up to `n` inverse-cloze pseudo-queries from a version's chunk rows (chunks.parquet: doc_id, section_id,
    body, text): each a sentence of a chunk's body, with `section` (doc_id#section_id) and `positive` (the
    chunk's text without the sentence, or with it in a `keep_share` of cases). Spread over sections: every
    section gives one before any gives two. Deterministic for `seed`."""
    if n < 0 or not 0 <= keep_share <= 1:
        raise ValueError(f"n={n}, keep_share={keep_share}: n >= 0 and keep_share in [0, 1]")
    rng = random.Random(seed)
    by_section: dict[str, list[tuple[dict, str]]] = {}
    for chunk in chunks:
        for s in sentences(chunk["body"]):
            if s in chunk["text"]:
                by_section.setdefault(section_key(chunk), []).append((chunk, s))
    keys = sorted(by_section)
    rng.shuffle(keys)
    for key in keys:
        rng.shuffle(by_section[key])
    rows, seen = [], set()
    for round_ in range(max((len(v) for v in by_section.values()), default=0)):
        for key in keys:
            if len(rows) >= n:
                return rows
            if round_ >= len(by_section[key]):
                continue
            chunk, sentence = by_section[key][round_]
            if sentence.lower() in seen:  # a sentence repeated across articles would be two labels for one ask
                continue
            seen.add(sentence.lower())
            keep = rng.random() < keep_share
            rows.append(
                {
                    "id": f"ict-{len(rows) + 1:05d}",
                    "question": sentence,
                    "label": "answer",
                    "kind": "pseudo_query",
                    "section": key,
                    "positive": chunk["text"] if keep else without(chunk["text"], sentence),
                    "kept": keep,
                }
            )
    return rows


def synthetic_pairs(queries: list[dict], declines: list[dict], window: int, negatives: int = NEGATIVES) -> list:
    """(question, passage, label) pairs: each pseudo-query with its positive (1) and its `negatives` highest-ranked
    passages (rows' "passages": [(doc_id#section_id, text)] in fused order, as `fused_tops` gives) of other
    sections (0); each should-decline ask with its fused top `window` (0)."""
    pairs: list[tuple[str, str, int]] = []
    for q in queries:
        others = [text for section, text in q["passages"] if section != q["section"]]
        pairs.append((q["query"], q["positive"], 1))
        pairs += [(q["query"], text, 0) for text in others[:negatives]]
    for d in declines:
        pairs += [(d["query"], text, 0) for _, text in d["passages"][:window]]
    return pairs


def synthetic_source(
    tops,
    chunks: list[dict],
    n: int,
    seed: int,
    window: int,
    *,
    negatives: int = NEGATIVES,
    borrowing_share: float = BORROWING_SHARE,
    keep_share: float = KEEP_SHARE,
    leave_out=None,
) -> tuple[list[dict], list[tuple[str, str, int]], dict]:
    """The synthetic training source over one version: (the questions trained on, the pairs, the record of how
    they were made, for recipe.json). `tops(items, depth)`: the items as searched with their fused top `depth`
    passages (`in_domain.fused_tops` over the version's retriever). `leave_out(items) -> {id: why}` drops generated questions that copy a
    judged (fit or check) one, so no pseudo-query or borrowing ask is a question a night is judged on."""
    queries = pseudo_queries(chunks, n, seed, keep_share)
    declines = borrowing_candidates(sections_of_chunks(chunks), round(n * borrowing_share), seed)
    dropped = dict(leave_out(queries + declines)) if leave_out else {}
    queries = [q for q in queries if q["id"] not in dropped]
    declines = [d for d in declines if d["id"] not in dropped]
    depth = max(window, negatives + 1)  # the pseudo-query's own section is usually first: one more to skip it
    pairs = synthetic_pairs(tops(queries, depth), tops(declines, window), window, negatives)
    record = {
        "method": "inverse cloze task: a sentence of a chunk as the query, the chunk without it (kept in "
        "keep_share of cases) as the positive, the fused top passages of other sections as negatives; "
        "borrowing asks (decline_candidates.borrowing_candidates) with their fused top window as negatives",
        "seed": seed,
        "pseudo_queries_asked": n,
        "pseudo_queries": len(queries),
        "kept_sentence": sum(q["kept"] for q in queries),
        "borrowing": len(declines),
        "negatives_per_query": negatives,
        "keep_share": keep_share,
        "borrowing_share": borrowing_share,
        "window": window,
        "sections": len({q["section"] for q in queries}),
        "left_out": dropped,
    }
    return queries + declines, pairs, record
