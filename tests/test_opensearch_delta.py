"""OpenSearch nights that cost what changed: a version built from the live one (clone + delta).

The pure delta and fallback rules run in the fast tier; the clone + delta build runs against the REAL
node (marker `opensearch`) on synthetic 384-d chunks (no model): a delete, a change and an add land in
the new version only, its searches answer as a full load's, and a failed delta leaves the alias alone.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines.config import OpenSearch
from sourcegate.pipelines.search.delta import MAX_DELTA_FRACTION, compute_delta, full_load_reason
from sourcegate.pipelines.search.opensearch import OpenSearchStore, ids_checksum, indexed_columns
from tests.conftest import build_validated
from tests.test_opensearch_backend import DIM, RARE, write_chunks

INPUTS = {
    "corpus_hash": "c1",
    "config_hash": "k1",
    "model_fingerprint": "sha256:m1",
    "code_version": "v1",
    "chunker": "chunker-1",
}
REMOVED, CHANGED = ["c0005", "c0013"], "c0003"  # c0003 holds the rare word (write_chunks puts it in i % 10 == 3)
ADDED = "c9999"


def night_of(base: Path, out: Path) -> Path:
    """`base` one night later: two chunks removed, one changed (new text and vector), one added."""
    table = pq.read_table(base)
    ids = table["chunk_id"].to_pylist()
    table = table.filter(pa.array([c not in REMOVED for c in ids]))
    rows = table.to_pylist()
    rng = np.random.default_rng(11)
    for row in rows:
        if row["chunk_id"] == CHANGED:
            row["text"] = "harbor lantern meadow copper quiet ember rewritten tonight"
            row["text_hash"] = "h-changed"
            row["embedding"] = _unit(rng)
    added = {**rows[0], "chunk_id": ADDED, "doc_id": "d999", "text": f"a new {RARE} chunk about the harbor"}
    rows.append({**added, "text_hash": "h-added", "embedding": _unit(rng)})
    night = pa.Table.from_pylist(rows, schema=table.schema)
    pq.write_table(night, out)
    return out


def _unit(rng) -> list[float]:
    v = rng.standard_normal(DIM).astype(np.float32)
    return (v / np.linalg.norm(v)).tolist()


# --- the delta and the fallback rules (no node) ---------------------------------------------------


def test_delta_classifies_added_changed_removed_and_unchanged(tmp_path):
    base = write_chunks(tmp_path / "base.parquet", n=40)[0]
    night = night_of(base, tmp_path / "night.parquet")
    columns = indexed_columns(pq.ParquetFile(base).schema_arrow.names)
    delta = compute_delta(base, night, columns)
    assert delta.added == [ADDED] and delta.changed == [CHANGED] and delta.removed == sorted(REMOVED)
    assert delta.counts() == {"added": 1, "changed": 1, "removed": 2, "unchanged": 37}
    assert delta.upserts == [ADDED, CHANGED]
    assert delta.fraction == pytest.approx(4 / 40)
    assert compute_delta(base, base, columns).counts() == {"added": 0, "changed": 0, "removed": 0, "unchanged": 40}


def test_delta_sees_a_vector_or_field_change_under_the_same_id(tmp_path):
    base = write_chunks(tmp_path / "base.parquet", n=10)[0]
    table = pq.read_table(base)
    columns = indexed_columns(table.schema.names)
    vectors = table["embedding"].combine_chunks().flatten().to_numpy().reshape(10, DIM).copy()
    vectors[4, 0] = np.nextafter(vectors[4, 0], np.float32(2))  # one ulp: a re-encoded chunk
    moved = table.set_column(
        table.schema.get_field_index("embedding"),
        "embedding",
        pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel(), pa.float32()), DIM),
    )
    titles = moved["title"].to_pylist()
    titles[7] = "Renamed"
    moved = moved.set_column(moved.schema.get_field_index("title"), "title", pa.array(titles))
    pq.write_table(moved, tmp_path / "moved.parquet")
    delta = compute_delta(base, tmp_path / "moved.parquet", columns)
    assert delta.changed == ["c0004", "c0007"] and delta.unchanged == 8 and not delta.added and not delta.removed


def test_full_load_reasons():
    live = {"version": "v1", "index_body_sha256": "b1", "inputs": INPUTS}
    assert full_load_reason(None, INPUTS, "b1") == "no previous version"
    assert full_load_reason(live, INPUTS, "b1") is None
    assert "mapping/settings changed" in full_load_reason(live, INPUTS, "b2")
    assert "records no index mapping" in full_load_reason({**live, "index_body_sha256": None}, INPUTS, "b1")
    assert "model fingerprint changed" in full_load_reason(live, {**INPUTS, "model_fingerprint": "sha256:m2"}, "b1")
    assert "chunker config changed" in full_load_reason(live, {**INPUTS, "chunker": "chunker-2"}, "b1")
    assert full_load_reason(live, {**INPUTS, "corpus_hash": "c2", "code_version": "v9"}, "b1") is None


# --- clone + delta on the real node ---------------------------------------------------------------


@pytest.fixture
def store(os_client):
    prefix = f"sgdelta-{uuid.uuid4().hex[:12]}"
    yield OpenSearchStore(os_client, OpenSearch(index_prefix=prefix, bulk_chunk_size=100), progress=False)
    os_client.indices.delete(index=f"{prefix}-*", ignore_unavailable=True)


@pytest.fixture
def nights(tmp_path):
    base = write_chunks(tmp_path / "base.parquet", n=300)[0]
    return base, night_of(base, tmp_path / "night.parquet")


def _live_v1(store, base) -> None:
    assert store.load("v1", str(base), inputs=INPUTS) == 300
    assert store.manifest("v1")["build"]["mode"] == "full"
    assert store.manifest("v1")["build"]["reason"] == "no previous version"
    store.promote("v1")


def _source(client, index: str, chunk_id: str) -> dict | None:
    from opensearchpy import NotFoundError

    try:
        return client.get(index=index, id=chunk_id)["_source"]
    except NotFoundError:
        return None


@pytest.mark.opensearch
def test_delete_change_and_add_land_in_the_new_version_only(store, nights, os_client):
    base, night = nights
    _live_v1(store, base)
    assert store.load("v2", str(night), inputs=INPUTS, base_chunks=base) == 299
    build = store.manifest("v2")["build"]
    assert (build["mode"], build["from"]) == ("delta", "v1")
    assert (build["added"], build["changed"], build["removed"], build["unchanged"]) == (1, 1, 2, 297)
    assert {"write_block", "clone", "delete", "bulk", "refresh", "verify"} <= set(build["steps_s"])
    old, new = store.index_name("v1"), store.index_name("v2")
    for chunk_id in REMOVED:
        assert _source(os_client, new, chunk_id) is None and _source(os_client, old, chunk_id) is not None
    assert _source(os_client, old, ADDED) is None and RARE in _source(os_client, new, ADDED)["text"]
    assert "rewritten tonight" in _source(os_client, new, CHANGED)["text"]
    assert "rewritten tonight" not in _source(os_client, old, CHANGED)["text"]
    # the new version is complete and intact (count and ids' checksum against tonight's Parquet) ...
    manifest = store.verify("v2")
    assert manifest["ids_sha256"] == ids_checksum(pq.read_table(night)["chunk_id"].to_pylist())
    assert store.verify("v1")["rows"] == 300  # ... and the old one untouched
    # the live index kept serving through the build, and keeps serving behind its write block
    assert store.live() == "v1" and os_client.count(index=store.alias)["count"] == 300
    assert store.open().bm25(RARE, 5)
    store.promote("v2")
    assert store.live() == "v2" and os_client.count(index=store.alias)["count"] == 299
    assert store.versions() == ["v1", "v2"]
    # the next night builds from v2, which gets its write block only then: it was writable as a candidate
    assert store.load("v3", str(base), inputs=INPUTS, base_chunks=night) == 300
    assert store.manifest("v3")["build"]["from"] == "v2"
    assert store.verify("v3")["ids_sha256"] == store.verify("v1")["ids_sha256"]


@pytest.mark.opensearch
def test_a_delta_version_searches_as_a_full_load_of_the_same_chunks(store, nights, os_client, tmp_path):
    """Same ranks and kNN scores as a full load; BM25 scores within a few %, and exactly why.

    Lucene keeps a deleted (or replaced) document in its segment, marked deleted, until a merge
    rewrites the segment, and its term statistics (docCount, docFreq, the average field length)
    still count it. This night's delta version holds 3 such documents (2 removed, 1 replaced), so
    its BM25 scores are exactly a full load's of tonight's chunks *plus* those 3 old documents (the
    `ghost` index below), and differ from a plain full load's by what 3 documents do to the
    statistics: 2.4% for the rare word (one more docFreq out of ~30), under 1% for common ones.
    Later merges reclaim them; a full load has none.
    """
    base, night = nights
    _live_v1(store, base)
    store.load("delta", str(night), inputs=INPUTS, base_chunks=base)
    store.load("full", str(night), inputs=INPUTS)
    assert store.manifest("full")["build"]["reason"] == "full load requested"
    stats = os_client.indices.stats(index=store.index_name("delta"), metric="docs")["_all"]["primaries"]["docs"]
    # 3 deleted in the cloned segment, plus OpenSearch's soft-delete tombstone of each removed id
    # (a document without a text field, so outside the BM25 statistics)
    assert (stats["count"], stats["deleted"]) == (299, 3 + len(REMOVED))
    old = pq.read_table(base).filter(
        pa.array([c in [*REMOVED, CHANGED] for c in pq.read_table(base)["chunk_id"].to_pylist()])
    )
    old = old.set_column(0, "chunk_id", pa.array([f"ghost-{c}" for c in old["chunk_id"].to_pylist()]))
    pq.write_table(pa.concat_tables([pq.read_table(night), old]), tmp_path / "ghost.parquet")
    store.load("ghost", str(tmp_path / "ghost.parquet"))
    delta, full, ghost = store.open("delta"), store.open("full"), store.open("ghost")
    worst = 0.0
    for query in [RARE, "harbor lantern", "rewritten tonight", "quiet ember signal", "granite summit canyon"]:
        a, b = delta.bm25(query, 10), full.bm25(query, 10)
        assert [h.chunk_id for h in a] == [h.chunk_id for h in b], query
        worst = max(worst, *(abs(x.score - y.score) / y.score for x, y in zip(a, b)))
        with_ghosts = {h.chunk_id: h.score for h in ghost.bm25(query, 400)}
        for h in a:  # Lucene scores in float32
            assert h.score == pytest.approx(with_ghosts[h.chunk_id], rel=1e-5), (query, h)
    assert 0 < worst < 0.03, worst
    vectors = pq.read_table(night)["embedding"].combine_chunks().flatten().to_numpy().reshape(-1, DIM)
    for v in vectors[::50]:
        a, b = delta.knn(v, 10), full.knn(v, 10)
        assert [h.chunk_id for h in a] == [h.chunk_id for h in b]
        assert np.allclose([h.score for h in a], [h.score for h in b], atol=1e-6)


@pytest.mark.opensearch
@pytest.mark.parametrize("failure", ["checksum", "exception"])
def test_a_failed_delta_leaves_the_alias_and_deletes_the_clone(store, nights, os_client, monkeypatch, failure):
    """Unit of the failure path: the bulk is patched to index the added chunk under a wrong id (the
    count is right, the ids' checksum is not) or to fail outright."""
    base, night = nights
    _live_v1(store, base)
    send = store.bulk.send

    def faulty_send(actions):
        if any(a.get("_op_type", "index") == "index" for a in actions):
            if failure == "exception":
                raise RuntimeError("injected: bulk failed")
            actions = [{**a, "_id": "intruder"} if a["_id"] == ADDED else a for a in actions]
        return send(actions)

    monkeypatch.setattr(store.bulk, "send", faulty_send)
    match = "chunk ids differ" if failure == "checksum" else "injected"
    with pytest.raises(RuntimeError, match=match):
        store.load("v2", str(night), inputs=INPUTS, base_chunks=base)
    assert store.live() == "v1" and os_client.count(index=store.alias)["count"] == 300
    assert not os_client.indices.exists(index=store.index_name("v2"))  # no half-built clone
    assert store.versions() == ["v1"] and store.manifest("v2") is None
    monkeypatch.undo()
    assert store.load("v2", str(night), inputs=INPUTS, base_chunks=base) == 299  # the rerun builds it


@pytest.mark.opensearch
def test_fallbacks_to_a_full_load_say_why(store, nights, tmp_path):
    base, night = nights
    _live_v1(store, base)
    store.load("v2", str(night), inputs={**INPUTS, "model_fingerprint": "sha256:m2"}, base_chunks=base)
    assert store.manifest("v2")["build"]["mode"] == "full"
    assert "model fingerprint changed since the live version v1" in store.manifest("v2")["build"]["reason"]
    store.load("v3", str(night), inputs=INPUTS, base_chunks=tmp_path / "gone.parquet")
    assert "gone.parquet is missing" in store.manifest("v3")["build"]["reason"]
    store.load("v4", str(night), inputs=INPUTS, base_chunks=night)  # not the Parquet v1 was loaded from
    assert "does not hold the live version v1's chunk ids" in store.manifest("v4")["build"]["reason"]
    most = write_chunks(tmp_path / "other.parquet", n=300, seed=99)[0]  # same ids, every text and vector new
    store.load("v5", str(most), inputs=INPUTS, base_chunks=base)
    build = store.manifest("v5")["build"]
    assert build["mode"] == "full" and build["changed"] == 300 and f"over {MAX_DELTA_FRACTION:.0%}" in build["reason"]
    for v in ("v2", "v3", "v4", "v5"):
        assert store.verify(v)["rows"] == store.manifest(v)["rows"]


# --- the load step: run.json says what each night did --------------------------------------------


@pytest.mark.opensearch
@pytest.mark.models
def test_the_load_step_records_mode_reason_and_counts_in_run_json(make_cfg, small_corpus, embedder, os_client):
    from sourcegate.artifact_io import read_json
    from sourcegate.pipelines.app import steps

    prefix = f"sgdelta-{uuid.uuid4().hex[:12]}"

    def night(cfg, run_id, full=False) -> dict:
        run = build_validated(cfg, run_id, embedder)
        steps.load_step(run, cfg, full=full)
        OpenSearchStore(os_client, OpenSearch(index_prefix=prefix)).promote(run_id)  # the verdict is not tested here
        return read_json(run / "run.json")["load"]

    opensearch = {
        "corpus.path": str(small_corpus),
        "backend.kind": "opensearch",
        "backend.opensearch.index_prefix": prefix,
    }
    cfg = make_cfg(**opensearch)
    try:
        first = night(cfg, "20261201-010000")
        assert (first["mode"], first["reason"], first["from"]) == ("full", "no previous version", None)
        docs = sorted(small_corpus.glob("*.md"))
        docs[0].unlink()  # its chunks are removed
        docs[1].write_text(docs[1].read_text() + "\nA sentence added tonight.\n")  # its last chunk changes
        (small_corpus / "new-article.md").write_text("# A new article\n\nIt arrived tonight with one section.\n")
        second = night(cfg, "20261202-010000")
        assert (second["mode"], second["from"]) == ("delta", "20261201-010000")
        assert second["removed"] >= 2 and second["added"] >= 2 and second["unchanged"] > 0, second
        chunks = pq.read_table(RunFolder(cfg.artifacts, "20261202-010000").path / "chunks.parquet")
        assert os_client.count(index=prefix)["count"] == chunks.num_rows
        assert OpenSearchStore(os_client, OpenSearch(index_prefix=prefix)).verify(
            "20261202-010000"
        )  # ids' checksum included
        assert night(cfg, "20261203-010000", full=True)["reason"] == "full load requested"
        smaller = make_cfg(**opensearch, artifacts=cfg.artifacts, **{"chunking.max_tokens": 128})
        fourth = night(smaller, "20261204-010000")
        assert fourth["mode"] == "full" and "chunker config changed" in fourth["reason"]
    finally:
        os_client.indices.delete(index=f"{prefix}-*", ignore_unavailable=True)
