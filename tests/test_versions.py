"""Immutable, verifiable index versions (G1, G2): manifests, verify on open, reuse-or-refuse, model fingerprints.

Fast tier: tiny hand-made versions with fixed vectors, no model, no node.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines import models
from sourcegate.pipelines.app.cli import main
from sourcegate.pipelines.app.factories import get_embedder, open_store, retriever_for
from sourcegate.pipelines.build.embed import VectorCache
from sourcegate.pipelines.release import verdict
from sourcegate.pipelines.search.embedded import EmbeddedStore, open_run_folder
from sourcegate.pipelines.versions import manifest as mf
from sourcegate.pipelines.versions.stamp import STAMP_FILE
from tests.conftest import build_validated, chunks_with_vectors
from tests.test_embedded_backend import synthetic_chunks

INPUTS = {"corpus_hash": "c1", "config_hash": "k1", "model_fingerprint": "sha256:m1", "code_version": "v1"}


@pytest.fixture
def store(tmp_path):
    synthetic_chunks(tmp_path / "c.parquet", n=12)
    return EmbeddedStore(tmp_path / "artifacts" / "runs", tmp_path / "artifacts" / "LIVE")


def test_load_writes_a_manifest_of_every_file_last(store, tmp_path):
    assert store.load("v1", str(tmp_path / "c.parquet"), inputs=INPUTS) == 12
    folder = store.folder("v1")
    manifest = json.loads((folder / mf.MANIFEST_FILE).read_text())
    assert manifest["rows"] == 12 and manifest["dimension"] == 8 and manifest["version"] == "v1"
    assert manifest["inputs"] == INPUTS and manifest["created"]
    on_disk = {p.name for p in folder.iterdir()} - {mf.MANIFEST_FILE, STAMP_FILE}
    assert set(manifest["files"]) == on_disk >= {"chunks.parquet", "embeddings.npy", "bm25.npz", "bm25_vocab.json"}
    for name, entry in manifest["files"].items():
        assert entry == {"sha256": mf.sha256_file(folder / name), "bytes": (folder / name).stat().st_size}
    # the manifest is the newest file of the version: written after everything it describes (the
    # `.verified` stamp after it is a cache of the hashing, not part of the version)
    newest = max((p for p in folder.iterdir() if p.name != STAMP_FILE), key=lambda p: p.stat().st_mtime_ns)
    assert newest.name == mf.MANIFEST_FILE
    assert not folder.with_name("index.tmp").exists()
    assert store.open("v1").manifest == manifest == store.manifest("v1")


def test_a_truncated_file_is_refused_on_open_promote_and_by_verify(store, tmp_path, capsys):
    store.load("v1", str(tmp_path / "c.parquet"), inputs=INPUTS)
    npy = store.folder("v1") / "embeddings.npy"
    npy.write_bytes(npy.read_bytes()[:-40])
    for action in (lambda: store.open("v1", hashes=False), lambda: store.promote("v1")):
        with pytest.raises(mf.IntegrityError, match="embeddings.npy.*bytes, manifest says"):
            action()
    assert store.live() is None
    artifacts = tmp_path / "artifacts"
    assert main(["verify", "v1", "--artifacts", str(artifacts), "--backend", "embedded"]) == 2
    err = capsys.readouterr().err
    assert "FAILED" in err and "embeddings.npy" in err and "Traceback" not in err


def test_flipped_bytes_are_caught_by_the_hash_check(store, tmp_path, capsys):
    store.load("v1", str(tmp_path / "c.parquet"), inputs=INPUTS)
    store.load("v2", str(tmp_path / "c.parquet"), inputs=INPUTS)
    store.promote("v1")
    vocab = store.folder("v1") / "bm25_vocab.json"
    data = bytearray(vocab.read_bytes())
    data[5] ^= 0x01  # same size, different content
    vocab.write_bytes(bytes(data))
    store.open("v1", hashes=False)  # sizes alone cannot see it ...
    with pytest.raises(mf.IntegrityError, match="bm25_vocab.json: SHA-256 differs"):
        store.open("v1")  # ... the hashes at load do
    artifacts = str(tmp_path / "artifacts")
    assert main(["verify", "v2", "--artifacts", artifacts, "--backend", "embedded"]) == 0
    files = len(store.manifest("v2")["files"])
    assert f"v2: ok (12 chunks, dimension 8, {files} files verified" in capsys.readouterr().out
    assert main(["verify", "v1", "--artifacts", artifacts, "--backend", "embedded"]) == 2
    assert "bm25_vocab.json" in capsys.readouterr().err
    # querying the live (corrupt) version fails clearly, before any model is loaded
    assert main(["query", "a question", "--artifacts", artifacts, "--backend", "embedded"]) == 2
    err = capsys.readouterr().err
    assert "integrity error" in err and "bm25_vocab.json" in err and "Traceback" not in err
    with pytest.raises(mf.IntegrityError):
        open_run_folder(store.runs / "v1")


def test_a_version_without_manifest_is_incomplete_never_opened_and_may_be_rebuilt(store, tmp_path):
    store.load("v1", str(tmp_path / "c.parquet"), inputs=INPUTS)
    (store.folder("v1") / mf.MANIFEST_FILE).unlink()  # as a crash before the completion mark leaves it
    assert store.manifest("v1") is None
    with pytest.raises(mf.IntegrityError, match="incomplete"):
        store.open("v1")
    with pytest.raises(mf.IntegrityError, match="incomplete"):
        store.promote("v1")
    assert store.load("v1", str(tmp_path / "c.parquet"), inputs=INPUTS) == 12  # rebuilt
    assert store.open("v1").manifest["rows"] == 12


def test_a_complete_version_is_reused_with_the_same_inputs_and_refused_with_others(store, tmp_path):
    store.load("v1", str(tmp_path / "c.parquet"), inputs=INPUTS)
    before = {p.name: p.stat().st_mtime_ns for p in store.folder("v1").iterdir()}
    synthetic_chunks(tmp_path / "other.parquet", n=7, seed=5)
    # same inputs: reused as it is, even from another file (the inputs say it would be the same)
    assert store.load("v1", str(tmp_path / "other.parquet"), inputs=INPUTS) == 12
    assert {p.name: p.stat().st_mtime_ns for p in store.folder("v1").iterdir()} == before
    with pytest.raises(mf.VersionConflict, match=r"corpus_hash: 'c1' -> 'c2'.*new run id") as err:
        store.load("v1", str(tmp_path / "other.parquet"), inputs={**INPUTS, "corpus_hash": "c2"})
    assert "model_fingerprint" not in str(err.value)
    assert {p.name: p.stat().st_mtime_ns for p in store.folder("v1").iterdir()} == before


def test_the_live_version_is_never_rebuilt(store, tmp_path):
    store.load("v1", str(tmp_path / "c.parquet"), inputs=INPUTS)
    store.promote("v1")
    before = mf.read_manifest(store.folder("v1"))
    for inputs in (INPUTS, {**INPUTS, "code_version": "v2"}):
        with pytest.raises(mf.VersionConflict, match="refusing to rebuild index version v1: it is the live version"):
            store.load("v1", str(tmp_path / "c.parquet"), inputs=inputs)
    assert mf.read_manifest(store.folder("v1")) == before and store.live() == "v1"


def test_query_side_model_must_match_the_index():
    manifest = mf.build_manifest("v1", rows=1, dimension=8, inputs=INPUTS)
    mf.check_model(manifest, "sha256:m1")
    with pytest.raises(mf.IntegrityError, match="sha256:m1.*sha256:other"):
        mf.check_model(manifest, "sha256:other")
    mf.check_model(None, "anything")  # a raw folder (benchmarks) carries no manifest to check


def test_manifest_hash_changes_with_any_rebuild():
    a = mf.build_manifest("v1", rows=3, dimension=8, inputs=INPUTS, created="2026-01-01T00:00:00")
    b = mf.build_manifest("v1", rows=3, dimension=8, inputs=INPUTS, created="2026-01-01T00:00:01")
    assert mf.manifest_hash(a) == mf.manifest_hash(dict(reversed(list(a.items()))))  # canonical
    assert mf.manifest_hash(a) != mf.manifest_hash(b)


def test_index_config_hash_covers_what_builds_the_index_only(make_cfg):
    base = make_cfg()
    assert verdict.index_config_hash(base) == verdict.index_config_hash(make_cfg(**{"answer.adjacent": 0.3}))
    assert verdict.index_config_hash(base) != verdict.index_config_hash(make_cfg(**{"chunking.max_tokens": 128}))


def test_model_fingerprint_hashes_the_weights_not_the_id(tmp_path):
    folder = tmp_path / "model"
    (folder / "1_Pooling").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "1_Pooling" / "config.json").write_text('{"mode": "mean"}')
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    (folder / "README.md").write_text("docs")
    first = models.fingerprint(folder)
    assert first.startswith("sha256:") and models.fingerprint(folder) == first
    (folder / "README.md").write_text("other docs")
    assert models.fingerprint(folder) == first  # documentation is not the model
    (folder / "model.safetensors").write_bytes(b"\x01" + b"\x00" * 63)  # new weights, same size
    os.utime(folder / "model.safetensors", ns=(1, 1))
    assert models.fingerprint(folder) != first
    with pytest.raises(FileNotFoundError):
        models.fingerprint(tmp_path / "empty")


def test_a_model_fingerprint_is_stamped_and_hashed_again_when_a_file_is_rewritten(tmp_path, monkeypatch):
    # Another process reads the stamp instead of the weights; a rewrite in place, even with the size and mtime
    # put back, changes the file's ctime and so is hashed again.
    from sourcegate.pipelines.versions import manifest

    monkeypatch.setenv(models.FINGERPRINT_CACHE_ENV, str(tmp_path / "stamps"))
    folder = tmp_path / "model"
    folder.mkdir()
    weights = folder / "model.onnx"
    weights.write_bytes(b"\x00" * 64)
    first = models.fingerprint(folder)
    assert len(list((tmp_path / "stamps").iterdir())) == 1

    def unread(path):
        raise AssertionError(f"{path} was hashed")

    models._fingerprint.cache_clear()  # as a new process
    with monkeypatch.context() as m:
        m.setattr(manifest, "sha256_file", unread)
        assert models.fingerprint(folder) == first
    mtime = weights.stat().st_mtime_ns
    weights.write_bytes(b"\x01" + b"\x00" * 63)
    os.utime(weights, ns=(mtime, mtime))
    models._fingerprint.cache_clear()
    assert models.fingerprint(folder) != first
    monkeypatch.setenv(models.FINGERPRINT_CACHE_ENV, "off")
    models._fingerprint.cache_clear()
    assert models.fingerprint(tmp_path / "model") != first and len(list((tmp_path / "stamps").iterdir())) == 1


def test_embedding_cache_needs_the_same_id_and_the_same_fingerprint(tmp_path):
    rows, vectors = synthetic_chunks(tmp_path / "c.parquet", n=4)  # written with no fingerprint (nulls)
    path = tmp_path / "fp.parquet"
    pq.write_table(chunks_with_vectors(rows, vectors, "m", "sha256:a"), path)
    assert pq.read_table(path)["model_fingerprint"].to_pylist() == ["sha256:a"] * 4
    keys = pa.array([r["text_hash"] for r in rows])

    def cache(source, model_id, fingerprint, spill):  # what an embed shard reads of an earlier run
        return VectorCache.build(source, keys, model_id, fingerprint, tmp_path / spill, vectors.shape[1])

    hit = cache(path, "m", "sha256:a", "hit.tmp")
    assert sorted(hit.hashes.to_pylist()) == sorted(keys.to_pylist())
    np.testing.assert_array_equal(hit.vectors[hit.positions(keys)], vectors)
    for miss in (
        cache(path, "m", "sha256:b", "b.tmp"),  # same id, other weights: nothing reused
        cache(path, "other", "sha256:a", "other.tmp"),
        cache(tmp_path / "c.parquet", "m", "sha256:a", "none.tmp"),  # no fingerprint recorded: no reuse
    ):
        assert len(miss.hashes) == 0 and (miss.positions(keys) == -1).all()


# --- with the real model (marked): a night rerun reuses or refuses; new weights re-embed ----------------


def build_night(cfg, run_id, embedder):
    from sourcegate.pipelines.app import steps

    return steps.load_step(build_validated(cfg, run_id, embedder), cfg)


@pytest.mark.models
def test_rerunning_a_promoted_night_reuses_it_or_refuses_naming_what_differs(make_cfg, small_corpus, embedder):
    from sourcegate.pipelines.app import steps

    cfg = make_cfg(**{"corpus.path": str(small_corpus)})
    n = build_night(cfg, "r1", embedder)
    store = open_store(cfg)
    manifest = store.manifest("r1")
    assert manifest["rows"] == n and manifest["inputs"]["model_fingerprint"] == embedder.fingerprint
    assert manifest["inputs"]["chunker"] and manifest["inputs"]["code_version"]
    store.promote("r1")
    folder = RunFolder(cfg.artifacts, "r1").path
    info = json.loads((folder / "run.json").read_text())
    assert info["models"]["embedding"]["fingerprint"] == embedder.fingerprint
    assert info["index_version"] == {"manifest_sha256": mf.manifest_hash(manifest), "reused": False}

    assert build_night(cfg, "r1", embedder) == n  # the same night again: the live version is reused
    assert store.manifest("r1") == manifest and store.live() == "r1"
    assert json.loads((folder / "run.json").read_text())["index_version"]["reused"] is True

    documents = (folder / "documents.parquet").read_bytes()
    edited = sorted(small_corpus.glob("*.md"))[0]
    edited.write_text(edited.read_text() + "\nA sentence added after the night was built.\n")
    with pytest.raises(mf.VersionConflict, match="corpus_hash.*new run id"):
        steps.ingest_step(RunFolder(cfg.artifacts, "r1"), cfg)
    assert (folder / "documents.parquet").read_bytes() == documents  # the refused rerun wrote nothing
    assert not (folder / ".rerun-ingest").exists()
    with pytest.raises(mf.VersionConflict, match="config_hash"):
        steps.ingest_step(
            RunFolder(make_cfg(**{"corpus.path": str(small_corpus), "chunking.max_tokens": 128}).artifacts, "r1"),
            make_cfg(**{"corpus.path": str(small_corpus), "chunking.max_tokens": 128}),
        )
    assert store.manifest("r1") == manifest and store.open("r1").manifest == manifest


@pytest.mark.models
def test_same_model_id_with_other_weights_re_embeds_and_cannot_query_the_index(
    make_cfg, small_corpus, embedder, tmp_path
):
    from sourcegate.pipelines.app import steps

    cfg = make_cfg(**{"corpus.path": str(small_corpus)})
    n = build_night(cfg, "r1", embedder)
    # Another model_path under the same model id: the same weights (linked), one config file re-serialised.
    copy = tmp_path / "model-copy"
    for path in models.model_files(embedder.path):
        target = copy / path.relative_to(embedder.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.name == "config.json" and path.parent == embedder.path:
            target.write_text(json.dumps(json.loads(path.read_text()), indent=1))
        else:
            target.symlink_to(path)
    other_cfg = make_cfg(**{"corpus.path": str(small_corpus), "embedding.model_path": str(copy)})
    other = get_embedder(other_cfg.embedding)
    assert other.model_id == embedder.model_id and other.fingerprint != embedder.fingerprint
    steps.ingest_step(RunFolder(other_cfg.artifacts, "r2"), other_cfg)
    steps.chunk_step(RunFolder(other_cfg.artifacts, "r2"), other_cfg.chunking, other_cfg.embedding)
    stats = steps.embed_step(RunFolder(other_cfg.artifacts, "r2"), other_cfg.embedding, embedder=other)
    assert stats["encoded"] == n and stats["reused"] == 0  # nothing reused from r1's vectors
    with pytest.raises(mf.IntegrityError, match="model fingerprint"):
        retriever_for(other_cfg, open_store(cfg).open("r1"))


# --- verified on open without re-hashing (issue 22 item 7) -----------------------------------------


@pytest.fixture
def hash_reads(monkeypatch):
    """The files the SHA-256 check reads, counted by wrapping the one hash function every check calls."""
    read: list[str] = []
    real = mf.sha256_file

    def counting(path):
        read.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(mf, "sha256_file", counting)
    return read


def test_an_untouched_version_opens_without_reading_its_files(store, tmp_path, hash_reads):
    store.load("v1", str(tmp_path / "c.parquet"), inputs=INPUTS)
    files = set(store.manifest("v1")["files"])
    assert set(hash_reads) == files  # hashed in full at write, which leaves the stamp
    hash_reads.clear()
    for _ in range(3):
        store.open("v1")
    assert hash_reads == []
    store.promote("v1")  # promote and verify hash in full, whatever the stamp says
    assert set(hash_reads) == files
    hash_reads.clear()
    assert main(["verify", "v1", "--artifacts", str(tmp_path / "artifacts"), "--backend", "embedded"]) == 0
    assert set(hash_reads) == files


def test_a_rewrite_of_the_same_size_with_a_new_mtime_is_rehashed_and_caught(store, tmp_path, hash_reads):
    store.load("v1", str(tmp_path / "c.parquet"), inputs=INPUTS)
    store.open("v1")
    vocab = store.folder("v1") / "bm25_vocab.json"
    data = bytearray(vocab.read_bytes())
    data[5] ^= 0x01
    st = vocab.stat()
    vocab.write_bytes(bytes(data))
    os.utime(vocab, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert vocab.stat().st_size == st.st_size
    hash_reads.clear()
    with pytest.raises(mf.IntegrityError, match="bm25_vocab.json: SHA-256 differs"):
        store.open("v1")
    assert "bm25_vocab.json" in hash_reads


def test_a_rewrite_that_puts_the_mtime_back_is_still_caught(store, tmp_path):
    """`touch -d` can put the mtime back; the ctime (and here the inode, via a new file) it cannot."""
    store.load("v1", str(tmp_path / "c.parquet"), inputs=INPUTS)
    vocab = store.folder("v1") / "bm25_vocab.json"
    data, st = bytearray(vocab.read_bytes()), vocab.stat()
    data[5] ^= 0x01
    vocab.write_bytes(bytes(data))  # in place: same inode, same size
    os.utime(vocab, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (vocab.stat().st_ino, vocab.stat().st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    with pytest.raises(mf.IntegrityError, match="bm25_vocab.json: SHA-256 differs"):
        store.open("v1")


def test_a_stamp_for_another_manifest_is_not_a_proof(store, tmp_path, hash_reads):
    store.load("v1", str(tmp_path / "c.parquet"), inputs=INPUTS)
    path = store.folder("v1") / mf.MANIFEST_FILE
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "created": "2020-01-01T00:00:00+00:00"}))
    hash_reads.clear()
    store.open("v1")
    assert set(hash_reads) == set(manifest["files"])  # a new manifest hash: re-hashed, then stamped again
    hash_reads.clear()
    store.open("v1")
    assert hash_reads == []


def test_verify_repairs_a_run_json_that_lacks_promoted(store, tmp_path, capsys):
    """A crash after the promotions-log write leaves run.json without `promoted`: `verify` writes it from the log."""
    from sourcegate.pipelines.versions import promotions

    store.load("v1", str(tmp_path / "c.parquet"), inputs=INPUTS)
    store.promote("v1")
    store.log_promotion(promotions.promotion_record("v1", None, "sha256:g", "dag:nightly"))
    run_json = store.folder("v1").parent / "run.json"
    run_json.write_text(json.dumps({"run_id": "v1"}))
    artifacts = str(tmp_path / "artifacts")
    assert main(["verify", "v1", "--artifacts", artifacts, "--backend", "embedded"]) == 0
    assert "missing `promoted` written from the promotions log" in capsys.readouterr().out
    promoted = json.loads(run_json.read_text())["promoted"]
    assert promoted == {"version": "v1", "replaced": None, "actor": "dag:nightly"}
    assert main(["verify", "v1", "--artifacts", artifacts, "--backend", "embedded"]) == 0
    assert "promoted" not in capsys.readouterr().out  # nothing left to repair
