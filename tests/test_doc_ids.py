"""Document ids from file paths: ordinary names map into the id alphabet, hostile ones are refused."""

import json
import os
import random
import unicodedata

import pyarrow.parquet as pq
import pytest

from sourcegate.pipelines.build.doc_ids import MAX_ID_CHARS, HostileName, id_from_path
from sourcegate.pipelines.build.ingest import ingest, safe_id
from tests.check_guard import GUARDED as CHECK_SETS
from tests.conftest import DEMO, ROOT


def _quarantine(result):
    return {q["source"]: q["reason"] for q in map(json.loads, result.quarantine.read_text().splitlines())}


def test_the_demo_corpus_keeps_its_ids_and_the_eval_sets_still_name_them():
    ids = {id_from_path(p.relative_to(DEMO).as_posix()) for p in DEMO.rglob("*.md")}
    assert ids == {p.stem for p in DEMO.rglob("*.md")}  # the rule before file names were mapped: the stem
    named = {
        label.split("#")[0]
        for path in (ROOT / "config" / "evals").glob("*.jsonl")
        if str(path.resolve()) not in CHECK_SETS  # a check set's labels are checked by the night that scores it
        for line in path.read_text().splitlines()
        if line.strip()
        for label in json.loads(line).get("expected", [])
    }
    assert named and named <= ids


@pytest.mark.parametrize(
    ("path", "doc_id"),
    [
        ("weird name ü.md", "weird_name_ü"),
        ("Getting Started/First ride.md", "Getting_Started:First_ride"),
        ("Café & Bar [draft].md", "Café_+26_Bar_+5Bdraft+5D"),
        ("Q&A #12.md", "Q+26A_+2312"),
        ("Zürich_(city).md", "Zürich_(city)"),  # already in the alphabet: unchanged
        ("guides/fares.md", "guides:fares"),
        ("(old) timetable.md", "_(old)_timetable"),  # a part may not start with punctuation
        ("-draft.md", "_-draft"),
        ("日本語のページ.md", "日本語のページ"),
        ("emoji 🚌.md", "emoji_+F0+9F+9A+8C"),
        ("a\u00a0b.html", "a_b"),  # a no-break space is a space
        ("notes.v2.md", "notes.v2"),  # only the last suffix is the format
    ],
)
def test_ordinary_names_map_to_readable_safe_ids(path, doc_id):
    assert id_from_path(path) == doc_id
    assert safe_id(doc_id) == doc_id


def test_a_decomposed_name_gets_the_id_of_its_composed_form():
    assert id_from_path(unicodedata.normalize("NFD", "Réseau/café.md")) == "Réseau:café"


def test_every_printable_name_maps_into_the_alphabet_deterministically():
    alphabet = [chr(c) for c in range(0x20, 0x250)] + list("–—“”‘’…€£¥©®™°§¶•¿¡«»🚌😀ﬁ")
    printable = [c for c in alphabet if unicodedata.category(c)[0] != "C"]
    rng = random.Random(26)
    for _ in range(2000):
        parts = ["".join(rng.choices(printable, k=rng.randint(1, 30))) for _ in range(rng.randint(1, 3))]
        path = "/".join(p if p.strip(".") else "x" + p for p in parts) + ".md"
        doc_id = id_from_path(path)
        assert safe_id(doc_id) == doc_id and id_from_path(path) == doc_id
        assert "#" not in doc_id and "/" not in doc_id and " " not in doc_id


def test_an_over_long_id_is_cut_and_ends_in_a_hash_of_the_whole():
    a, b = id_from_path("x" * 300 + "a.md"), id_from_path("x" * 300 + "b.md")
    assert len(a) == len(b) == MAX_ID_CHARS and a != b and a[:183] == b[:183] == "x" * 183
    assert safe_id(a) == a and id_from_path("x" * 300 + "a.md") == a


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("bell\x07.md", "file name holds a control character U+0007 at character 4"),
        ("tab\tname.md", "file name holds a control character U+0009 at character 3"),
        ("line\nbreak.md", "file name holds a control character U+000A at character 4"),
        ("invoice\u202efdp.md", "file name holds an invisible format character U+202E at character 7"),
        ("zero\u200bwidth.md", "file name holds an invisible format character U+200B at character 4"),
        ("bad\udcff.md", "file name is not UTF-8: byte 0xFF at character 3"),
        (
            "private\ue000.md",
            "file name holds a private-use, unassigned or noncharacter code point U+E000 at character 7",
        ),
        ("non\ufffe.md", "file name holds a private-use, unassigned or noncharacter code point U+FFFE at character 3"),
    ],
)
def test_hostile_names_are_refused_with_the_character_escaped(name, reason):
    with pytest.raises(HostileName) as exc:
        id_from_path(name)
    assert str(exc.value) == reason


def test_hostile_file_names_are_quarantined_and_the_night_goes_on(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "fine name.md").write_text("# Fine\n\nAn ordinary article.\n")
    for raw in (b"bell\x07.md", b"rtl\xe2\x80\xae.md", b"latin1-\xe9.md"):  # \xe9 alone is not UTF-8
        (corpus / os.fsdecode(raw)).write_bytes(b"# Hostile\n\nA body under a hostile name.\n")
    result = ingest(corpus, tmp_path / "out")
    assert [d["doc_id"] for d in pq.read_table(result.documents).to_pylist()] == ["fine_name"]
    reasons = _quarantine(result)
    assert reasons == {
        "bell\x07.md": "unsafe file name: file name holds a control character U+0007 at character 4",
        "latin1-\udce9.md": "unsafe file name: file name is not UTF-8: byte 0xE9 at character 7",
        "rtl\u202e.md": "unsafe file name: file name holds an invisible format character U+202E at character 3",
    }
    assert "\x07" not in result.quarantine.read_text()  # JSON escapes the raw character
    assert result.counts["quarantine_reasons"] == {"unsafe file name": 3}


def test_files_mapping_to_one_id_are_all_quarantined_naming_each_other(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a b.md", "a_b.md", "page.md", "page.html", "other.md"):
        body = "<h1>Page</h1><p>The HTML twin.</p>" if name.endswith("html") else "# Page\n\nSome text.\n"
        (corpus / name).write_text(body)
    (corpus / unicodedata.normalize("NFC", "café.md")).write_text("# Café\n\nComposed name.\n")
    (corpus / unicodedata.normalize("NFD", "café.md")).write_text("# Café\n\nDecomposed name.\n")
    result = ingest(corpus, tmp_path / "out")
    assert [d["doc_id"] for d in pq.read_table(result.documents).to_pylist()] == ["other"]
    reasons = _quarantine(result)
    assert reasons["a b.md"] == "duplicate id: 'a_b' (also the id of 'a_b.md'; none of them kept)"
    assert reasons["a_b.md"] == "duplicate id: 'a_b' (also the id of 'a b.md'; none of them kept)"
    assert reasons["page.html"] == "duplicate id: 'page' (also the id of 'page.md'; none of them kept)"
    assert reasons["page.md"] == "duplicate id: 'page' (also the id of 'page.html'; none of them kept)"
    nfd = unicodedata.normalize("NFD", "café.md")
    assert reasons[nfd] == "duplicate id: 'café' (also the id of 'café.md'; none of them kept)"
    assert len(reasons) == 6 and result.counts["documents"] == 1
