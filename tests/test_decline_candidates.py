"""Decline candidates that borrow a corpus's own names, and the reviewed pool of generic off-topic questions."""

import json
from pathlib import Path

import pytest

from sourcegate.evals.evalset import load_evalset, near_duplicates
from sourcegate.pipelines.build.chunk import slug, split_sections
from sourcegate.pipelines.build.ingest import parse_article
from sourcegate.pipelines.training.decline_candidates import (
    borrowing_candidates,
    corpus_names,
    label_words,
    sections_of_chunks,
    text_names,
)

ROOT = Path(__file__).resolve().parents[1]
POOL = ROOT / "config" / "evals" / "pool" / "off-topic.jsonl"
FIT = ROOT / "config" / "evals" / "calibration.jsonl"
# sets that trained the shipped models: a pool question a word away from one would not be new to them either
TRAINING = [ROOT / "config" / "evals" / name for name in ("riders.jsonl", "riders-train.jsonl", "riders-train-2.jsonl")]


def demo_chunks() -> list[dict]:
    """The demo corpus as chunk rows (one per section, as its sections fit a chunk): what chunks.parquet holds."""
    rows = []
    for path in sorted((ROOT / "corpus" / "demo").glob("*.md")):
        doc = parse_article(path.read_bytes(), Path(path.name))
        for heading, body in split_sections(doc["body"], "markdown"):
            header = "\n".join(x for x in (doc["title"], heading) if x)
            rows.append(
                {
                    "doc_id": doc["doc_id"],
                    "title": doc["title"],
                    "section": heading,
                    "section_id": slug(heading),
                    "body": body,
                    "text": f"{header}\n{body}",
                }
            )
    return rows


def test_names_are_capitalised_runs_and_not_a_capital_that_only_opens_a_sentence():
    text = "Buses stop at Central Station. The Valley Line runs hourly; ask RRT Access or call the Help Point."
    assert text_names(text) == ["Central Station", "Valley Line", "RRT Access", "Help Point"]
    sections = [
        {"title": "Night Owl Service", "heading": "What to include", "text": "Ride the Night Owl to Union Avenue."},
        {"title": "Night Owl Service", "heading": "Fares", "text": "The Night Owl costs $2. Union Avenue stop."},
    ]
    names = corpus_names(sections)
    # titles and headings count twice; "What to include" opens with a common word: a phrase, not a name; "Ride"
    # only opens a sentence
    assert names == ["Night Owl Service", "Fares", "Night Owl", "Union Avenue"]


def test_a_structured_abstracts_labels_and_a_decimals_whole_part_are_not_names():
    # SciFact's abstracts open their parts with upper-case labels the text also uses in lower case; acronyms it
    # never writes in lower case stay names (benchmark 28 found "OBJECTIVE To", "DESIGN", "CI 0" among the names)
    text = (
        "OBJECTIVE To test statins in HIV. DESIGN Randomised trial in Ohio. RESULTS The hazard ratio was 0.8 "
        "(95% CI 0.6-1.1) on Route 40. CONCLUSIONS We saw results in the design and its objective; "
        "these conclusions hold. SETTING Hospitals in a setting of care."
    )
    assert label_words([text]) == {"OBJECTIVE", "DESIGN", "RESULTS", "CONCLUSIONS", "SETTING"}
    # a label opens a sentence: the capitalised word after it ("Randomised", "Hospitals") is no name either
    assert text_names(text, label_words([text])) == ["HIV", "Ohio", "Route 40"]
    assert text_names(text) == [
        "OBJECTIVE",
        "HIV",
        "DESIGN Randomised",
        "Ohio",
        "RESULTS",
        "Route 40",
        "CONCLUSIONS",
        "SETTING Hospitals",
    ]
    sections = [{"title": "Statins and HIV", "heading": "", "text": text}] * 2
    assert not {"OBJECTIVE", "DESIGN", "RESULTS", "CI", "CI 0"} & set(corpus_names(sections))


def test_borrowing_candidates_put_the_corpus_names_in_asks_it_cannot_answer_the_same_for_a_seed():
    sections = sections_of_chunks(demo_chunks())
    rows = borrowing_candidates(sections, 60, seed=13)
    assert rows == borrowing_candidates(sections, 60, seed=13)
    assert [r["question"] for r in rows] != [r["question"] for r in borrowing_candidates(sections, 60, seed=14)]
    assert [r["id"] for r in rows] == [f"cand-{i:03d}" for i in range(1, 61)]
    assert {(r["label"], r["kind"]) for r in rows} == {("decline", "borrowing")}
    assert len({r["question"].lower() for r in rows}) == 60
    names = corpus_names(sections)
    for r in rows:
        name = r["review"].split("'")[1]
        assert name in names and name.lower() in r["question"].lower()
        assert r["review"].endswith("a person must confirm the corpus cannot answer it")
    # the commonest names of the corpus come first: its vocabulary, the kind that fooled every relevance signal
    assert {r["review"].split("'")[1] for r in rows[:5]} == set(names[:5])
    assert "Valley Line" in names[:5]


def test_borrowing_candidates_load_as_an_eval_set_and_stop_when_the_names_run_out(tmp_path):
    sections = [{"title": "Night Owl", "heading": "", "text": "The Night Owl runs late."}]
    rows = borrowing_candidates(sections, 1000, seed=1)
    assert 0 < len(rows) < 1000 and len(rows) == len({r["question"] for r in rows})
    path = tmp_path / "candidates.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [q["id"] for q in load_evalset(path)] == [r["id"] for r in rows]
    assert borrowing_candidates(sections, 0, seed=1) == []
    with pytest.raises(ValueError, match="no names found"):
        borrowing_candidates([{"title": "", "heading": "", "text": "all lower case here."}], 5, seed=1)


def test_the_off_topic_pool_loads_and_copies_no_question_of_the_fit_or_training_sets():
    pool = load_evalset(POOL)
    assert 60 <= len(pool) <= 80
    assert {(q["label"], q["kind"]) for q in pool} == {("decline", "off_topic")}
    assert not near_duplicates(pool, pool[:0])  # the rule runs on an empty set too
    assert len({q["question"].lower() for q in pool}) == len(pool)
    # every question names its topics (a corpus's domain relabels a whole topic near_topic, before any score)
    assert all(q["topics"] and all(t.islower() for t in q["topics"]) for q in pool)
    assert {q["id"] for q in pool if "health" in q["topics"]} >= {"pool-o-029", "pool-o-033", "pool-o-061"}
    for other in [FIT, *TRAINING]:
        assert near_duplicates(pool, load_evalset(other)) == [], other


@pytest.mark.models
def test_the_off_topic_pool_asks_no_fit_question_in_other_words(embedder):
    from sourcegate.evals.evalset import copies

    assert copies(load_evalset(POOL), load_evalset(FIT), embedder.encode) == []
