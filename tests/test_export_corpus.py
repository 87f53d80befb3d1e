"""A corpus exported the way wikis and help centres export: every ordinary file is read whole.

tests/data/wiki_export has nested folders, names with spaces, accents, brackets, '&', '#' and '+',
Markdown without a front-matter title or an H1, and HTML pages with navigation, scripts, styles, a
form, an aside and a footer, one of them malformed (unclosed paragraphs and script).
"""

import json

import pyarrow.parquet as pq
import pytest

from sourcegate.pipelines import models
from sourcegate.pipelines.app.cli import main
from sourcegate.pipelines.build.chunk import chunk_documents
from sourcegate.pipelines.build.ingest import ingest
from tests.conftest import DATA

EXPORT = DATA / "wiki_export"
# doc id -> (title, title_source), as docs/ingest.md says they are made
EXPECTED = {
    "About_this_export": ("About this export", "heading"),
    "Archive:2023_(old):lost_+_found_items": ("Lost + found items", "file_name"),
    "Fares:Night_fares": ("Night fares", "html_title"),
    "Fares:fares-and-passes": ("Fares and passes", "heading"),
    "Getting_Started:Café_+26_Bar_+5Bdraft+5D": ("Café car on the commuter rail", "heading"),
    "Getting_Started:First_ride": ("Your first ride", "front_matter"),
    "Getting_Started:weird_name_ü": ("Weird name ü", "file_name"),
    "Help_Centre_(FAQ):Q+26A_+2312": ("Can I bring a kayak on the train?", "heading"),
    "Réseau:Plan_du_réseau": ("Plan du réseau", "file_name"),
}
# Words that appear only in the pages' boilerplate (navigation, scripts, styles, forms, asides, footers).
BOILERPLATE = ["NAVTOKEN", "SCRIPTTOKEN", "STYLETOKEN", "HEADERTOKEN", "BREADCRUMBTOKEN", "ASIDETOKEN"]
BOILERPLATE += ["FORMTOKEN", "FOOTERTOKEN", "NOSCRIPTTOKEN", "trackSection", "dataLayer", "Privacy"]


def _files() -> list[str]:
    return sorted(p.relative_to(EXPORT).as_posix() for p in EXPORT.rglob("*") if p.is_file())


def test_every_exported_file_is_a_document_with_its_id_and_title(tmp_path):
    result = ingest(EXPORT, tmp_path)
    docs = pq.read_table(result.documents).to_pylist()
    assert {d["doc_id"]: (d["title"], d["title_source"]) for d in docs} == EXPECTED
    assert sorted(d["source"] for d in docs) == _files()
    assert result.counts["quarantined"] == 0 and result.quarantine.read_text() == ""


def test_exported_pages_are_cut_at_their_headings_and_no_boilerplate_reaches_a_chunk(tmp_path):
    chunks = chunk_documents(ingest(EXPORT, tmp_path).documents, models.tokenizer(str(models.embedding_model_path())))
    sections = {}
    for c in chunks:
        sections.setdefault(c["doc_id"], []).append(c["section"])
    assert sections["Fares:fares-and-passes"] == ["", "Day passes", "Weekend passes", "Monthly passes"]
    assert sections["Fares:Night_fares"] == ["", "Paying at night"]
    assert sections["Getting_Started:weird_name_ü"] == ["", "Umlauts in stop names", "Where to ask"]
    assert set(sections) == set(EXPECTED)
    assert not [(c["doc_id"], word) for c in chunks for word in BOILERPLATE if word in c["text"]]
    night = next(c for c in chunks if c["doc_id"] == "Fares:Night_fares" and c["section"] == "Paying at night")
    assert "exact change only" in night["text"] and "Single ride | two dollars" in night["text"]


@pytest.mark.models
def test_a_night_on_the_export_indexes_every_ordinary_file(tmp_path, capsys):
    evals = DATA / "wiki_export_evals"  # questions in riders' words, labels naming the mapped ids
    overrides = [
        f"evals.calibration_set={evals / 'calibration.jsonl'}",
        f"evals.precision_set={evals / 'precision.jsonl'}",
        "evals.check_set=null",  # the demo's check set names the demo's articles; this corpus has none yet
    ]
    overrides.append("evals.baseline=null")  # a new corpus has none accepted yet
    overrides.append("calibration.min_per_label=4")  # its sets are small: 6 should-answer, 4 off-topic
    artifacts, run_id = tmp_path / "artifacts", "20261201-030000"
    argv = [a for o in overrides for a in ("--set", o)]
    code = main([*argv, "run", "--corpus", str(EXPORT), "--artifacts", str(artifacts), "--run-id", run_id, "--quiet"])
    out = capsys.readouterr().out
    run = artifacts / "runs" / run_id
    info = json.loads((run / "run.json").read_text())
    assert info["counts"]["ingest"]["documents"] == len(_files()) == len(EXPECTED)
    assert info["quarantine"]["total"] == 0, (run / "quarantine.jsonl").read_text()
    assert info["counts"]["indexed"] == info["counts"]["chunks"] > 0
    indexed = set(pq.read_table(run / "chunks.parquet", columns=["doc_id"])["doc_id"].to_pylist())
    assert indexed == set(EXPECTED)
    # Judged to the end (the pre-flight check found every label in the index); with no check set yet the gate
    # fails (exit 1, not 2) and nothing is promoted.
    gate = json.loads((run / "gate.json").read_text())
    assert not [r for r in gate["reasons"] if "not in the corpus" in r]
    assert code == 1 and "No check set was evaluated" in out and not (artifacts / "LIVE").exists()
