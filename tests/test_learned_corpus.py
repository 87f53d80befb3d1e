"""What a trained answer model learned of a corpus and how much of today's corpus that is
(sourcegate/pipelines/retrieval/learned_corpus.py), on hand-made chunk tables."""

import json

import pyarrow as pa
import pyarrow.parquet as pq

from sourcegate.pipelines.retrieval import learned_corpus as lc


def chunks(path, rows: list[tuple[str, str, int, str]]):
    table = pa.Table.from_pylist(
        [{"doc_id": d, "section_id": s, "ordinal": o, "text": t} for d, s, o, t in rows],
    )
    pq.write_table(table, path)
    return path


YESTERDAY = [("fares", "day-passes", 0, "A day pass costs 5."), ("fares", "night", 0, "Night fares are 3.")]
YESTERDAY += [("bikes", "", 0, "Bikes ride free."), ("bikes", "", 1, "Two bikes per bus.")]


def test_a_model_learned_all_of_the_corpus_it_trained_on(tmp_path):
    learned = lc.record(chunks(tmp_path / "c.parquet", YESTERDAY), "r1")
    assert sorted(learned["sections"]) == ["bikes", "fares#day-passes", "fares#night"]  # as labels and sections.tsv
    share = lc.share(learned, *lc.content_hashes(tmp_path / "c.parquet"))
    assert share["sections"] == share["chunks"] == 1.0 and share["new_sections"] == share["changed_sections"] == 0


def test_new_and_changed_sections_lower_the_share_and_are_named(tmp_path):
    learned = lc.record(chunks(tmp_path / "y.parquet", YESTERDAY), "r1")
    today = [*YESTERDAY[:1], ("fares", "night", 0, "Night fares are 4."), *YESTERDAY[2:]]
    today += [("ferry", "", 0, "The ferry leaves hourly.")]
    share = lc.share(learned, *lc.content_hashes(chunks(tmp_path / "t.parquet", today)))
    assert share["n_sections"] == 4 and share["sections"] == 0.5  # day-passes and bikes unchanged
    assert share["chunks"] == 0.6  # 3 of 5 chunk texts seen
    assert share["new_examples"] == ["ferry"] and share["changed_examples"] == ["fares#night"]
    assert share["learned_version"] == "r1"


def test_a_record_that_named_an_article_without_sections_doc_hash_still_counts_it_as_seen(tmp_path):
    learned = lc.record(chunks(tmp_path / "y.parquet", YESTERDAY), "r1")
    learned["sections"] = {(k if "#" in k else k + "#"): h for k, h in learned["sections"].items()}  # the old keys
    share = lc.share(learned, *lc.content_hashes(tmp_path / "y.parquet"))
    assert share["sections"] == 1.0 and share["new_examples"] == []


def test_measure_tells_a_generic_model_from_a_corpus_model_and_one_that_records_nothing(tmp_path):
    today = chunks(tmp_path / "t.parquet", YESTERDAY)
    generic = tmp_path / "squad"
    generic.mkdir()
    (generic / "recipe.json").write_text(json.dumps({"command": "sourcegate train-answerability --data x"}))
    assert lc.measure(generic, today, 0.9) == {"scope": "generic", "path": str(generic)}

    unrecorded = tmp_path / "old"
    (unrecorded / "seed-13").mkdir(parents=True)
    (unrecorded / "ensemble.json").write_text(json.dumps({"members": ["seed-13"]}))
    (unrecorded / "seed-13" / "recipe.json").write_text(json.dumps({"command": "sourcegate train-in-domain --x"}))
    old = lc.measure(unrecorded, today, 0.9)
    assert old["scope"] == "corpus" and old["share"] is None and not old["enough"]
    assert "records no corpus it learned" in old["why"]

    lc.write(unrecorded, lc.record(today, "r1"))
    bound = lc.measure(unrecorded, today, 0.9)
    assert bound["enough"] and bound["share"]["sections"] == 1.0
    other = lc.measure(unrecorded, chunks(tmp_path / "o.parquet", [("scifact", "", 0, "Aspirin lowers risk.")]), 0.9)
    assert not other["enough"] and other["share"]["sections"] == 0.0 and "learned 0%" in other["why"]
