import builtins
import json
import os
import shutil

import pyarrow.parquet as pq
import pytest

from sourcegate.pipelines.build.ingest import Rejected, ingest, safe_id
from tests.conftest import DATA, DEMO, SCIFACT


def _quarantine(result):
    return [json.loads(line) for line in result.quarantine.read_text().splitlines()]


def test_bad_markdown_is_quarantined_with_a_reason_and_counted(tmp_path):
    result = ingest(DATA / "bad_corpus", tmp_path, max_doc_bytes=2000)
    docs = pq.read_table(result.documents).to_pylist()
    assert [d["doc_id"] for d in docs] == ["good-article"]
    reasons = {q["source"]: q["reason"] for q in _quarantine(result)}
    assert reasons["empty-body.md"] == "empty body"
    assert reasons["invalid-utf8.md"].startswith("invalid UTF-8")
    assert reasons["binary-content.md"].startswith("binary file")
    assert reasons["photo.png"].startswith("binary file")
    assert reasons["oversized.md"].startswith("over size cap")
    assert reasons["bad-front-matter.md"].startswith("malformed front matter")
    assert reasons["unclosed-front-matter.md"].startswith("malformed front matter")
    # two files of one id: neither is served, each names the other
    assert reasons["dup-a.md"] == "duplicate id: 'shared-id' (also the id of 'dup-b.md'; none of them kept)"
    assert reasons["dup-b.md"] == "duplicate id: 'shared-id' (also the id of 'dup-a.md'; none of them kept)"
    # nothing silently dropped: every file is either a document or quarantined
    files = sorted(p.name for p in (DATA / "bad_corpus").iterdir())
    assert len(files) == len(docs) + len(reasons)
    assert result.counts["quarantined"] == len(files) - 1 and result.counts["documents"] == 1
    assert all(q["stage"] == "ingest" for q in _quarantine(result))


def _bad_corpus_reasons(tmp_path):
    return {q["source"]: q["reason"] for q in _quarantine(ingest(DATA / "bad_corpus", tmp_path, max_doc_bytes=2000))}


def test_an_id_with_the_section_separator_is_quarantined_naming_it(tmp_path):
    assert (
        _bad_corpus_reasons(tmp_path)["hash-in-id.md"] == "unsafe id: 'fares#night': character '#' at 5 is not allowed"
    )


def test_an_id_with_a_control_character_is_quarantined_escaped(tmp_path):
    reason = _bad_corpus_reasons(tmp_path)["control-char-id.md"]
    assert reason == "unsafe id: 'bell\\x07id': character '\\x07' at 4 is not allowed"
    assert "\x07" not in reason  # escaped, never the raw character


def test_ids_with_path_separators_or_leading_dots_or_over_long_are_unsafe():
    for bad in ("a/b", "a\\b", "..", ".hidden", "-x", "x" * 201, "tab\tid", ""):
        with pytest.raises(Rejected, match="unsafe id"):
            safe_id(bad)
    for good in ("MED-10", "4983", "Washington,_D.C.", "Zürich_(city)", "guides:fares", "x" * 200):
        assert safe_id(good) == good


def test_nested_files_get_ids_without_path_separators(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "guides").mkdir(parents=True)
    (corpus / "guides" / "fares.md").write_text("# Fares\n\nTwo dollars a ride.\n")
    docs = pq.read_table(ingest(corpus, tmp_path / "out").documents).to_pylist()
    assert [d["doc_id"] for d in docs] == ["guides:fares"]


def test_a_title_line_loses_only_a_closing_run_of_hashes(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, title in (("csharp", "# Learn C#"), ("closed", "# Fares ##"), ("tight", "# Fares##")):
        (corpus / f"{name}.md").write_text(f"{title}\n\nTwo dollars a ride.\n")
    docs = {d["doc_id"]: d["title"] for d in pq.read_table(ingest(corpus, tmp_path / "out").documents).to_pylist()}
    assert docs == {"csharp": "Learn C#", "closed": "Fares", "tight": "Fares##"}  # CommonMark: a space before it


def test_a_setext_title_is_the_title_and_not_part_of_the_lead(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "hours.md").write_text("Library Hours\n=============\n\nOpen at 9.\n\nWeekends\n--------\n\nAt 10.\n")
    (corpus / "plain.md").write_text("Open at 9.\n\na = b\n")  # no underline: no title, named from the file
    docs = {d["doc_id"]: d for d in pq.read_table(ingest(corpus, tmp_path / "out").documents).to_pylist()}
    assert (docs["hours"]["title"], docs["hours"]["title_source"]) == ("Library Hours", "heading")
    assert docs["hours"]["body"] == "Open at 9.\n\nWeekends\n--------\n\nAt 10."  # its sections as before
    assert (docs["plain"]["title"], docs["plain"]["title_source"]) == ("Plain", "file_name")


def test_a_title_that_is_not_a_string_is_quarantined_not_stringified(tmp_path):
    reasons = _bad_corpus_reasons(tmp_path)
    assert reasons["list-title.md"] == "title is not a string: YAML list ['Fares', 'Passes'] (quote it)"
    assert reasons["mapping-title.md"] == "title is not a string: YAML dict {'name': 'Fares'} (quote it)"
    assert reasons["number-title.md"] == "title is not a string: YAML int 2026 (quote it)"


def test_invalid_unicode_in_markdown_is_quarantined(tmp_path):
    reasons = _bad_corpus_reasons(tmp_path)
    assert reasons["surrogate-title.md"] == "invalid Unicode: lone surrogate U+D800 in title at character 7"
    assert reasons["noncharacter.md"].startswith("invalid Unicode: noncharacter U+FFFE in body")


def test_text_is_nfc_normalised_before_hashing(tmp_path):
    composed, decomposed = tmp_path / "nfc", tmp_path / "nfd"
    for folder, word in ((composed, "caf\u00e9"), (decomposed, "cafe\u0301")):
        folder.mkdir()
        (folder / "menu.md").write_text(f"# {word}\n\nThe {word} opens at six.\n", encoding="utf-8")
    a, b = (
        pq.read_table(ingest(f, tmp_path / f"out-{f.name}").documents).to_pylist()[0] for f in (composed, decomposed)
    )
    assert b["title"] == "caf\u00e9" and "caf\u00e9 opens" in b["body"]
    assert a["content_hash"] == b["content_hash"]


def test_a_symlink_inside_the_root_is_quarantined_and_its_target_read_once(tmp_path):
    reasons = _bad_corpus_reasons(tmp_path)
    assert reasons["alias-of-good.md"].startswith("symlink inside the corpus root: not followed")
    assert "good-article.md" not in reasons


def test_symlinks_out_of_the_root_are_quarantined_and_never_opened(tmp_path, monkeypatch):
    # Links out of the tree are made here, not committed: a clone, copy or tarball of the repo
    # should never carry a pointer to /etc/passwd. The inside-root link is in tests/data/bad_corpus.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("# Secret\n\nTOPSECRET text that must never be indexed.\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "fine.md").write_text("# Fine\n\nAn ordinary article.\n")
    (corpus / "passwd.md").symlink_to("/etc/passwd")
    (corpus / "secret.md").symlink_to(outside / "secret.md")
    (corpus / "folder").symlink_to(outside, target_is_directory=True)
    (corpus / "up").symlink_to("..", target_is_directory=True)  # traversal through a folder link
    opened = []
    real_os_open, real_open = os.open, builtins.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: opened.append(str(p)) or real_os_open(p, *a, **k))
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: opened.append(str(p)) or real_open(p, *a, **k))
    result = ingest(corpus, tmp_path / "out")
    monkeypatch.undo()
    reasons = {q["source"]: q["reason"] for q in _quarantine(result)}
    assert reasons == {
        "passwd.md": "symlink outside the corpus root: not read (points to '/etc/passwd')",
        "secret.md": f"symlink outside the corpus root: not read (points to {str(outside / 'secret.md')!r})",
        "folder": f"symlink outside the corpus root: not read (points to {str(outside)!r})",
        "up": f"symlink outside the corpus root: not read (points to {str(tmp_path)!r})",
    }
    assert not [p for p in opened if "passwd" in p or str(outside) in p or p.startswith(str(corpus / "folder"))]
    docs = pq.read_table(result.documents).to_pylist()
    assert [d["doc_id"] for d in docs] == ["fine"]
    assert result.counts["quarantine_reasons"] == {"symlink outside the corpus root": 4}


def test_bad_beir_lines_are_quarantined(tmp_path):
    result = ingest(DATA / "bad_beir", tmp_path, fmt="beir")
    # an id a document id may not be is mapped, as a file name is (doc_ids.id_from_beir; qrels map the same way)
    assert [d["doc_id"] for d in pq.read_table(result.documents).to_pylist()] == [
        "_..+2Fd8",
        "d1",
        "d2",
        "d7+23methods",
    ]
    reasons = {q["source"]: q["reason"] for q in _quarantine(result)}
    assert reasons == {
        "corpus.jsonl:3": "malformed JSON: Expecting ',' delimiter",
        "corpus.jsonl:4": "missing _id",
        "corpus.jsonl:5": "empty body",
        "corpus.jsonl:6": "duplicate id: 'd1' (first occurrence kept)",
        "corpus.jsonl:7": "invalid UTF-8: byte 48",
        "corpus.jsonl:8": "invalid Unicode: lone surrogate U+D800 in body at character 7",
        "corpus.jsonl:11": "title is not a string: JSON list ['a', 'b']",
        "corpus.jsonl:12": "invalid Unicode: NUL U+0000 in body at character 4",
        "corpus.jsonl:13": "_id is not a string: JSON list ['d11']",
        "corpus.jsonl:14": "unsafe id: _id holds a control character U+0007 at character 3",
    }
    kinds = result.counts["quarantine_reasons"]  # the kind of a reason never carries the id
    assert kinds["unsafe id"] == 1 and kinds["duplicate id"] == 1 and kinds["invalid Unicode"] == 2


@pytest.mark.dataset
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


def every_file_under(root) -> int:
    """What a data engineer counts with `find root -type f -o -type l`."""
    return sum(
        len(files) + sum(os.path.islink(os.path.join(here, d)) for d in dirs) for here, dirs, files in os.walk(root)
    )


def test_every_file_is_a_document_quarantined_or_skipped_with_a_reason(tmp_path):
    """N files in: documents + quarantined + skipped == N. A page named `..md` or `.faq.md` is an article (its
    suffix says so) and is ingested; a hidden folder (.git) and a hidden tool file (.DS_Store) are skipped, named,
    with the number of files they hold."""
    corpus = tmp_path / "corpus"
    (corpus / "sub" / ".obsidian").mkdir(parents=True)
    (corpus / ".git" / "objects" / "ab").mkdir(parents=True)
    pages = {"a.md": "# A\n\nAlpha text.", "..md": "# The dot command\n\nRuns a file.", ".faq.md": "Frequently asked."}
    pages |= {"sub/b.html": "<h1>B</h1><p>Beta text.</p>", "sub/c.md": "Gamma text."}
    for name, text in pages.items():
        (corpus / name).write_text(text)
    (corpus / "notes.txt").write_text("not an article")  # quarantined: not a suffix the reader reads
    (corpus / ".DS_Store").write_bytes(b"\x00\x01")
    (corpus / ".gitignore").write_text("*.tmp\n")
    (corpus / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (corpus / ".git" / "objects" / "ab" / "cdef").write_bytes(b"x")
    (corpus / ".git" / "objects" / "ab" / "0123").write_bytes(b"y")
    (corpus / "sub" / ".obsidian" / "workspace.json").write_text("{}")
    n = every_file_under(corpus)
    assert n == 12

    result = ingest(corpus, tmp_path / "out")
    c = result.counts
    assert c["documents"] + c["quarantined"] + c["skipped"] == n
    ids = [d["doc_id"] for d in pq.read_table(result.documents).to_pylist()]
    assert sorted(ids) == sorted(["a", "_.", "_.faq", "sub:b", "sub:c"])
    assert [q["source"] for q in _quarantine(result)] == ["notes.txt"]
    skipped = [json.loads(line) for line in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    assert [(s["source"], s["files"]) for s in skipped] == [
        (".DS_Store", 1),
        (".git/", 3),
        (".gitignore", 1),
        ("sub/.obsidian/", 1),
    ]
    assert c["skipped_reasons"] == {
        "hidden folder: not walked (a tool's files, such as .git, not articles)": 4,
        "hidden file without an article suffix: not read (a tool's file, such as .DS_Store or .gitignore)": 2,
    }


def test_a_corpus_with_nothing_hidden_skips_nothing(tmp_path):
    result = ingest(DEMO, tmp_path)
    assert result.counts["skipped"] == 0 and result.counts["skipped_reasons"] == {}
    assert result.counts["documents"] + result.counts["quarantined"] == every_file_under(DEMO)


def test_a_file_is_no_markdown_corpus(tmp_path):
    article = tmp_path / "refunds.md"
    article.write_text("# Refunds\n\nRefunds take five days.\n")
    with pytest.raises(NotADirectoryError, match="is a file: a corpus is a folder of Markdown or HTML articles"):
        ingest(article, tmp_path / "out")


def test_a_night_on_a_corpus_that_gives_no_document_stops_naming_what_its_files_became(tmp_path, capsys):
    """An unmounted or emptied corpus folder is never indexed: exit 2 at ingest, with run.json's counts and the
    quarantine written first (it used to run on and fail the eval sets' labels, blaming them)."""
    from sourcegate.pipelines.app.cli import main

    corpus = tmp_path / "mounted"
    corpus.mkdir()
    (corpus / "notes.txt").write_text("not an article")
    (corpus / "empty.md").write_text("# Title only\n")
    artifacts = tmp_path / "artifacts"
    code = main(["run", "--corpus", str(corpus), "--artifacts", str(artifacts), "--run-id", "r1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"EmptyCorpus during ingest: {corpus}: no document read: 2 file(s) quarantined, see " in err
    info = json.loads((artifacts / "runs" / "r1" / "run.json").read_text())
    assert info["counts"]["ingest"]["documents"] == 0 and info["quarantine"]["total"] == 2
    assert not (artifacts / "LIVE").exists()
    assert "BEIR" not in err
    (corpus / "corpus.jsonl").write_text('{"_id": "d1", "text": "A document."}\n')  # a BEIR dataset, read as articles
    assert main(["run", "--corpus", str(corpus), "--artifacts", str(artifacts), "--run-id", "r2", "--quiet"]) == 2
    assert "It holds corpus.jsonl: a BEIR dataset is read with corpus.format: beir (--format beir)." in (
        capsys.readouterr().err
    )


def test_a_night_never_writes_inside_the_corpus_it_reads(small_corpus, tmp_path, capsys):
    """Artifacts (or init's --out) inside the corpus folder: the next night would ingest its own reports as
    articles. Refused before anything is read, and init leaves nothing behind."""
    from sourcegate.pipelines.app.cli import main

    with pytest.raises(ValueError, match="is inside the corpus folder"):
        ingest(small_corpus, small_corpus / "artifacts" / "runs" / "r1")
    before = sorted(p.name for p in small_corpus.iterdir())
    assert main(["init", str(small_corpus), "--out", str(small_corpus / "sourcegate")]) == 2
    assert "is inside the corpus folder" in capsys.readouterr().err
    assert sorted(p.name for p in small_corpus.iterdir()) == before


def test_a_document_removed_nights_ago_is_still_named_removed_with_the_run_that_found_it(tmp_path, small_corpus):
    """A night diffs against the night before, so only the first night after an article's removal counts it
    deleted; the eval sets still naming it fail every night until fixed, and each should say the document was
    removed (and when), not that the label names something this corpus never had."""
    from sourcegate.artifact_io.run_folder import RunFolder
    from sourcegate.pipelines.build.ingest import removed_documents

    nights = [RunFolder(tmp_path, f"20261201-00000{i}") for i in range(4)]
    gone = sorted(small_corpus.glob("*.md"))[1]
    previous = None
    for i, night in enumerate(nights[:3]):
        if i == 1:
            gone.unlink()
        previous = ingest(small_corpus, night.path, previous_documents=previous).documents
    assert removed_documents(nights[0]) == {}
    assert removed_documents(nights[2]) == {gone.stem: nights[1].run_id}  # night 2 diffed against a corpus without it
    assert removed_documents(RunFolder(tmp_path, "20261130-000000")) == {}  # only runs up to the night asked about
