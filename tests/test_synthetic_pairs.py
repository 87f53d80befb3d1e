"""Training pairs made from a corpus alone: inverse-cloze pseudo-queries and asks that borrow its names."""

import json

import pytest

from sourcegate.pipelines.training.in_domain import leave_out_judged
from sourcegate.pipelines.training.synthetic_pairs import (
    pseudo_queries,
    sentences,
    synthetic_pairs,
    synthetic_source,
    without,
)
from tests.test_decline_candidates import demo_chunks


def test_sentences_are_cut_at_their_ends_and_short_ones_left_out():
    body = "Call 555-0100. Riders may bring one folding bike on any bus.\nStrollers fit in the wide door area too!"
    assert sentences(body) == [
        "Riders may bring one folding bike on any bus.",
        "Strollers fit in the wide door area too!",
    ]
    assert without("Title\nOne two. Riders may bring bikes. Three four.", "Riders may bring bikes.") == (
        "Title\nOne two. Three four."
    )


def test_pseudo_queries_are_the_same_for_a_seed_spread_over_sections_and_answered_by_their_own_chunk():
    chunks = demo_chunks()
    queries = pseudo_queries(chunks, 300, seed=13)
    assert queries == pseudo_queries(chunks, 300, seed=13)
    assert [q["question"] for q in queries] != [q["question"] for q in pseudo_queries(chunks, 300, seed=14)]
    assert len(queries) == 300 and len({q["question"] for q in queries}) == 300
    sections = {f"{c['doc_id']}#{c['section_id']}" for c in chunks}
    assert len({q["section"] for q in queries}) == min(300, len(sections))  # one per section before a second
    by_section = {f"{c['doc_id']}#{c['section_id']}": c for c in chunks}
    for q in queries:
        own = by_section[q["section"]]
        assert q["question"] in own["body"]  # a sentence of its own section
        if q["kept"]:
            assert q["positive"] == own["text"]
        else:  # the section without the sentence: what it says about it, not the same words
            assert q["question"] not in q["positive"] and q["positive"] == without(own["text"], q["question"])
    kept = sum(q["kept"] for q in queries)
    assert 10 <= kept <= 50  # about KEEP_SHARE (0.1) of 300
    with pytest.raises(ValueError):
        pseudo_queries(chunks, 5, seed=1, keep_share=1.5)


def test_no_pair_takes_a_positive_or_a_negative_from_the_wrong_section():
    queries = [
        {
            "query": "q1",
            "section": "a#x",
            "positive": "A x without q1",
            "passages": [("a#x", "A x"), ("b#y", "B y"), ("a#z", "A z"), ("c#w", "C w")],
        }
    ]
    declines = [{"query": "d1", "passages": [("a#x", "A x"), ("b#y", "B y"), ("c#w", "C w")]}]
    pairs = synthetic_pairs(queries, declines, window=2, negatives=2)
    assert pairs == [
        ("q1", "A x without q1", 1),
        ("q1", "B y", 0),  # the own section's passage (first in the fused order) is never a negative
        ("q1", "A z", 0),  # another section of the same article is
        ("d1", "A x", 0),
        ("d1", "B y", 0),
    ]


def test_the_synthetic_source_drops_a_generated_question_that_copies_a_judged_one_and_records_how_it_was_made(
    tmp_path,
):
    chunks = demo_chunks()
    queries = pseudo_queries(chunks, 40, seed=13)
    judged_question = queries[5]["question"]
    fit = tmp_path / "fit.jsonl"
    fit.write_text(json.dumps({"id": "fit-1", "question": judged_question.upper(), "label": "decline"}) + "\n")
    searched = []

    def tops(items, depth):  # the version's retrieval stands in: the same fixed order for every question
        searched.append((len(items), depth))
        order = [(f"{c['doc_id']}#{c['section_id']}", c["text"]) for c in chunks[:depth]]
        return [{**q, "query": q["question"], "passages": order} for q in items]

    def leave_out(items):
        return leave_out_judged(items, {"fit set": str(fit)}, drop=True)

    made, pairs, record = synthetic_source(tops, chunks, 40, seed=13, window=3, leave_out=leave_out)
    assert judged_question not in [q["question"] for q in made]
    assert record["left_out"] == {queries[5]["id"]: f"~ fit-1 of the fit set {fit} (1.00)"}
    assert record["pseudo_queries"] == 39 and record["borrowing"] == 10 and record["seed"] == 13
    assert searched == [(39, 3), (10, 3)]
    assert sum(y for *_, y in pairs) == 39
    assert len(pairs) == 39 * (1 + 2) + 10 * 3  # a positive and two other sections each; each decline its window
    assert (made, pairs, record) == synthetic_source(tops, chunks, 40, seed=13, window=3, leave_out=leave_out)
