"""Embedding with the real packaged model, and the cache that makes reruns cheap."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines.app import steps
from sourcegate.pipelines.build.embed import embedding_matrix

pytestmark = pytest.mark.models


def build(cfg, run_id, embedder):
    steps.ingest_step(RunFolder(cfg.artifacts, run_id), cfg)
    n = steps.chunk_step(RunFolder(cfg.artifacts, run_id), cfg.chunking, cfg.embedding)
    stats = steps.embed_step(RunFolder(cfg.artifacts, run_id), cfg.embedding, embedder=embedder)
    steps.merge_step(RunFolder(cfg.artifacts, run_id), cfg.embedding, [stats])
    return n, stats


def test_cache_encodes_only_what_changed(make_cfg, small_corpus, embedder):
    cfg = make_cfg(**{"corpus.path": str(small_corpus)})
    n, first = build(cfg, "r1", embedder)
    assert first["encoded"] == n > 0 and first["reused"] == 0

    _, again = build(cfg, "r2", embedder)
    assert again["encoded"] == 0 and again["reused"] == n  # no corpus change: nothing encoded

    edited = sorted(small_corpus.glob("*.md"))[0]
    edited.write_text(edited.read_text().replace("\n## ", "\nAn added sentence.\n\n## ", 1))
    rows = pq.read_table(RunFolder(cfg.artifacts, "r2").path / "chunks.parquet").to_pylist()
    own = sum(r["doc_id"] == edited.stem for r in rows)
    _, third = build(cfg, "r3", embedder)
    assert 1 <= third["encoded"] <= own  # only the edited article's changed chunks

    other = make_cfg(
        **{"corpus.path": str(small_corpus), "embedding.model_id": "another-model-id", "artifacts": cfg.artifacts}
    )
    _, fresh = build(other, "r4", embedder.__class__("another-model-id"))
    assert fresh["encoded"] == n  # a new model id re-embeds everything


def test_embeddings_are_unit_norm_float32_and_deterministic(make_cfg, small_corpus, embedder, tmp_path):
    a_cfg = make_cfg(**{"corpus.path": str(small_corpus)})
    b_cfg = make_cfg(**{"corpus.path": str(small_corpus), "artifacts": str(tmp_path / "other")})
    build(a_cfg, "r1", embedder)
    build(b_cfg, "r1", embedder)
    a = pq.read_table(RunFolder(a_cfg.artifacts, "r1").path / "chunks.parquet")
    b = pq.read_table(RunFolder(b_cfg.artifacts, "r1").path / "chunks.parquet")
    assert a["chunk_id"].to_pylist() == b["chunk_id"].to_pylist()
    va, vb = embedding_matrix(a), embedding_matrix(b)
    assert va.dtype == np.float32 and va.shape[1] == 384
    np.testing.assert_allclose(np.linalg.norm(va, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(va, vb)
    assert a.schema.field("embedding").type.list_size == 384


def test_sharded_embedding_merges_back_in_chunk_order(make_cfg, small_corpus, embedder):
    cfg = make_cfg(**{"corpus.path": str(small_corpus)})
    steps.ingest_step(RunFolder(cfg.artifacts, "r1"), cfg)
    steps.chunk_step(RunFolder(cfg.artifacts, "r1"), cfg.chunking, cfg.embedding)
    stats = [steps.embed_step(RunFolder(cfg.artifacts, "r1"), cfg.embedding, s, 3, embedder=embedder) for s in range(3)]
    steps.merge_step(RunFolder(cfg.artifacts, "r1"), cfg.embedding, stats)
    folder = RunFolder(cfg.artifacts, "r1").path
    order = pq.read_table(folder / "chunks.text.parquet")["chunk_id"].to_pylist()
    assert pq.read_table(folder / "chunks.parquet")["chunk_id"].to_pylist() == order


def test_the_embed_step_records_its_time_in_run_json_summed_over_shards(make_cfg, small_corpus, embedder):
    cfg = make_cfg(**{"corpus.path": str(small_corpus)})
    steps.ingest_step(RunFolder(cfg.artifacts, "r1"), cfg)
    steps.chunk_step(RunFolder(cfg.artifacts, "r1"), cfg.chunking, cfg.embedding)
    stats = [steps.embed_step(RunFolder(cfg.artifacts, "r1"), cfg.embedding, s, 2, embedder=embedder) for s in range(2)]
    steps.merge_step(RunFolder(cfg.artifacts, "r1"), cfg.embedding, stats)
    timings = RunFolder(cfg.artifacts, "r1").info()["timings_s"]
    # every step of a night is timed, so `sourcegate runs` sums the whole night, the embedding included
    assert {"ingest", "chunk", "embed"} <= set(timings)
    assert all(s["seconds"] > 0 for s in stats)
    assert timings["embed"] == round(sum(s["seconds"] for s in stats), 3)
