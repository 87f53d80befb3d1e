"""Labelled eval sets (JSON Lines), validated line by line.

Line format: {"id", "question", "label": "answer"|"decline", "expected": [doc_id or
doc_id#section, ...], "context": [prior turns], "kind"}. A malformed line is an error
naming the file and line, never a silently skipped question.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

LABELS = {"answer", "decline"}


class EvalSetError(ValueError):
    pass


def load_evalset(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise EvalSetError(f"{path}: eval set not found")
    items, seen = [], set()
    try:
        text = path.read_text(encoding="utf-8-sig")  # a leading byte-order mark (Notepad writes one) is no content
    except UnicodeDecodeError as exc:
        raise EvalSetError(f"{path}: not UTF-8 (byte {exc.start}); save the file as UTF-8") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalSetError(f"{where}: not valid JSON ({exc.msg})") from None
        items.append(_check(obj, where))
        if obj["id"] in seen:
            raise EvalSetError(f"{where}: duplicate id {obj['id']!r}")
        seen.add(obj["id"])
    if not items:
        raise EvalSetError(f"{path}: no questions")
    return items


def _check(obj, where: str) -> dict:
    if not isinstance(obj, dict):
        raise EvalSetError(f"{where}: expected a JSON object")
    for key in ("id", "question", "label"):
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            raise EvalSetError(f"{where}: field {key!r} must be a non-empty string")
    if obj["label"] not in LABELS:
        raise EvalSetError(f"{where}: label {obj['label']!r} is not 'answer' or 'decline'")
    for key in ("expected", "context"):
        value = obj.setdefault(key, [])
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise EvalSetError(f"{where}: field {key!r} must be a list of strings")
    obj.setdefault("kind", "single")
    if not isinstance(obj["kind"], str):
        raise EvalSetError(f"{where}: field 'kind' must be a string")
    if obj["label"] == "answer" and not obj["expected"]:
        raise EvalSetError(f"{where}: a should-answer question must name what answers it in 'expected'")
    return obj


def question_text(item: dict) -> str:
    """A question as a model reads it (conversation and question), case and spacing aside."""
    return " ".join(" ".join([*item.get("context", []), item["question"]]).lower().split())


def question_key(item: dict) -> str:
    """A question's identity: what a trained model's recipe records, so a set holding a question it trained
    on is found whatever its id."""
    return hashlib.sha256(question_text(item).encode()).hexdigest()[:16]


NEAR = 0.8  # difflib ratio at which two questions are one reworded (the bar the rider sets were written to)


def near_duplicates(items: list[dict], others: list[dict], ratio: float = NEAR) -> list[tuple[str, str, float]]:
    """(item id, other id, ratio) for each item whose text is within `ratio` of an other's (the first such
    other, in order): an exact copy under a new id, or the same question reworded by a word or two.

    difflib's two cheap upper bounds of the ratio (lengths, then shared characters) are computed for every pair at
    once with numpy, as difflib computes them (2.0 * matches / length, the same floats); only the pairs both let
    through are matched. A night asks this of its fit and check sets against every question its answer model
    trained on: hundreds of thousands of pairs, of which a few percent pass both bounds."""
    texts = [question_text(o) for o in others]
    asked = [question_text(item) for item in items]
    if not texts or not asked:
        return []
    alphabet = {ch: i for i, ch in enumerate(sorted(set("".join(texts + asked))))}
    other_counts, other_lengths = _char_counts(texts, alphabet)
    item_counts, item_lengths = _char_counts(asked, alphabet)
    found = []
    for item, text, counts, length in zip(items, asked, item_counts, item_lengths):
        total = (length + other_lengths).astype(np.float64)
        shared = np.minimum(counts, other_counts).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):  # two empty texts: difflib's ratio is 1.0
            real_quick = np.where(total > 0, 2.0 * np.minimum(length, other_lengths) / total, 1.0)
            quick = np.where(total > 0, 2.0 * shared / total, 1.0)
        matcher = difflib.SequenceMatcher(None, "", text, autojunk=False)
        for j in np.flatnonzero((real_quick >= ratio) & (quick >= ratio)):
            matcher.set_seq1(texts[j])  # seq2 (the item) keeps its index across the others
            score = matcher.ratio()
            if score >= ratio:
                found.append((item["id"], others[j]["id"], round(score, 3)))
                break
    return found


def _char_counts(texts: list[str], alphabet: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Each text's count of each character of `alphabet`, and its length."""
    counts = np.zeros((len(texts), len(alphabet)), dtype=np.int64)
    for row, text in enumerate(texts):
        for ch in text:
            counts[row, alphabet[ch]] += 1
    return counts, counts.sum(axis=1)


PARAPHRASE = 0.8  # bi-encoder cosine at which two questions are one ask in other words (docs/calibration.md)


def paraphrases(
    items: list[dict], others: list[dict], vectors, cosine: float = PARAPHRASE
) -> list[tuple[str, str, float]]:
    """(item id, other id, cosine) for each item within `cosine` of its nearest other, both read as a model reads
    them and embedded by `vectors` (texts -> vectors, e.g. a version's bi-encoder): the same ask in other words,
    which a difflib ratio misses ("Do bus operators sell single-ride tickets?" ~ "Can a bus driver sell me a
    single-ride ticket?": ratio 0.5, MiniLM cosine 0.85)."""
    if not items or not others:
        return []
    a, b = (np.asarray(vectors([question_text(q) for q in qs]), dtype=np.float64) for qs in (items, others))
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    sims = a @ b.T
    nearest = sims.argmax(axis=1)
    return [
        (q["id"], others[j]["id"], round(float(sims[i, j]), 3))
        for i, (q, j) in enumerate(zip(items, nearest))
        if sims[i, j] >= cosine
    ]


def copies(items: list[dict], others: list[dict], vectors=None) -> list[tuple[str, str, float]]:
    """(item id, other id, score) for each item that asks an other's question again: verbatim or a word or two
    away (`near_duplicates`), or, given `vectors`, in other words (`paraphrases`)."""
    found = near_duplicates(items, others)
    if vectors is not None:
        near = {a for a, _, _ in found}
        found += paraphrases([q for q in items if q["id"] not in near], others, vectors)
    return found


SECTIONS_SHOWN = 4  # a renamed section's document: this many of its sections named, enough to spot the new name


def section_label(doc_id: str, section_id: str) -> str:
    """How a label names a section: `doc_id#section_id`, or the bare doc id for an article with no sections."""
    return f"{doc_id}#{section_id}" if section_id else doc_id


def relevant(expected: list[str], doc_id: str, section_id: str) -> bool:
    """A bare doc id labels the whole article; doc_id#section labels one section."""
    return doc_id in expected or f"{doc_id}#{section_id}" in expected


def check_labels(
    items: list[dict],
    chunks: list[dict],
    source: str,
    set_aside: Mapping[str, str] | None = None,
    removed: Callable[[], Mapping[str, str]] | None = None,
) -> list[str]:
    """Expected ids that name nothing in the corpus: a stale label is an error, not a zero. Each says why, so the
    maintainer knows what to fix: a document the night quarantined (`set_aside`, {doc id: reason}: fix the
    document), a section its document does not have (renamed or dropped: its sections are named), a document
    removed from the corpus (`removed()`, {doc id: the run that found it deleted}, asked only when a label names a
    document absent tonight), or one this corpus never had."""
    known = {c["doc_id"] for c in chunks} | {f"{c['doc_id']}#{c['section_id']}" for c in chunks}
    sections: dict[str, list[str]] = {}
    for c in chunks:
        held = sections.setdefault(c["doc_id"], [])
        if c["section_id"] and c["section_id"] not in held:
            held.append(c["section_id"])

    def missing(label: str) -> str:
        doc = label.split("#")[0]
        if (set_aside or {}).get(doc):
            return f"whose document was set aside tonight ({set_aside[doc]})"
        if doc in sections and not sections[doc]:
            return f"a section {doc} does not have (it has none: label it {doc!r})"
        if doc in sections:
            shown = ", ".join(sections[doc][:SECTIONS_SHOWN]) + (", …" if len(sections[doc]) > SECTIONS_SHOWN else "")
            return f"a section {doc} does not have (its sections: {shown})"
        gone = removed() if removed else {}
        if doc in gone:
            return f"whose document was removed from the corpus (found deleted by run {gone[doc]})"
        return "which is not in the corpus"

    return [
        f"{source}: {it['id']} expects {e!r}, {missing(e)}" for it in items for e in it["expected"] if e not in known
    ]
