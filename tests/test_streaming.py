"""The build streams in record batches: on a corpus larger than one batch, every step writes exactly
what it writes when the whole corpus is one batch (same rows, ids, vectors, index files).

`sourcegate.pipelines.batches.BATCH_ROWS` is lowered to a few rows so six demo articles span many batches.
"""

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sourcegate.artifact_io import read_json
from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines import batches
from sourcegate.pipelines.app import steps
from sourcegate.pipelines.batches import read_rows, shard_range, write_batches


@pytest.fixture
def tiny_batches(monkeypatch):
    def set_rows(n: int) -> None:
        monkeypatch.setattr(batches, "BATCH_ROWS", n)

    return set_rows


def test_row_range_reads_touch_only_their_rows_and_shards_tile_the_table(tmp_path, tiny_batches):
    tiny_batches(4)
    schema = pa.schema([("i", pa.int64())])
    path = tmp_path / "t.parquet"
    assert write_batches((pa.table({"i": list(range(a, a + 5))}) for a in range(0, 23, 5)), path, schema) == 25
    assert pq.ParquetFile(path).num_row_groups == 10  # a 5-row table becomes groups of 4 and 1
    got = [t["i"].to_pylist() for t in read_rows(path, 6, 15)]
    assert [x for part in got for x in part] == list(range(6, 15)) and max(len(p) for p in got) <= 4
    ranges = [shard_range(25, s, 3) for s in range(3)]
    assert ranges == [(0, 8), (8, 16), (16, 25)]
    assert write_batches(iter([]), tmp_path / "empty.parquet", schema) == 0
    assert pq.read_table(tmp_path / "empty.parquet").schema == schema


def _chunk_night(cfg, run_id):
    steps.ingest_step(RunFolder(cfg.artifacts, run_id), cfg)
    n = steps.chunk_step(RunFolder(cfg.artifacts, run_id), cfg.chunking, cfg.embedding)
    (RunFolder(cfg.artifacts, run_id).path / "chunks.parquet").touch()  # what makes a run a chunk baseline
    return n


def test_chunking_in_small_batches_writes_what_one_batch_writes(make_cfg, small_corpus, tmp_path, tiny_batches):
    one = make_cfg(**{"corpus.path": str(small_corpus)})
    many = make_cfg(**{"corpus.path": str(small_corpus), "artifacts": str(tmp_path / "many")})
    _chunk_night(one, "r1")
    tiny_batches(2)  # 6 documents in 3 batches, ~30 chunks in row groups of 2
    n = _chunk_night(many, "r1")
    a, b = (pq.read_table(RunFolder(c.artifacts, "r1").path / "chunks.text.parquet") for c in (one, many))
    assert n == a.num_rows > 6 and a.equals(b)
    assert pq.ParquetFile(RunFolder(many.artifacts, "r1").path / "chunks.text.parquet").num_row_groups > 3

    # a night with two edited documents reuses the others' rows across batch boundaries
    for path in sorted(small_corpus.glob("*.md"))[1::3]:
        path.write_text(path.read_text() + "\nOne more sentence at the end.\n")
    _chunk_night(many, "r2")
    tiny_batches(1_000_000)
    fresh = make_cfg(**{"corpus.path": str(small_corpus), "artifacts": str(tmp_path / "fresh")})
    _chunk_night(fresh, "r2")
    night, rebuilt = (RunFolder(c.artifacts, "r2").path for c in (many, fresh))
    assert pq.read_table(night / "chunks.text.parquet").equals(pq.read_table(rebuilt / "chunks.text.parquet"))
    counts = read_json(night / "run.json")["counts"]
    assert counts["documents_rechunked"] == 2


@pytest.mark.models
def test_embedding_in_small_batches_and_shards_writes_what_one_batch_writes(
    make_cfg, small_corpus, tmp_path, tiny_batches, embedder
):
    one = make_cfg(**{"corpus.path": str(small_corpus)})
    steps.ingest_step(RunFolder(one.artifacts, "r1"), one)
    steps.chunk_step(RunFolder(one.artifacts, "r1"), one.chunking, one.embedding)
    steps.merge_step(
        RunFolder(one.artifacts, "r1"),
        one.embedding,
        [steps.embed_step(RunFolder(one.artifacts, "r1"), one.embedding, embedder=embedder)],
    )
    many = make_cfg(**{"corpus.path": str(small_corpus), "artifacts": str(tmp_path / "many")})
    shutil.copytree(
        RunFolder(one.artifacts, "r1").path, RunFolder(many.artifacts, "r1").path
    )  # the same previous night

    edited = sorted(small_corpus.glob("*.md"))[3]
    edited.write_text(edited.read_text().replace("\n## ", "\nAn added sentence.\n\n## ", 1))
    steps.ingest_step(RunFolder(one.artifacts, "r2"), one)
    steps.chunk_step(RunFolder(one.artifacts, "r2"), one.chunking, one.embedding)
    whole = steps.embed_step(RunFolder(one.artifacts, "r2"), one.embedding, embedder=embedder)
    steps.merge_step(RunFolder(one.artifacts, "r2"), one.embedding, [whole])

    tiny_batches(3)
    steps.ingest_step(RunFolder(many.artifacts, "r2"), many)
    steps.chunk_step(RunFolder(many.artifacts, "r2"), many.chunking, many.embedding)
    stats = [
        steps.embed_step(RunFolder(many.artifacts, "r2"), many.embedding, s, 1, embedder=embedder) for s in range(1)
    ]
    steps.merge_step(RunFolder(many.artifacts, "r2"), many.embedding, stats)
    a, b = (pq.read_table(RunFolder(c.artifacts, "r2").path / "chunks.parquet") for c in (one, many))
    assert 1 <= whole["encoded"] == stats[0]["encoded"] < a.num_rows
    assert a.equals(b)  # same ids, same vectors bit for bit: reused from the cache or encoded in one call

    sharded = [
        steps.embed_step(RunFolder(many.artifacts, "r2"), many.embedding, s, 3, embedder=embedder) for s in range(3)
    ]
    steps.merge_step(RunFolder(many.artifacts, "r2"), many.embedding, sharded)
    c = pq.read_table(RunFolder(many.artifacts, "r2").path / "chunks.parquet")
    assert c["chunk_id"].equals(a["chunk_id"]) and sum(s["encoded"] for s in sharded) == whole["encoded"]
    va, vc = (t["embedding"].combine_chunks().flatten().to_numpy() for t in (a, c))
    np.testing.assert_allclose(va, vc, atol=1e-6)  # a shard encodes its own texts: other batches of the model
    assert not list((RunFolder(many.artifacts, "r2").path / "embed").glob(".*.tmp"))  # the spilled cache is gone


def test_a_merge_missing_a_shard_names_a_chunk_without_embedding(make_cfg, small_corpus, tiny_batches):
    """The shard files are written here by hand (a failure path): no model needed."""
    from sourcegate.pipelines.build.embed import chunks_schema, with_vectors

    cfg = make_cfg(**{"corpus.path": str(small_corpus)})
    steps.ingest_step(RunFolder(cfg.artifacts, "r1"), cfg)
    total = steps.chunk_step(RunFolder(cfg.artifacts, "r1"), cfg.chunking, cfg.embedding)
    folder = RunFolder(cfg.artifacts, "r1").path
    stats = []
    for shard in range(2):
        lo, hi = shard_range(total, shard, 2)
        parts = [
            with_vectors(t, np.ones((t.num_rows, 4), np.float32) / 2, "m", "f")
            for t in read_rows(folder / "chunks.text.parquet", lo, hi)
        ]
        write_batches(parts, folder / "embed" / f"shard-{shard:04d}.parquet", chunks_schema(4))
        stats.append({"shard": shard, "encoded": 0, "reused": hi - lo, "dimension": 4, "fingerprint": "f"})
    assert steps.merge_step(RunFolder(cfg.artifacts, "r1"), cfg.embedding, stats) == 0
    assert pq.read_table(folder / "chunks.parquet")["chunk_id"].equals(
        pq.read_table(folder / "chunks.text.parquet")["chunk_id"]
    )
    first_of_second = next(read_rows(folder / "chunks.text.parquet", *shard_range(total, 1, 2)))["chunk_id"][0]
    with pytest.raises(RuntimeError, match=f"chunks have no embedding \\(first: {first_of_second.as_py()}\\)"):
        steps.merge_step(RunFolder(cfg.artifacts, "r1"), cfg.embedding, stats[:1])


def test_validation_in_small_batches_reports_and_quarantines_what_one_batch_does(tmp_path, tiny_batches):
    from sourcegate.pipelines.build.validate import VALID_CHUNKS, validate_chunks
    from tests.test_validate import _hostile_chunks

    one, many = tmp_path / "one", tmp_path / "many"
    reports = {}
    for folder, rows in ((one, None), (many, 2)):
        reports[folder] = validate_chunks(_hostile_chunks(folder), folder, dimension=4, max_chars=300, rows=rows)
    assert reports[one] == reports[many] and reports[one]["rows_loaded"] == 3
    assert reports[one]["great_expectations_sample"]["agrees"]
    for name in ("quarantine.jsonl", "quality.json"):
        assert (one / name).read_text() == (many / name).read_text()
    assert pq.read_table(one / VALID_CHUNKS).equals(pq.read_table(many / VALID_CHUNKS))


def test_the_embedded_index_built_in_small_batches_is_the_one_batch_index(tmp_path, tiny_batches):
    from sourcegate.pipelines.search.embedded import EmbeddedStore
    from tests.test_embedded_backend import synthetic_chunks

    rows, vectors = synthetic_chunks(tmp_path / "c.parquet", n=50)
    store = EmbeddedStore(tmp_path / "runs", tmp_path / "LIVE")
    store.load("v1", str(tmp_path / "c.parquet"))
    tiny_batches(7)
    store.load("v2", str(tmp_path / "c.parquet"))
    a, b = store.open("v1"), store.open("v2")
    assert (store.folder("v1") / "embeddings.npy").read_bytes() == (store.folder("v2") / "embeddings.npy").read_bytes()
    np.testing.assert_array_equal(np.load(store.folder("v1") / "embeddings.npy"), vectors)  # np.save's file
    assert isinstance(b.vectors, np.memmap)
    assert a.table.equals(b.table) and a.bm25_index.vocab == b.bm25_index.vocab
    wa, wb = a.bm25_index.weights, b.bm25_index.weights
    assert wa.indices.dtype == wb.indices.dtype and wa.data.dtype == wb.data.dtype
    for part in ("data", "indices", "indptr"):
        np.testing.assert_array_equal(getattr(wa, part), getattr(wb, part))
    assert pq.ParquetFile(store.folder("v2") / "chunks.parquet").num_row_groups == 8


def test_bm25_built_batch_by_batch_equals_the_one_batch_build():
    from sourcegate.pipelines.search.analyzer import analyze
    from sourcegate.pipelines.search.bm25 import BM25Builder, BM25Index

    texts = ["the bus fare", "", "train pass and bus pass", "refunds", "night bus to the airport", "pass"] * 5
    tokens = [analyze(t) for t in texts]
    whole = BM25Index.build(tokens)
    builder = BM25Builder()
    for lo in range(0, len(tokens), 4):
        builder.add(tokens[lo : lo + 4])
    parts = builder.build()
    assert parts.vocab == whole.vocab and (parts.weights != whole.weights).nnz == 0
    np.testing.assert_array_equal(parts.scores("bus pass"), whole.scores("bus pass"))


def test_ingest_in_small_batches_writes_what_one_batch_writes(tmp_path, small_corpus):
    from sourcegate.pipelines.build.ingest import ingest
    from tests.conftest import DATA

    outs = {rows: ingest(DATA / "bad_beir", tmp_path / f"beir-{rows}", fmt="beir", rows=rows) for rows in (None, 2)}
    a, b = outs[None], outs[2]
    assert a.counts == b.counts and a.counts["documents"] == 4 and a.counts["quarantine_reasons"]["duplicate id"]
    assert (a.quarantine.read_text() == b.quarantine.read_text()) and pq.read_table(a.documents).equals(
        pq.read_table(b.documents)
    )
    first = ingest(small_corpus, tmp_path / "r1")
    docs = sorted(small_corpus.glob("*.md"))
    docs[0].unlink()
    docs[1].write_text(docs[1].read_text() + "\nEdited.\n")
    (small_corpus / "zz-new.md").write_text("# New\n\nA new article about night buses.\n")
    nights = {
        rows: ingest(small_corpus, tmp_path / f"r2-{rows}", previous_documents=first.documents, rows=rows)
        for rows in (None, 2)
    }
    assert nights[None].counts == nights[2].counts
    assert {k: nights[2].counts[k] for k in ("added", "changed", "deleted", "unchanged")} == {
        "added": 1,
        "changed": 1,
        "deleted": 1,
        "unchanged": 4,
    }
    for name in ("documents", "manifest"):
        x, y = (pq.read_table(getattr(nights[r], name)) for r in (None, 2))
        assert x.equals(y)
    ids = pq.read_table(nights[2].documents)["doc_id"].to_pylist()
    assert ids == sorted(ids) and not list((tmp_path / "r2-2").glob(".*"))  # sorted; no staging left behind
