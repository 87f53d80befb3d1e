"""A BEIR dataset's files as other hands write them: a byte-order mark, a qrels file without its header, Windows line
ends read as the format means them; what the format does not allow is named by file and line (no model needed)."""

import json

import pytest

from sourcegate.evals.evalset import EvalSetError, load_evalset
from sourcegate.pipelines.build.beir_queries import DatasetError, load_queries
from sourcegate.pipelines.build.ingest import read_beir_corpus

BOM = "\ufeff"
QUERIES = [{"_id": "1", "text": "what causes croup"}, {"_id": 2, "text": "is coffee bad for you"}]
JUDGED = ["1\td-1\t1", "2\td-2\t2", "2\td-3\t0"]


def dataset(folder, queries=None, qrels=None, header=True, prefix="", newline="\n"):
    (folder / "qrels").mkdir(parents=True)
    lines = [json.dumps(q) for q in QUERIES] if queries is None else queries
    (folder / "queries.jsonl").write_text(prefix + newline.join(lines) + newline, encoding="utf-8", newline="")
    rows = (["query-id\tcorpus-id\tscore"] if header else []) + (JUDGED if qrels is None else qrels)
    (folder / "qrels" / "test.tsv").write_text(prefix + newline.join(rows) + newline, encoding="utf-8", newline="")
    return folder


EXPECTED = ({"1": "what causes croup", "2": "is coffee bad for you"}, {"1": {"d-1": 1}, "2": {"d-2": 2, "d-3": 0}})


@pytest.mark.parametrize(
    "how", [{}, {"prefix": BOM}, {"header": False}, {"newline": "\r\n"}, {"prefix": BOM, "header": False}]
)
def test_queries_and_qrels_read_the_same_with_a_byte_order_mark_windows_line_ends_or_no_header(tmp_path, how):
    assert load_queries(dataset(tmp_path / "data", **how)) == EXPECTED


@pytest.mark.parametrize(
    "queries, qrels, where, says",
    [
        (['{"_id": "1", "text": "croup"}', '{"_id": "2", "text": '], None, "queries.jsonl:2", "not valid JSON"),
        (['{"_id": "1", "text": "croup"}', '{"text": "no id"}'], None, "queries.jsonl:2", 'needs an "_id"'),
        (['{"_id": "1"}'], None, "queries.jsonl:1", "query '1' needs a \"text\""),
        (None, ["1\td-1\t1", "2\td-2\tyes"], r"test.tsv:3", "found \\['2', 'd-2', 'yes'\\]"),
        (None, ["1\td-1"], r"test.tsv:2", "three tab-separated fields"),
    ],
)
def test_what_the_format_does_not_allow_is_named_by_file_and_line(tmp_path, queries, qrels, where, says):
    with pytest.raises(DatasetError, match=f"{where}: .*{says}"):
        load_queries(dataset(tmp_path / "data", queries=queries, qrels=qrels))


def test_a_qrels_file_whose_first_line_is_neither_header_nor_judgement_says_what_it_expected(tmp_path):
    data = dataset(tmp_path / "data", header=False, qrels=["qid\tdocid\trel", *JUDGED])
    with pytest.raises(DatasetError, match=r"test.tsv:1: expected the header query-id, corpus-id, score or a judg"):
        load_queries(data)


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    data = dataset(tmp_path / "data")
    (data / "queries.jsonl").write_bytes('{"_id": "1", "text": "café"}\n'.encode("latin-1"))
    with pytest.raises(DatasetError, match=r"queries.jsonl: not UTF-8 \(byte 25\)"):
        load_queries(data)


def test_the_first_document_of_a_corpus_saved_with_a_byte_order_mark_is_read(tmp_path):
    docs = [{"_id": "d-1", "title": "Croup", "text": "Croup is a viral infection."}, {"_id": "d-2", "text": "Coffee."}]
    (tmp_path / "corpus.jsonl").write_bytes((BOM + "".join(json.dumps(d) + "\n" for d in docs)).encode())
    read = list(read_beir_corpus(tmp_path, 10_000))
    assert [(origin, doc["doc_id"]) for origin, doc in read] == [("corpus.jsonl:1", "d-1"), ("corpus.jsonl:2", "d-2")]
    assert read[0][1]["title"] == "Croup"


def test_an_eval_set_saved_with_a_byte_order_mark_loads_and_one_not_in_utf8_is_named(tmp_path):
    line = json.dumps({"id": "a-1", "question": "when does the 40 run", "label": "answer", "expected": ["x"]})
    (tmp_path / "fit.jsonl").write_text(BOM + line + "\n", encoding="utf-8")
    assert [q["id"] for q in load_evalset(tmp_path / "fit.jsonl")] == ["a-1"]
    (tmp_path / "check.jsonl").write_bytes(line.replace("when", "whén").encode("latin-1") + b"\n")
    with pytest.raises(EvalSetError, match=r"check.jsonl: not UTF-8 \(byte \d+\); save the file as UTF-8"):
        load_evalset(tmp_path / "check.jsonl")


def test_a_split_whose_judged_queries_are_not_in_queries_jsonl_is_refused_not_measured_as_zero(tmp_path, caplog):
    data = dataset(tmp_path / "data", qrels=["7\td-1\t1", "8\td-2\t1"])
    with pytest.raises(
        DatasetError,
        match=r"test.tsv: none of its 2 judged queries is in queries.jsonl \(first: '7'\): nothing to measure",
    ):
        load_queries(data)
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
    with pytest.raises(DatasetError, match=r"test.tsv: no judgement: nothing to measure"):
        load_queries(data)
    (data / "qrels" / "test.tsv").write_text("1\td-1\t1\n7\td-1\t1\n")
    assert load_queries(data) == ({"1": "what causes croup"}, {"1": {"d-1": 1}})  # measured over what can be searched
    assert "1 judged queries are not in queries.jsonl (first: '7'): left out" in caplog.text


def test_ids_that_are_uris_or_page_titles_are_read_and_their_judgements_still_name_their_documents(tmp_path):
    ids = ["<dbpedia:Paris>", "AC/DC", "C# (language)", "MED-10", "31715818", "x" * 250]
    docs = [{"_id": doc_id, "title": f"t{i}", "text": f"Document {i}."} for i, doc_id in enumerate(ids)]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    read = [doc["doc_id"] for _, doc in read_beir_corpus(tmp_path, 10_000)]
    assert read[:5] == ["_+3Cdbpedia:Paris+3E", "AC+2FDC", "C+23_(language)", "MED-10", "31715818"]
    assert len(read[5]) == 200 and read[5].startswith("x" * 150)  # bounded, as a long file name is
    data = dataset(tmp_path / "data", qrels=[f"1\t{doc_id}\t1" for doc_id in ids])
    assert list(load_queries(data)[1]["1"]) == read  # the judgements name the documents ingest made


def test_a_query_whose_id_is_a_corpus_document_does_not_find_itself_as_beir_evaluates():
    from sourcegate.pipelines.app.beir import without_own
    from sourcegate.pipelines.build.beir_queries import document_id

    assert without_own(["q-7", "d-1", "d-2"], "q-7") == ["d-1", "d-2"]  # ArguAna, Quora: the query is a document
    assert without_own(["d-1", "_+3Cq+3E"], document_id("<q>")) == ["d-1"]  # its id mapped as ingest maps it
    assert without_own(["d-1", "d-2"], "q-7") == ["d-1", "d-2"]


def test_a_beir_document_with_a_title_and_no_text_is_read_as_its_title():
    from sourcegate.pipelines.build.ingest import Rejected, parse_beir_line

    doc = parse_beir_line(b'{"_id": "c-1", "title": "Coronavirus spike protein structure", "text": ""}', 10_000)
    assert (doc["body"], doc["title"], doc["title_source"]) == ("Coronavirus spike protein structure", "", "none")
    with pytest.raises(Rejected, match="empty body"):  # neither: nothing to read
        parse_beir_line(b'{"_id": "c-2", "title": " ", "text": ""}', 10_000)
