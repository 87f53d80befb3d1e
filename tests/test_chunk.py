import pyarrow.parquet as pq

from pipelines import models
from pipelines.chunk import chunk_documents, slug, split_sections, windows
from pipelines.ingest import ingest
from tests.conftest import DEMO


def tok():
    return models.tokenizer(str(models.embedding_model_path()))


def test_slug_rule():
    assert slug("Reduced fares: seniors & students") == "reduced-fares-seniors-students"
    assert slug("  Night Owl  (after 1 a.m.) ") == "night-owl-after-1-a-m"


def test_sections_are_split_on_headings_with_the_lead_first():
    body = "Summary paragraph.\n\n## Fares\nTwo dollars.\n\n## Passes\nMonthly pass.\n\n## Empty\n"
    assert split_sections(body, "markdown") == [
        ("", "Summary paragraph."),
        ("Fares", "Two dollars."),
        ("Passes", "Monthly pass."),
    ]
    assert split_sections("plain text", "plain") == [("", "plain text")]


def test_every_demo_chunk_is_title_plus_section_plus_body(tmp_path):
    result = ingest(DEMO, tmp_path)
    rows = chunk_documents(result.documents, tok())
    docs = {d["doc_id"]: d for d in pq.read_table(result.documents).to_pylist()}
    assert len(docs) >= 40
    for r in rows:
        assert r["body"].strip(), r["chunk_id"]
        assert r["text"].startswith(r["title"]) and r["body"] in r["text"]
        assert r["body"] in docs[r["doc_id"]]["body"]  # bodies, not just titles, are embedded
        assert len(tok().encode(r["text"]).ids) <= 256
    sectioned = [r for r in rows if r["section"]]
    assert len({r["doc_id"] for r in sectioned}) == len(docs)
    assert all(f"\n{r['section']}\n" in r["text"] for r in sectioned)


def test_long_sections_split_within_budget_with_overlap():
    t = tok()
    body = " ".join(f"word{i} is followed by more words." for i in range(300))
    pieces = windows(body, t, budget=60, overlap=10)
    assert len(pieces) > 5
    assert all(len(t.encode(p, add_special_tokens=False).ids) <= 60 for p in pieces)
    for a, b in zip(pieces, pieces[1:]):
        assert a.split()[-1].strip(".") in [w.strip(".") for w in b.split()[:15]]  # consecutive windows overlap
    assert pieces[0].split()[0] == "word0" and pieces[-1].endswith("more words.")


def test_chunk_ids_are_stable_and_unique(tmp_path):
    result = ingest(DEMO, tmp_path)
    a = chunk_documents(result.documents, tok())
    b = chunk_documents(result.documents, tok())
    assert [r["chunk_id"] for r in a] == [r["chunk_id"] for r in b]
    assert len({r["chunk_id"] for r in a}) == len(a)


def test_nightly_chunking_redoes_only_changed_documents(make_cfg, small_corpus):
    from pipelines import steps
    from pipelines.io import read_json

    def night(cfg, run_id):
        steps.ingest_step(cfg, run_id)
        steps.chunk_step(cfg, run_id)
        (steps.run_dir(cfg, run_id) / "chunks.parquet").touch()  # what makes a run a chunk baseline
        folder = steps.run_dir(cfg, run_id)
        return folder, read_json(folder / "run.json")["counts"]

    cfg = make_cfg(**{"corpus.path": str(small_corpus)})
    _, first = night(cfg, "r1")
    assert first["documents_rechunked"] == 6
    edited = sorted(small_corpus.glob("*.md"))[2]
    edited.write_text(edited.read_text() + "\nOne more sentence at the end.\n")
    folder, second = night(cfg, "r2")
    assert second["documents_rechunked"] == 1
    # what was reused is exactly what chunking everything afresh gives
    fresh = chunk_documents(folder / "documents.parquet", tok(), max_tokens=256, overlap=32)
    assert pq.read_table(folder / "chunks.text.parquet").to_pylist() == fresh
    assert any(r["doc_id"] == edited.stem and "One more sentence" in r["text"] for r in fresh)

    smaller = make_cfg(**{"corpus.path": str(small_corpus), "chunking.max_tokens": 128})
    smaller["artifacts"] = cfg["artifacts"]
    _, third = night(smaller, "r3")
    assert third["documents_rechunked"] == 6  # new settings: nothing is reused
