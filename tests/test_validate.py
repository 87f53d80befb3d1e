"""Validation: a per-row failure quarantines the document and the night goes on; a whole-table one stops it.

The chunker keeps corpus text within bounds, so these chunk rows are built by hand: the failure
paths of the suite, not of a real corpus.
"""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from sourcegate.artifact_io import write_json
from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines.build.validate import VALID_CHUNKS, ValidationFailed, loadable_chunks, validate_chunks
from tests.conftest import chunks_with_vectors

DIM = 4


def _row(doc_id: str, n: int, body: str = "Buses run every ten minutes.") -> dict:
    return {
        "chunk_id": f"{doc_id}-{n}",
        "doc_id": doc_id,
        "title": doc_id,
        "section": "",
        "section_id": "",
        "body": body,
        "text": f"{doc_id}\n{body}",
        "text_hash": f"h-{doc_id}-{n}",
        "ordinal": n,
    }


def _unit(k: int) -> np.ndarray:
    v = np.zeros(DIM, np.float32)
    v[k % DIM] = 1.0
    return v


def _write_chunks(folder, rows, vectors):
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(chunks_with_vectors(rows, np.stack(vectors), "test-model"), folder / "chunks.parquet")
    return folder / "chunks.parquet"


def _hostile_chunks(folder):
    """Two good documents, and one document per per-row expectation that can fail."""
    rows = [_row("good", 0), _row("good", 1), _row("also-good", 0)]
    vectors = [_unit(0), _unit(1), _unit(2)]
    rows += [_row("nan-vector", 0), _row("nan-vector", 1)]
    vectors += [_unit(3), np.full(DIM, np.nan, np.float32)]
    rows.append(_row("zero-vector", 0))
    vectors.append(np.zeros(DIM, np.float32))
    rows.append(_row("too-long", 0, body="word " * 100))
    vectors.append(_unit(1))
    rows.append(_row("empty-body", 0, body=""))
    vectors.append(_unit(2))
    return _write_chunks(folder, rows, vectors)


def test_a_document_failing_a_per_row_expectation_is_quarantined_naming_it_and_the_chunk(tmp_path):
    report = validate_chunks(_hostile_chunks(tmp_path), tmp_path, dimension=DIM, max_chars=300)
    assert report["success"] and report["rows"] == 8 and report["rows_loaded"] == 3
    rows = [json.loads(line) for line in (tmp_path / "quarantine.jsonl").read_text().splitlines()]
    reasons = {r["doc_id"]: r["reason"] for r in rows}
    assert reasons == {
        "empty-body": "failed ExpectColumnValueLengthsToBeBetween(body): chunk empty-body-0 of document 'empty-body'",
        "nan-vector": "failed ExpectColumnValuesToBeInSet(embedding_has_nan): chunk nan-vector-1 of document 'nan-vector'",
        "too-long": "failed ExpectColumnValueLengthsToBeBetween(body): chunk too-long-0 of document 'too-long'",
        "zero-vector": "failed ExpectColumnValuesToBeBetween(embedding_norm): chunk zero-vector-0 of document 'zero-vector'",
    }
    assert all(r["stage"] == "validate" for r in rows)
    # the whole document goes, its passing chunks too: half a document is not served
    loaded = pq.read_table(loadable_chunks(tmp_path))
    assert loadable_chunks(tmp_path).name == VALID_CHUNKS
    assert sorted(set(loaded["doc_id"].to_pylist())) == ["also-good", "good"]
    quality = json.loads((tmp_path / "quality.json").read_text())
    assert {q["doc_id"] for q in quality["quarantined"]} == set(reasons)
    long = next(r for r in quality["results"] if r["expectation"] == "ExpectColumnValueLengthsToBeBetween")
    assert all(len(v) < 300 for v in long["partial_unexpected_list"])  # an over-long value is not copied whole


def test_a_clean_retry_loads_everything_again(tmp_path):
    validate_chunks(_hostile_chunks(tmp_path), tmp_path, dimension=DIM, max_chars=300)
    clean = _write_chunks(tmp_path, [_row("good", 0)], [_unit(0)])
    report = validate_chunks(clean, tmp_path, dimension=DIM)
    assert report["rows_loaded"] == 1 and not (tmp_path / VALID_CHUNKS).exists()
    assert loadable_chunks(tmp_path) == clean
    assert (tmp_path / "quarantine.jsonl").read_text() == ""  # the retry rewrote the validate rows


@pytest.mark.parametrize(
    "rows, vectors, dimension, message",
    [
        (
            [_row("a", 0), _row("a", 0)],
            [_unit(0), _unit(1)],
            DIM,
            "ExpectColumnValuesToBeUnique(chunk_id): 2 unexpected, e.g. ['a-0', 'a-0']",
        ),
        ([_row("a", 0)], [_unit(0)], DIM + 1, "ExpectColumnValuesToBeBetween(embedding_dim): 1 unexpected"),
    ],
    ids=["duplicate-chunk-id", "wrong-dimension"],
)
def test_a_whole_table_expectation_still_fails_the_run(tmp_path, rows, vectors, dimension, message):
    with pytest.raises(ValidationFailed, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        validate_chunks(_write_chunks(tmp_path, rows, vectors), tmp_path, dimension=dimension)
    assert not json.loads((tmp_path / "quality.json").read_text())["success"]


def test_quarantining_every_document_fails_the_run(tmp_path):
    path = _write_chunks(tmp_path, [_row("only", 0)], [np.zeros(DIM, np.float32)])
    with pytest.raises(ValidationFailed, match="no chunks: nothing to index after quarantine"):
        validate_chunks(path, tmp_path, dimension=DIM)


def test_validate_and_load_steps_go_on_without_the_quarantined_documents(make_cfg):
    from sourcegate.artifact_io import read_json
    from sourcegate.pipelines.app import steps

    cfg = make_cfg()
    folder = RunFolder(cfg.artifacts, "r1").path
    _hostile_chunks(folder)
    write_json({"models": {"embedding": {"id": "test-model", "dimension": DIM}}}, folder / "run.json")
    assert steps.validate_step(RunFolder(cfg.artifacts, "r1"))
    info = read_json(folder / "run.json")
    assert info["quarantine"]["by_stage"] == {"validate": 3}  # no body is over the default 20,000 characters
    assert info["quarantine"]["by_reason"]["failed ExpectColumnValuesToBeInSet(embedding_has_nan)"] == 1
    assert steps.load_step(RunFolder(cfg.artifacts, "r1"), cfg) == 4  # only the chunks of documents that passed
