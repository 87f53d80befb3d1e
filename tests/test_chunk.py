import json
import re
import shutil

import pyarrow.parquet as pq
import pytest

from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines import models
from sourcegate.pipelines.build.chunk import (
    MAX_CHARS_PER_TOKEN,
    Degenerate,
    chunk_documents,
    cut,
    section_ids,
    slug,
    split_sections,
)
from sourcegate.pipelines.build.ingest import ingest
from tests.conftest import DATA, DEMO


def tok():
    return models.tokenizer(str(models.embedding_model_path()))


def cut_pieces(body: str, t, budget: int, overlap: int) -> list[str]:
    """The chunker's cut of one section body, with its default character bound."""
    return [piece for piece, _ in cut(body, t, budget, overlap, budget * MAX_CHARS_PER_TOKEN)]


def test_slug_rule():
    assert slug("Reduced fares: seniors & students") == "reduced-fares-seniors-students"
    assert slug("  Night Owl  (after 1 a.m.) ") == "night-owl-after-1-a-m"
    assert slug("Über uns") == "über-uns" and slug("Ça va_bien") == "ça-va-bien"
    assert slug("料金 と 定期券") == "料金-と-定期券" and slug("Straße") == "strasse" and slug("—?!") == ""


def test_an_ascii_heading_keeps_the_section_id_it_always_had():
    headings = [h for p in DEMO.rglob("*.md") for h in re.findall(r"(?m)^#{2,6} (.+)$", p.read_text("utf-8"))]
    assert len(headings) > 100 and all(h.isascii() for h in headings)
    assert [slug(h) for h in headings] == [re.sub(r"[^a-z0-9]+", "-", h.lower()).strip("-") for h in headings]


def test_every_section_of_a_document_has_its_own_id_and_chunk_ids(tmp_path):
    body = "Lead.\n\n## Holidays\nClosed.\n\n## 祝日\n休館。\n\n## Holidays\nClosed.\n\n## ???\nAsk.\n\n## Holidays 2\nOpen."
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "hours.md").write_text("# Hours\n\n" + body, encoding="utf-8")
    rows = chunk_documents(ingest(tmp_path / "corpus", tmp_path / "work").documents, tok())
    ids = [r["section_id"] for r in rows]
    assert ids == ["", "holidays", "祝日", "holidays-2", "section", "holidays-2-2"]
    assert rows[1]["text"] == rows[3]["text"] and len({r["chunk_id"] for r in rows}) == len(rows)
    assert section_ids(["A", "a", "A-2"]) == ["a", "a-2", "a-2-2"]


def test_sections_are_split_on_headings_with_the_lead_first():
    body = "Summary paragraph.\n\n## Fares\nTwo dollars.\n\n## Passes\nMonthly pass.\n\n## Empty\n"
    assert split_sections(body, "markdown") == [
        ("", "Summary paragraph."),
        ("Fares", "Two dollars."),
        ("Passes", "Monthly pass."),
    ]
    assert split_sections("plain text", "plain") == [("", "plain text")]


def test_sections_follow_commonmark_headings_and_never_split_a_code_block():
    body = (
        "Lead.\n\n## Linux\nRun:\n\n```bash\n## a shell comment, not a heading\nmake\n```\n\n"
        "~~~~\n## still code\n~~~\n## and still code\n~~~~\n\n"
        "Setext section\n---\nUnder it.\n\n- a list item\n---\n\n   ### Indented three ###\nBody.\n\n"
        "## Learn C#\nSharp.\n\n    ## indented four is code\n"
    )
    assert split_sections(body, "markdown") == [
        ("", "Lead."),
        ("Linux", "Run:\n\n```bash\n## a shell comment, not a heading\nmake\n```\n\n"
         "~~~~\n## still code\n~~~\n## and still code\n~~~~"),
        ("Setext section", "Under it.\n\n- a list item\n---"),
        ("Indented three", "Body."),
        ("Learn C#", "Sharp.\n\n    ## indented four is code"),
    ]  # fmt: skip


def test_a_windows_file_reads_as_a_unix_one(tmp_path):
    text = "---\ntitle: Fares\n---\n\nLead.\n\n## Day passes ##\nFive dollars.\n\n## Night\nThree.\n"
    for name, data in (("unix", text), ("windows", text.replace("\n", "\r\n")), ("mac", text.replace("\n", "\r"))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "fares.md").write_text(data, encoding="utf-8", newline="")
    rows = {
        n: chunk_documents(ingest(tmp_path / n, tmp_path / f"{n}-work").documents, tok())
        for n in ("unix", "windows", "mac")
    }
    assert rows["unix"] == rows["windows"] == rows["mac"]
    assert [r["text"] for r in rows["unix"]] == [
        "Fares\nLead.",
        "Fares\nDay passes\nFive dollars.",
        "Fares\nNight\nThree.",
    ]


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
    pieces = cut_pieces(body, t, budget=60, overlap=10)
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
    from sourcegate.artifact_io import read_json
    from sourcegate.pipelines.app import steps

    def night(cfg, run_id):
        steps.ingest_step(RunFolder(cfg.artifacts, run_id), cfg)
        steps.chunk_step(RunFolder(cfg.artifacts, run_id), cfg.chunking, cfg.embedding)
        (RunFolder(cfg.artifacts, run_id).path / "chunks.parquet").touch()  # what makes a run a chunk baseline
        folder = RunFolder(cfg.artifacts, run_id).path
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

    smaller = make_cfg(**{"corpus.path": str(small_corpus), "chunking.max_tokens": 128, "artifacts": cfg.artifacts})
    _, third = night(smaller, "r3")
    assert third["documents_rechunked"] == 6  # new settings: nothing is reused


def test_a_word_longer_than_the_budget_is_hard_split_within_it():
    t = tok()
    body = "Before the run. " + "ab" * 50 + " after the run."  # one 100-character word of 50 tokens
    pieces = cut_pieces(body, t, budget=20, overlap=5)
    assert all(len(t.encode(p, add_special_tokens=False).ids) <= 20 for p in pieces)
    assert "".join(p.replace(" ", "") for p in pieces).count("ab") >= 50  # nothing of the word is lost
    assert len(pieces) < 12  # cut into budget-sized runs, not slid one token at a time


def test_a_single_over_long_token_is_hard_split_by_characters():
    t = tok()
    body = "x" * 10_000  # WordPiece makes any word over 100 characters one [UNK]: 1 token, 10,000 characters
    assert len(t.encode(body, add_special_tokens=False).ids) == 1
    pieces = cut(body, t, 64, 8, 1000)
    assert all(len(p) <= 1000 and hard for p, hard in pieces)
    assert "".join(p for p, _ in pieces) == body


def _bad_corpus_chunks(tmp_path, **settings):
    result = ingest(DATA / "bad_corpus", tmp_path)
    rejected = []
    rows = chunk_documents(result.documents, tok(), rejected=rejected, **settings)
    return rows, {r["source"]: r for r in rejected}


def test_a_150kb_single_token_document_is_quarantined_as_degenerate(tmp_path):
    rows, rejected = _bad_corpus_chunks(tmp_path)
    assert rejected["one-long-token.md"] == {
        "source": "one-long-token.md",
        "doc_id": "one-long-token",
        "reason": "degenerate document: over-long token runs need 64 hard-split pieces (chunking.max_split_pieces is 32)",
    }
    assert not [r for r in rows if r["doc_id"] == "one-long-token"]
    with pytest.raises(Degenerate):  # without a list to put it in, a degenerate document is an error, not a drop
        chunk_documents(ingest(DATA / "bad_corpus", tmp_path / "again").documents, tok())


def test_a_long_token_run_within_the_piece_bound_is_chunked_within_the_budget(tmp_path):
    rows, rejected = _bad_corpus_chunks(tmp_path, max_split_pieces=100)
    long = [r for r in rows if r["doc_id"] == "one-long-token"]
    assert "one-long-token.md" not in rejected and len(long) == 64
    assert max(len(r["text"]) for r in rows) <= 256 * MAX_CHARS_PER_TOKEN
    assert all(len(tok().encode(r["text"]).ids) <= 256 for r in rows)
    again, _ = _bad_corpus_chunks(tmp_path / "again", max_split_pieces=100)
    assert [r["chunk_id"] for r in again] == [r["chunk_id"] for r in rows]  # still deterministic
    assert len({r["chunk_id"] for r in rows}) == len(rows)


def test_a_title_longer_than_the_budget_is_quarantined_as_degenerate(tmp_path):
    _, rejected = _bad_corpus_chunks(tmp_path)
    assert rejected["huge-title.md"]["reason"].startswith("degenerate document: title and heading take 500 tokens")


def test_a_chunk_budget_past_what_the_embedding_model_reads_is_said(make_cfg, small_corpus, caplog):
    from sourcegate.pipelines.app import steps

    cfg = make_cfg(**{"corpus.path": str(small_corpus), "chunking.max_tokens": 512})  # BM25 and rerank read 512
    steps.ingest_step(RunFolder(cfg.artifacts, "r1"), cfg)
    assert steps.chunk_step(RunFolder(cfg.artifacts, "r1"), cfg.chunking, cfg.embedding) > 0
    assert "chunking.max_tokens 512 is more than the embedding model reads of a text (256 tokens)" in caplog.text


def test_chunk_step_quarantines_degenerate_documents_and_counts_them(make_cfg, small_corpus):
    from sourcegate.artifact_io import read_json
    from sourcegate.pipelines.app import steps

    shutil.copy(DATA / "bad_corpus" / "one-long-token.md", small_corpus)
    cfg = make_cfg(**{"corpus.path": str(small_corpus)})
    steps.ingest_step(RunFolder(cfg.artifacts, "r1"), cfg)
    steps.chunk_step(RunFolder(cfg.artifacts, "r1"), cfg.chunking, cfg.embedding)
    steps.chunk_step(
        RunFolder(cfg.artifacts, "r1"), cfg.chunking, cfg.embedding
    )  # a retried step rewrites its own quarantine rows, never duplicates them
    folder = RunFolder(cfg.artifacts, "r1").path
    rows = [json.loads(line) for line in (folder / "quarantine.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["doc_id"]) for r in rows] == [("chunk", "one-long-token")]
    assert read_json(folder / "run.json")["quarantine"] == {
        "total": 1,
        "by_stage": {"chunk": 1},
        "by_reason": {"degenerate document": 1},
    }
    chunked = pq.read_table(folder / "chunks.text.parquet", columns=["doc_id"])["doc_id"].to_pylist()
    assert "one-long-token" not in chunked and len(set(chunked)) == 6


def test_the_chunker_key_names_the_tokenizer_library_and_the_unicode_tables(monkeypatch):
    """Chunk rows are reused from a night with the same key: a worker with another tokenizers release or Unicode
    database (slugs' NFKC, word splits) could cut otherwise, so its key differs and it chunks again."""
    import unicodedata

    import tokenizers

    from sourcegate.pipelines.build.chunk import chunker_key

    tokenizer_file = models.embedding_model_path() / "tokenizer.json"
    key = chunker_key(tokenizer_file, 256, 32)
    assert chunker_key(tokenizer_file, 256, 32) == key  # a function of its inputs
    monkeypatch.setattr(tokenizers, "__version__", "0.0.1")
    other_library = chunker_key(tokenizer_file, 256, 32)
    monkeypatch.setattr(unicodedata, "unidata_version", "9.0.0")
    assert len({key, other_library, chunker_key(tokenizer_file, 256, 32)}) == 3
