"""The OpenSearch backend against a REAL node (scripts/opensearch start), plus client unit tests.

Tests marked `opensearch` FAIL (they do not skip) when no node answers at OPENSEARCH_URL:
`make test` starts one.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opensearchpy import AuthorizationException

from sourcegate.pipelines.config import OpenSearch
from sourcegate.pipelines.search import retain
from sourcegate.pipelines.search.analyzer import analyze, opensearch_analysis
from sourcegate.pipelines.search.bm25 import K1, B, BM25Index
from sourcegate.pipelines.search.opensearch import OpenSearchStore, index_body
from sourcegate.pipelines.search.opensearch.client import client_from_env, config_from_env
from sourcegate.pipelines.versions.manifest import VersionConflict

DIM = 384
N_CHUNKS = 300
RARE = "zyxoquartz"
WORDS = [
    "river",
    "stone",
    "forest",
    "light",
    "cloud",
    "ember",
    "quiet",
    "signal",
    "harbor",
    "meadow",
    "copper",
    "lantern",
    "orbit",
    "thistle",
    "granite",
    "echo",
    "willow",
    "summit",
    "canyon",
    "prairie",
    "beacon",
    "falcon",
]


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def store(os_client):
    prefix = f"sgtest-{uuid.uuid4().hex[:12]}"
    s = OpenSearchStore(os_client, OpenSearch(index_prefix=prefix), progress=False, backoff_s=(0.01, 0.05))
    yield s
    names = list(os_client.indices.get(index=f"{prefix}-*").keys())
    if names:
        os_client.indices.delete(index=",".join(names))


def write_chunks(path: Path, n: int = N_CHUNKS, seed: int = 7) -> tuple[Path, np.ndarray, list[str], list[str]]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = [f"c{i:04d}" for i in range(n)]
    texts = []
    for i in range(n):
        words = list(rng.choice(WORDS, size=12))
        if i % 10 == 3:
            words[int(rng.integers(len(words)))] = RARE
        texts.append(" ".join(words))
    table = pa.table(
        {
            "chunk_id": pa.array(ids),
            "doc_id": pa.array([f"d{i // 3:03d}" for i in range(n)]),
            "title": pa.array([f"Document {i // 3}" for i in range(n)]),
            "section": pa.array([f"Section {i % 3}" for i in range(n)]),
            "text": pa.array(texts),
            "text_hash": pa.array([f"h{i}" for i in range(n)]),
            "ordinal": pa.array([i % 3 for i in range(n)], pa.int32()),
            "model_id": pa.array(["test-model"] * n),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel(), pa.float32()), DIM),
        }
    )
    pq.write_table(table, path)
    return path, vectors, ids, texts


@pytest.fixture(scope="module")
def chunks_parquet(tmp_path_factory):
    return write_chunks(tmp_path_factory.mktemp("os") / "chunks.parquet")


@pytest.fixture(scope="module")
def small_parquet(tmp_path_factory):
    return write_chunks(tmp_path_factory.mktemp("os_small") / "chunks.parquet", n=20, seed=3)[0]


# --- mapping (no node) ----------------------------------------------------------------------------


def _knn_vectors(node, path="$"):
    if isinstance(node, dict):
        if node.get("type") == "knn_vector":
            yield path, node
        for key, value in node.items():
            yield from _knn_vectors(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _knn_vectors(value, f"{path}[{i}]")


def test_every_knn_vector_uses_the_lucene_engine():
    body = index_body(DIM)
    vectors = list(_knn_vectors(body))
    assert vectors, "index_body has no knn_vector field"
    for path, field in vectors:
        method = field.get("method", {})
        assert method.get("engine") == "lucene", f"{path}: engine {method.get('engine')!r} (must be lucene)"
        assert method.get("name") == "hnsw" and method.get("space_type") == "cosinesimil", path
        assert field["dimension"] == DIM
    assert body["settings"]["index"]["knn"] is True
    props = body["mappings"]["properties"]
    assert props["text"]["similarity"] == "okapi"  # BM25 with the embedded backend's k1/b
    okapi = body["settings"]["index"]["similarity"]["okapi"]
    assert okapi == {"type": "BM25", "k1": K1, "b": B}
    assert props["text"]["analyzer"] == "sourcegate_en"
    assert body["settings"]["index"]["analysis"] == opensearch_analysis()


# --- against the real node ------------------------------------------------------------------------


@pytest.mark.opensearch
def test_load_counts_and_marks_complete(store, chunks_parquet, os_client):
    path, _, _, _ = chunks_parquet
    assert store.load("20260101T000000", str(path)) == N_CHUNKS
    index = store.index_name("20260101T000000")
    assert os_client.count(index=index)["count"] == N_CHUNKS
    mapping = os_client.indices.get_mapping(index=index)[index]["mappings"]
    assert mapping["properties"]["embedding"]["method"]["engine"] == "lucene"
    assert mapping["_meta"]["sourcegate"]["status"] == "complete"
    settings = os_client.indices.get_settings(index=index)[index]["settings"]["index"]
    assert settings["refresh_interval"] == "1s" and settings["number_of_replicas"] == "0"
    assert store.versions() == ["20260101T000000"]
    assert store.live() is None


@pytest.mark.opensearch
def test_knn_matches_exact_cosine(store, chunks_parquet):
    path, vectors, ids, _ = chunks_parquet
    store.load("v1", str(path))
    searcher = store.open("v1")
    rng = np.random.default_rng(11)
    queries = [vectors[5], vectors[123]] + [rng.standard_normal(DIM).astype(np.float32) for _ in range(5)]
    for q in queries:
        q = q / np.linalg.norm(q)
        exact = vectors.astype(np.float64) @ q.astype(np.float64)
        top = np.argsort(-exact)[:10]
        exact_ids = {ids[i] for i in top}
        hits = searcher.knn(q, 10)
        assert len(hits) == 10
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert len(exact_ids & {h.chunk_id for h in hits}) >= 9
        for h in hits:
            assert abs(h.score - exact[ids.index(h.chunk_id)]) < 1e-4, h
        assert abs(searcher.best_cosine(q) - exact[top[0]]) < 1e-4
    # a stored vector finds itself with cosine 1
    assert searcher.knn(vectors[42], 1)[0].chunk_id == ids[42]
    assert abs(searcher.best_cosine(vectors[42]) - 1.0) < 1e-4


@pytest.mark.opensearch
def test_bm25_and_distribution(store, chunks_parquet):
    path, _, ids, texts = chunks_parquet
    store.load("v1", str(path))
    searcher = store.open("v1")
    containing = {ids[i] for i, t in enumerate(texts) if RARE in t.split()}
    assert containing
    hits = searcher.bm25(RARE, 100)
    assert {h.chunk_id for h in hits} == containing
    assert all(h.score > 0 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    top = searcher.bm25(RARE, 5)
    assert len(top) == 5 and all(RARE in c["text"] for c in searcher.chunks([h.chunk_id for h in top]))

    dist = searcher.bm25_distribution(RARE)
    assert dist.matched == len(containing) and dist.total == N_CHUNKS
    assert len(dist.scores) == len(containing)
    assert np.isclose(dist.scores.max(), hits[0].score)
    assert dist.zscore(hits[0].score) > 0
    capped = OpenSearchStore(store.client, OpenSearch(index_prefix=store.prefix, distribution_size=10)).open("v1")
    common = capped.bm25_distribution("river")
    assert len(common.scores) == 10 and common.matched > 10 and common.total == N_CHUNKS


def demo_passages(n: int = 120) -> list[str]:
    """Real prose of varied lengths (3 to ~300 words): paragraphs of the demo articles."""
    root = Path(__file__).resolve().parents[1] / "corpus" / "demo"
    paragraphs = [p for f in sorted(root.glob("*.md")) for p in f.read_text(encoding="utf-8").split("\n\n")]
    passages = [p for p in paragraphs if len(p.split()) >= 3]
    merged = [" ".join(passages[i : i + 1 + i % 4]) for i in range(0, len(passages), 2)]  # some long ones
    return (merged + ["Ｆｕｌｌ-width ＦＡＱ and the \ufb01rst café tickets, x² ½"])[:n]


@pytest.mark.opensearch
def test_analyser_and_bm25_scores_equal_the_embedded_backend(store, tmp_path, os_client):
    texts = demo_passages()
    table = pq.read_table(write_chunks(tmp_path / "c.parquet", n=len(texts))[0])
    table = table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts))
    pq.write_table(table, tmp_path / "demo.parquet")
    store.load("v1", str(tmp_path / "demo.parquet"))
    index = store.index_name("v1")
    for t in texts[:40] + [texts[-1]]:
        tokens = os_client.indices.analyze(index=index, body={"analyzer": "sourcegate_en", "text": t})["tokens"]
        assert [x["token"] for x in tokens] == analyze(t)
    ids = table["chunk_id"].to_pylist()
    embedded = BM25Index.from_texts(texts)
    searcher = store.open("v1")
    for query in ["How do I get a refund for a cancelled ticket?", "bikes on board", "FAQ café", "night bus"]:
        expected = embedded.scores(query)
        hits = searcher.bm25(query, len(texts))
        assert {h.chunk_id for h in hits} == {ids[i] for i in np.flatnonzero(expected > 0)}, query
        for h in hits:  # Lucene scores in float32
            assert abs(h.score - expected[ids.index(h.chunk_id)]) <= 1e-5 * max(1.0, h.score), (query, h)


@pytest.mark.opensearch
def test_document_frequencies_equal_the_embedded_backend(store, tmp_path):
    """The answerability signal's rarity weights read the same counts on both backends (G7)."""
    texts = demo_passages()
    table = pq.read_table(write_chunks(tmp_path / "c.parquet", n=len(texts))[0])
    table = table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts))
    pq.write_table(table, tmp_path / "demo.parquet")
    store.load("v1", str(tmp_path / "demo.parquet"))
    embedded = BM25Index.from_texts(texts)
    words = ["bike", "bikes", "refund", "night", "fare", "seniors", "ticket", "reduced-fare", "the", RARE, "taxi", "x²"]
    n, got = store.open("v1").document_frequencies(words)
    want = {w: embedded.document_frequency(w) for w in words}
    assert n == embedded.size == len(texts) and got == want
    assert want["bike"] == want["bikes"] > 0 and want["the"] == want[RARE] == 0  # stemmed; empty or unseen: 0
    assert len({f for f in want.values() if f}) > 3  # varied counts, so the comparison can fail


@pytest.mark.opensearch
def test_hybrid_is_one_round_trip_and_answers_as_the_single_calls(store, chunks_parquet, monkeypatch):
    """The batched hybrid query: one _msearch, the same lists, stored fields, best cosine and document
    frequencies as the protocol's single calls, and the z-score of the FULL distribution (exact moments)."""
    from sourcegate.pipelines.search.base import hybrid_by_calls

    path, vectors, _, _ = chunks_parquet
    store.load("v1", str(path))
    searcher = store.open("v1")
    full = OpenSearchStore(store.client, OpenSearch(index_prefix=store.prefix, distribution_size=N_CHUNKS)).open("v1")
    requests = []
    perform = store.client.transport.perform_request
    monkeypatch.setattr(
        store.client.transport, "perform_request", lambda *a, **k: requests.append(a[:2]) or perform(*a, **k)
    )
    for query, vector in (
        (f"river {RARE}", vectors[3]),
        ("stone light cloud", vectors[77]),
        ("nothing-matches", vectors[0]),
    ):
        requests.clear()
        terms = query.split()
        got = searcher.hybrid(query, vector, 18, 18, terms)
        assert len(requests) == 1 and requests[0][1].endswith("/_msearch"), requests
        want = hybrid_by_calls(full, query, vector, 18, 18, terms)
        assert got.document_frequencies == want.document_frequencies and set(got.document_frequencies) == set(terms)
        assert got.bm25 == want.bm25 and [h.chunk_id for h in got.knn] == [h.chunk_id for h in want.knn]
        assert got.stored == want.stored and "embedding" not in next(iter(got.stored.values()))
        assert got.best_cosine == pytest.approx(want.best_cosine, abs=1e-6)
        assert (got.distribution.matched, got.distribution.total) == (want.distribution.matched, N_CHUNKS)
        assert len(want.distribution.scores) == want.distribution.matched  # the full distribution
        top = got.bm25[0].score if got.bm25 else 0.0
        assert got.distribution.zscore(top) == pytest.approx(want.distribution.zscore(top), abs=1e-4)
    assert not got.bm25 and got.distribution.matched == 0 and got.distribution.zscore(0.0) == 0.0


@pytest.mark.opensearch
def test_chunks_in_order(store, chunks_parquet):
    path, _, ids, texts = chunks_parquet
    store.load("v1", str(path))
    searcher = store.open("v1")
    wanted = [ids[9], ids[2], ids[250], ids[2]]
    got = searcher.chunks(wanted)
    assert [c["chunk_id"] for c in got] == wanted
    assert got[0]["text"] == texts[9] and got[0]["doc_id"] == "d003" and got[0]["section"] == "Section 0"
    assert "embedding" not in got[0]
    assert searcher.chunks([]) == []
    with pytest.raises(KeyError):
        searcher.chunks([ids[0], "no-such-chunk"])


@pytest.mark.opensearch
def test_promote_moves_alias_atomically(store, small_parquet, os_client, monkeypatch):
    with pytest.raises(FileNotFoundError):
        store.open()
    store.load("v1", str(small_parquet))
    store.load("v2", str(small_parquet))
    store.promote("v1")
    assert store.live() == "v1"
    assert list(os_client.indices.get_alias(name=store.alias)) == [store.index_name("v1")]
    assert len(store.open().knn(np.ones(DIM, np.float32) / np.sqrt(DIM), 3)) == 3

    # one _aliases request holding both the remove and the add
    calls = []
    real = os_client.indices.update_aliases

    def spy(*args, **kwargs):
        calls.append(kwargs.get("body"))
        return real(*args, **kwargs)

    monkeypatch.setattr(os_client.indices, "update_aliases", spy)
    store.promote("v2")
    monkeypatch.undo()
    assert len(calls) == 1
    assert calls[0]["actions"] == [
        {"remove": {"index": store.index_name("v1"), "alias": store.alias}},
        {"add": {"index": store.index_name("v2"), "alias": store.alias}},
    ]
    assert store.live() == "v2"
    assert list(os_client.indices.get_alias(name=store.alias)) == [store.index_name("v2")]

    # while the alias flips back and forth, a reader always sees exactly one index behind it
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(len(os_client.indices.get_alias(name=store.alias)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(10):
            store.promote("v1" if i % 2 == 0 else "v2")
    finally:
        stop.set()
        watcher.join()
    assert seen and set(seen) == {1}
    assert store.live() == "v2"


@pytest.mark.opensearch
def test_retention_keeps_n_and_never_the_live_one(store, small_parquet):
    for v in ("20260101", "20260102", "20260103", "20260104"):
        store.load(v, str(small_parquet))
    assert store.versions() == ["20260101", "20260102", "20260103", "20260104"]
    store.promote("20260101")
    assert retain(store, 2) == ["20260102"]
    assert store.versions() == ["20260101", "20260103", "20260104"]
    assert store.live() == "20260101"
    store.promote("20260104")
    assert retain(store, 1) == ["20260101", "20260103"]
    assert store.versions() == ["20260104"]
    assert retain(store, 0) == []  # the live one survives even keep=0
    assert store.versions() == ["20260104"]


@pytest.mark.opensearch
def test_drop_refuses_live(store, small_parquet):
    store.load("v1", str(small_parquet))
    store.promote("v1")
    with pytest.raises(ValueError, match="live"):
        store.drop("v1")
    assert store.versions() == ["v1"]
    before = store.manifest("v1")
    with pytest.raises(VersionConflict, match="refusing to rebuild index version v1: it is the live version"):
        store.load("v1", str(small_parquet))  # never rebuild what is being served (G1, search.base)
    assert store.manifest("v1") == before and store.live() == "v1"


@pytest.mark.opensearch
def test_run_id_versions_are_sanitised_but_kept(store, small_parquet, os_client):
    version = "scheduled__2026-01-02T03:04:05+00:00"
    assert store.load(version, str(small_parquet)) == 20
    index = store.index_name(version)
    assert index == f"{store.prefix}-scheduled__2026-01-02t03-04-05-00-00"
    assert os_client.indices.exists(index=index)
    store.promote(version)
    assert store.versions() == [version] and store.live() == version
    # reloading a complete version that is not live reuses it (idempotent rerun; never a rebuild)
    store.load("again", str(small_parquet))
    assert store.load("again", str(small_parquet)) == 20


@pytest.mark.opensearch
def test_bulk_retries_429_and_5xx(store, chunks_parquet, monkeypatch):
    from opensearchpy import TransportError

    path = chunks_parquet[0]
    real = store.client.bulk
    failures = iter(
        [TransportError(429, "simulated too many requests", {}), TransportError(503, "simulated unavailable", {})]
    )
    calls = []

    def flaky_bulk(*args, **kwargs):
        calls.append(1)
        err = next(failures, None)
        if err is not None:
            raise err
        return real(*args, **kwargs)

    monkeypatch.setattr(store.client, "bulk", flaky_bulk)
    assert store.load("v1", str(path)) == N_CHUNKS
    assert len(calls) == 2 + 1  # 300 rows = one chunk of 500, tried three times


@pytest.mark.opensearch
def test_connection_lost_mid_load_raises_and_never_promotes(store, chunks_parquet, small_parquet, monkeypatch):
    from opensearchpy import ConnectionError as OSConnectionError

    store.load("good", str(small_parquet))
    store.promote("good")
    path = chunks_parquet[0]
    store.bulk.chunk_size = 100  # three bulk requests: the second dies
    real = store.client.bulk
    calls = []

    def dying_bulk(*args, **kwargs):
        calls.append(1)
        if len(calls) >= 2:
            raise OSConnectionError("N/A", "simulated connection loss", Exception("connection refused"))
        return real(*args, **kwargs)

    monkeypatch.setattr(store.client, "bulk", dying_bulk)
    with pytest.raises(RuntimeError, match="lost the connection"):
        store.load("broken", str(path))
    monkeypatch.undo()
    assert store.live() == "good"
    with pytest.raises(RuntimeError, match="refusing to promote"):
        store.promote("broken")
    assert store.live() == "good"


@pytest.mark.opensearch
def test_count_mismatch_is_a_clear_error(store, tmp_path):
    path, _, _, _ = write_chunks(tmp_path / "dup.parquet", n=10)
    table = pq.read_table(path)
    pq.write_table(pa.concat_tables([table, table.slice(0, 2)]), path)  # two duplicate chunk ids
    with pytest.raises(RuntimeError, match=r"_count is 10 .* has 12 rows"):
        store.load("dup", str(path))
    with pytest.raises(RuntimeError, match="refusing to promote"):
        store.promote("dup")


# --- client configuration (no node) ---------------------------------------------------------------

SECRET = "s3cr3t-Pa55word"


def test_client_from_env_reads_the_variables(caplog):
    env = {
        "OPENSEARCH_URL": "https://search.example.org:9243/",
        "OPENSEARCH_USER": "indexer",
        "OPENSEARCH_PASSWORD": SECRET,
        "OPENSEARCH_VERIFY_CERTS": "false",
        "OPENSEARCH_CA_CERTS": "/etc/ssl/certs/ca.pem",
    }
    cfg = config_from_env(env)
    assert cfg.url == "https://search.example.org:9243"
    assert (cfg.user, cfg.password, cfg.verify_certs, cfg.ca_certs) == (
        "indexer",
        SECRET,
        False,
        "/etc/ssl/certs/ca.pem",
    )
    kwargs = cfg.client_kwargs()
    assert kwargs["http_auth"] == ("indexer", SECRET)
    assert kwargs["use_ssl"] is True and kwargs["verify_certs"] is False
    assert kwargs["ca_certs"] == "/etc/ssl/certs/ca.pem"
    assert SECRET not in repr(cfg) and SECRET not in str(cfg) and "***" in repr(cfg)

    with caplog.at_level(logging.DEBUG):
        client = client_from_env(env)
    assert SECRET not in caplog.text
    assert SECRET not in repr(client)
    conn = client.transport.connection_pool.connections[0]
    assert conn.host == "https://search.example.org:9243"


def test_client_from_env_defaults_and_errors():
    cfg = config_from_env({})
    assert cfg.url == "http://127.0.0.1:9200" and cfg.user is None and cfg.password is None
    assert cfg.verify_certs is True
    assert "http_auth" not in cfg.client_kwargs() and "use_ssl" not in cfg.client_kwargs()
    assert config_from_env({"OPENSEARCH_URL": "https://h:9200"}).client_kwargs()["verify_certs"] is True
    with pytest.raises(ValueError, match="OPENSEARCH_VERIFY_CERTS"):
        config_from_env({"OPENSEARCH_VERIFY_CERTS": "maybe"})
    with pytest.raises(ValueError, match="OPENSEARCH_URL"):
        config_from_env({"OPENSEARCH_URL": "ftp://h"})
    # a password inside the URL is redacted too
    cfg = config_from_env({"OPENSEARCH_URL": f"https://admin:{SECRET}@h:9200"})
    assert SECRET not in repr(cfg) and "admin:***@h:9200" in repr(cfg)


def test_airflow_is_imported_only_when_asked_for():
    code = (
        "import sys, sourcegate.pipelines.search.opensearch.client, sourcegate.pipelines.search.opensearch; "
        "sys.exit(any(m == 'airflow' or m.startswith('airflow.') for m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[1]
    assert subprocess.run([sys.executable, "-c", code], cwd=root).returncode == 0


@pytest.mark.airflow  # Airflow itself, in a fresh interpreter
def test_client_from_airflow_uses_the_connection(tmp_path):
    """OpenSearchHook builds the client from AIRFLOW_CONN_OPENSEARCH_DEFAULT (no node contacted)."""
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)\n"
        "from sourcegate.pipelines.search.opensearch.client import client_from_airflow\n"
        "c = client_from_airflow()\n"
        "conn = c.transport.connection_pool.connections[0]\n"
        "t = c.transport\n"
        "print(conn.host, repr(c), conn.timeout, t.max_retries, t.retry_on_timeout, bool(getattr(getattr(conn, 'session', None), 'verify', None)))\n"
    )
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW_CONN_OPENSEARCH_DEFAULT": f"opensearch://indexer:{SECRET}@search.internal:9201",
    }
    root = Path(__file__).resolve().parents[1]

    def client_line(env: dict) -> str:
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert SECRET not in proc.stdout and SECRET not in proc.stderr
        return proc.stdout

    out = client_line(env)
    assert "http://search.internal:9201" in out and out.split()[-4:-1] == ["60", "3", "True"]  # the CLI's defaults
    tls = {**env, "AIRFLOW_CONN_OPENSEARCH_DEFAULT": env["AIRFLOW_CONN_OPENSEARCH_DEFAULT"] + "?use_ssl=true"}
    assert client_line(tls).split()[-1] == "True"  # certificates verified unless the connection says otherwise
    unverified = {
        **env,
        "AIRFLOW_CONN_OPENSEARCH_DEFAULT": tls["AIRFLOW_CONN_OPENSEARCH_DEFAULT"] + "&verify_certs=false",
    }
    assert client_line(unverified).split()[-1] == "False"
    undefined = {k: v for k, v in env.items() if k != "AIRFLOW_CONN_OPENSEARCH_DEFAULT"}
    out = client_line({**undefined, "OPENSEARCH_URL": "http://from-env.internal:9203"})
    assert "http://from-env.internal:9203" in out  # the default connection undefined: the environment, as the CLI


@pytest.mark.opensearch
def test_manifest_in_meta_reuse_refusal_and_verify(store, small_parquet, os_client):
    from sourcegate.pipelines.search.opensearch import ids_checksum
    from sourcegate.pipelines.versions.manifest import IntegrityError, VersionConflict

    inputs = {"corpus_hash": "c1", "config_hash": "k1", "model_fingerprint": "sha256:m", "code_version": "v1"}
    assert store.manifest("v1") is None
    assert store.load("v1", str(small_parquet), inputs=inputs) == 20
    manifest = store.manifest("v1")
    ids = pq.read_table(small_parquet)["chunk_id"].to_pylist()
    assert manifest["rows"] == 20 and manifest["dimension"] == DIM and manifest["inputs"] == inputs
    assert manifest["ids_sha256"] == ids_checksum(ids) and manifest["index"] == store.index_name("v1")
    assert store.verify("v1") == manifest and store.open("v1").manifest == manifest
    assert store.load("v1", str(small_parquet), inputs=inputs) == 20  # same inputs: reused, not rebuilt
    assert store.manifest("v1") == manifest
    with pytest.raises(VersionConflict, match="code_version: 'v1' -> 'v2'"):
        store.load("v1", str(small_parquet), inputs={**inputs, "code_version": "v2"})
    # a complete version is write-blocked: a document cannot be removed behind the store's back ...
    index = store.index_name("v1")
    with pytest.raises(AuthorizationException, match="index write"):
        os_client.delete(index=index, id=ids[0], refresh=True)
    # ... unless the block is lifted first, as an attacker would: the count no longer matches the manifest
    unblock(os_client, index)
    os_client.delete(index=index, id=ids[0], refresh=True)
    with pytest.raises(IntegrityError, match="_count is 19, manifest says 20"):
        store.open("v1")
    with pytest.raises(IntegrityError, match="refusing to promote"):
        store.promote("v1")
    assert store.live() is None
    # ... and one put back under another id: the count matches again; the shards' max_seq_no and the ids do not
    body = {"chunk_id": "intruder", "doc_id": "x", "title": "t", "section": "s", "text": "x", "embedding": [0.1] * DIM}
    os_client.index(index=index, id="intruder", body=body, refresh=True)
    with pytest.raises(IntegrityError, match="written to after the version completed") as opened:
        store.open("v1")
    assert "chunk intruder: not in the version as loaded" in opened.value.problems
    assert f"chunk {ids[0]}: missing" in opened.value.problems
    with pytest.raises(IntegrityError, match="chunk ids differ"):
        store.verify("v1")


def unblock(os_client, index: str) -> None:
    os_client.indices.put_settings(index=index, body={"index": {"blocks": {"write": None}}})


@pytest.mark.opensearch
def test_promotions_log_is_a_small_index_beside_the_versions(store, small_parquet):
    from sourcegate.pipelines.versions import promotions

    assert store.promotions() == []
    store.load("v1", str(small_parquet))
    store.promote("v1")
    store.log_promotion(promotions.promotion_record("v1", None, "sha256:g1", "cli"))
    store.log_promotion(promotions.promotion_record("v2", "v1", "sha256:g2", "dag:manual__1"))
    log = store.promotions()
    assert [(r["version"], r["previous"], r["actor"]) for r in log] == [
        ("v1", None, "cli"),
        ("v2", "v1", "dag:manual__1"),
    ]
    assert store.versions() == ["v1"]  # the log index is not a version
    with pytest.raises(ValueError, match="reserved"):
        store.index_name("_promotions")
