"""Before anything is scored, the eval sets must fit the corpus and the baseline must be there (sourcegate/evals/preflight.py):
otherwise the night stops with exit 2 saying which set, how many questions of each label are missing and how to
write them."""

import json
from types import SimpleNamespace

import pytest

from sourcegate.evals.preflight import PreflightError, preflight

CHUNKS = [{"doc_id": "fares", "section_id": "night"}, {"doc_id": "bikes", "section_id": ""}]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def answers(n, expected="fares#night"):
    return [{"id": f"a-{i}", "question": f"q {i}?", "label": "answer", "expected": [expected]} for i in range(n)]


def declines(n, kind="off_topic"):
    return [{"id": f"{kind}-{i}", "question": f"o {i}?", "label": "decline", "kind": kind} for i in range(n)]


def sections(fit, check=None, precision=None, baseline=None, need=3):
    evals = SimpleNamespace(calibration_set=fit, check_set=check, precision_set=precision or fit, baseline=baseline)
    return evals, SimpleNamespace(min_per_label=need, gate_decline_kinds=["off_topic"])


def test_sets_that_fit_pass(tmp_path):
    fit = write(tmp_path / "fit.jsonl", answers(3) + declines(3))
    preflight(*sections(fit, check=write(tmp_path / "check.jsonl", answers(1) + declines(1))), CHUNKS)


def test_labels_of_another_corpus_and_missing_questions_are_named_with_counts(tmp_path):
    fit = write(tmp_path / "fit.jsonl", answers(2, "stops#ferry") + declines(1) + declines(5, "near_topic"))
    with pytest.raises(PreflightError) as err:
        preflight(*sections(fit), CHUNKS)
    text = str(err.value)
    assert "nothing was scored" in text
    assert f"the fit set {fit}: 2 label(s) name nothing in this corpus (a-0 expects 'stops#ferry'" in text
    assert "2 should-answer question(s), 3 needed (calibration.min_per_label): write 1 more" in text
    assert "1 should-decline (off_topic) question(s), 3 needed" in text  # near-topic ones are not gated
    assert "sourcegate init" in text and '"label": "answer"' in text


def test_a_malformed_or_missing_set_and_a_missing_baseline_are_named(tmp_path):
    fit = write(tmp_path / "fit.jsonl", answers(3) + declines(3))
    (tmp_path / "check.jsonl").write_text('{"id": "x", "question": "q"\n')
    missing = tmp_path / "baseline.json"
    with pytest.raises(PreflightError) as err:
        preflight(*sections(fit, check=str(tmp_path / "check.jsonl"), baseline=str(missing)), CHUNKS)
    text = str(err.value)
    assert "the check set: " in text and "not valid JSON" in text
    assert f"evals.baseline {missing} not found" in text and "evals.baseline: null" in text
    missing.write_text("{}")
    with pytest.raises(PreflightError, match="the accepted baseline is empty"):
        preflight(*sections(fit, baseline=str(missing)), CHUNKS)


def test_a_label_whose_document_the_night_set_aside_names_the_document_and_why(tmp_path):
    """A labelled article that became empty (or unreadable) is not a stale label: the night says the document was
    set aside and why, so the data engineer fixes the document rather than relabelling the question."""
    from sourcegate.pipelines.build.quarantine import documents

    rows = [
        {"source": "stops/ferry.md", "reason": "empty body", "stage": "ingest"},
        {"source": "corpus.jsonl:7", "reason": "not valid JSON", "stage": "ingest"},  # a BEIR line: no id known
        {"source": "x.md", "doc_id": "front-matter-id", "reason": "degenerate document: …", "stage": "chunk"},
    ]
    aside = documents(rows)
    assert aside == {"stops:ferry": "empty body", "front-matter-id": "degenerate document: …"}
    gone = {"id": "g-1", "question": "q?", "label": "answer", "expected": ["gone"]}
    fit = write(tmp_path / "fit.jsonl", answers(3, "stops:ferry#times") + [gone] + declines(3))
    with pytest.raises(PreflightError) as err:
        preflight(*sections(fit), CHUNKS, aside)
    text = str(err.value)
    assert "a-0 expects 'stops:ferry#times', whose document was set aside tonight (empty body)" in text
    assert "g-1 expects 'gone', which is not in the corpus" in text
    assert "fix the documents set aside (the run's quarantine.jsonl), or label each question" in text


def test_a_removed_document_and_a_renamed_section_are_each_named_with_what_to_do(tmp_path):
    """A corpus update removes an article or renames a heading: the labels naming them say which happened (the run
    that found the article deleted; the sections its document has now), and a removed article's questions are
    said to be questions the corpus no longer answers. What was removed is read only when a label needs it."""
    asked = []

    def removed():
        asked.append(1)
        return {"photos": "20261206-010000"}

    fit = write(tmp_path / "fit.jsonl", answers(3) + declines(3))
    preflight(*sections(fit), CHUNKS, removed=removed)
    assert not asked  # every label's document is here: nothing to look up
    chunks = CHUNKS + [{"doc_id": "fares", "section_id": "day"}]
    stale = [
        {"id": f"s-{i}", "question": f"s {i}?", "label": "answer", "expected": [label]}
        for i, label in enumerate(["photos#permits", "fares#nights", "bikes#rack"])
    ]
    fit = write(tmp_path / "fit.jsonl", answers(3) + stale + declines(3))
    with pytest.raises(PreflightError) as err:
        preflight(*sections(fit), chunks, removed=removed)
    text = str(err.value)
    assert (
        "expects 'photos#permits', whose document was removed from the corpus (found deleted by run 20261206-010000)"
        in text
    )
    assert "expects 'fares#nights', a section fares does not have (its sections: night, day)" in text
    assert "expects 'bikes#rack', a section bikes does not have (it has none: label it 'bikes')" in text
    assert 'relabel it {"label": "decline", "kind": "near_topic"} (without "expected") or delete it' in text
    fit = write(tmp_path / "fit.jsonl", answers(3) + stale[1:] + declines(3))
    with pytest.raises(PreflightError) as err:
        preflight(*sections(fit), chunks, removed=removed)
    assert "relabel it" not in str(err.value)  # no document removed: no such advice


def test_a_gated_kind_spelt_otherwise_is_named_before_it_silently_escapes_the_gap(tmp_path):
    """A kind "off-topic" for "off_topic": the question would be swept and reported, never held to the gap."""
    fit = write(tmp_path / "fit.jsonl", answers(3) + declines(3) + declines(2, "Off-Topic"))
    check = write(tmp_path / "check.jsonl", answers(1) + declines(1) + declines(1, "off topic"))
    with pytest.raises(PreflightError) as err:
        preflight(*sections(fit, check=check), CHUNKS)
    text = str(err.value)
    assert f"the fit set {fit}: 2 should-decline question(s) of a kind spelt unlike the gated one" in text
    assert "Off-Topic-0 has kind 'Off-Topic', gated as 'off_topic'" in text
    assert f"the check set {check}: 1 should-decline question(s)" in text
    near = write(tmp_path / "near.jsonl", answers(3) + declines(3) + declines(2, "near_topic"))  # another kind: fine
    preflight(*sections(near), CHUNKS)
