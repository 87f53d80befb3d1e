import json
import shutil

import pyarrow.parquet as pq

from pipelines.ingest import ingest
from tests.conftest import DATA, DEMO, SCIFACT


def _quarantine(result):
    return [json.loads(line) for line in result.quarantine.read_text().splitlines()]


def test_bad_markdown_is_quarantined_with_a_reason_and_counted(tmp_path):
    result = ingest(DATA / "bad_corpus", tmp_path, max_doc_bytes=2000)
    docs = pq.read_table(result.documents).to_pylist()
    assert [d["doc_id"] for d in docs] == ["good-article", "shared-id"]
    reasons = {q["source"]: q["reason"] for q in _quarantine(result)}
    assert reasons["empty-body.md"] == "empty body"
    assert reasons["invalid-utf8.md"].startswith("invalid UTF-8")
    assert reasons["binary-content.md"].startswith("binary file")
    assert reasons["photo.png"].startswith("binary file")
    assert reasons["oversized.md"].startswith("over size cap")
    assert reasons["bad-front-matter.md"].startswith("malformed front matter")
    assert reasons["unclosed-front-matter.md"].startswith("malformed front matter")
    assert reasons["no-title.md"].startswith("missing title")
    assert reasons["dup-b.md"].startswith("duplicate id 'shared-id'")
    # nothing silently dropped: every file is either a document or quarantined
    files = sorted(p.name for p in (DATA / "bad_corpus").iterdir())
    assert len(files) == len(docs) + len(reasons)
    assert result.counts["quarantined"] == 9 and result.counts["documents"] == 2


def test_bad_beir_lines_are_quarantined(tmp_path):
    result = ingest(DATA / "bad_beir", tmp_path, fmt="beir")
    assert [d["doc_id"] for d in pq.read_table(result.documents).to_pylist()] == ["d1", "d2"]
    reasons = {q["source"]: q["reason"] for q in _quarantine(result)}
    assert reasons == {
        "corpus.jsonl:3": "malformed JSON: Expecting ',' delimiter",
        "corpus.jsonl:4": "missing _id",
        "corpus.jsonl:5": "empty body",
        "corpus.jsonl:6": "duplicate id 'd1' (first occurrence kept)",
        "corpus.jsonl:7": "invalid UTF-8: byte 48",
    }


def test_scifact_ingests_as_is(tmp_path):
    result = ingest(SCIFACT, tmp_path, fmt="beir", max_doc_bytes=1_000_000)
    assert result.counts["documents"] == 5183 and result.counts["quarantined"] == 0


def test_manifest_reports_added_changed_deleted_unchanged(tmp_path, small_corpus):
    first = ingest(small_corpus, tmp_path / "r1")
    assert first.counts["added"] == 6
    files = sorted(small_corpus.glob("*.md"))
    files[0].write_text(files[0].read_text() + "\nOne more sentence about fares.\n")
    files[1].unlink()
    shutil.copy(DEMO / sorted(p.name for p in DEMO.glob("*.md"))[10], small_corpus)
    second = ingest(small_corpus, tmp_path / "r2", previous_documents=first.documents)
    c = second.counts
    assert (c["added"], c["changed"], c["deleted"], c["unchanged"]) == (1, 1, 1, 4)
    manifest = {r["doc_id"]: r["status"] for r in pq.read_table(second.manifest).to_pylist()}
    assert manifest[files[1].stem] == "deleted"
    assert files[1].stem not in {d["doc_id"] for d in pq.read_table(second.documents).to_pylist()}


def test_ids_and_hashes_are_stable(tmp_path, small_corpus):
    a = pq.read_table(ingest(small_corpus, tmp_path / "a").documents).to_pylist()
    b = pq.read_table(ingest(small_corpus, tmp_path / "b").documents).to_pylist()
    assert [(d["doc_id"], d["content_hash"]) for d in a] == [(d["doc_id"], d["content_hash"]) for d in b]
