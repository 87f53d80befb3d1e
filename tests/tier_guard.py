"""The fast tier stays fast: a test that loads a model, talks to OpenSearch or runs an Airflow DAG
without the matching marker fails, and says which marker it needs.

Unmarked tests are `make check`'s tier, which runs without models, node or Airflow in under two
minutes. The guard wraps the setup and call phases of every test that lacks the marker and makes
the real entry points raise (a reranker that cannot load is swallowed and logged by design, so
every attempt is also recorded and fails the test afterwards). Fakes and deliberately broken model
paths (failure-path unit tests) are not the real models and pass through.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

# Session fixtures that load the real models (tests/conftest.py).
MODEL_FIXTURES = {"embedder", "cross_encoder", "demo_index"}
S3_FIXTURES = {"s3_server", "s3_env"}  # the session's moto server (tests/s3_server.py)


class UnmarkedHeavyUse(RuntimeError):
    """A test without the marker reached a model, the node or an Airflow run."""


def _markers(item) -> set[str]:
    return {m.name for m in item.iter_markers()}


def _model_patches(trip):
    from sourcegate.pipelines.build import embed, embed_backends
    from sourcegate.pipelines.retrieval import rerank

    cross_init = rerank.OnnxCrossEncoder.__init__
    st_cross_init = rerank.SentenceTransformersCrossEncoder.__init__

    def onnx_init(self, model_dir=None, *args, **kwargs):
        if model_dir is None:  # None = the packaged cross-encoder; an explicit (broken) path is a unit test
            trip("loads the cross-encoder", "models")
        cross_init(self, model_dir, *args, **kwargs)

    def st_cross_init_guarded(self, model_dir, *args, **kwargs):
        if Path(model_dir).is_dir():
            trip("loads a sentence-transformers cross-encoder", "models")
        st_cross_init(self, model_dir, *args, **kwargs)

    patches = [
        (embed.Embedder, "__init__", lambda *a, **k: trip("loads the embedding model", "models")),
        (embed.Embedder, "encode", lambda *a, **k: trip("embeds with the real model", "models")),
        (embed_backends, "ensure_export", lambda *a, **k: trip("exports the embedding model to ONNX", "models")),
        (embed_backends.OnnxEmbedder, "__init__", lambda *a, **k: trip("loads the ONNX embedding model", "models")),
        (rerank.OnnxCrossEncoder, "__init__", onnx_init),
        (rerank.OnnxCrossEncoder, "score", lambda *a, **k: trip("scores with the cross-encoder", "models")),
        (rerank.SentenceTransformersCrossEncoder, "__init__", st_cross_init_guarded),
    ]
    st = sys.modules.get("sentence_transformers")  # only if already imported: importing it costs seconds
    if st is not None:
        patches += [
            (st.SentenceTransformer, "__init__", lambda *a, **k: trip("loads a SentenceTransformer", "models")),
            (st.CrossEncoder, "__init__", lambda *a, **k: trip("loads a sentence-transformers CrossEncoder", "models")),
        ]
    return patches


def _opensearch_patches(trip):
    from opensearchpy.transport import Transport

    return [(Transport, "perform_request", lambda *a, **k: trip("sends a request to OpenSearch", "opensearch"))]


def _s3_patches(trip):
    from sourcegate.pipelines.versions.object_store import ObjectStore

    real = ObjectStore.from_uri.__func__

    def from_uri(cls, uri, fs=None):
        if fs is None:  # a filesystem handed in (a unit test of a failure path) is not the real server
            trip("connects to an S3 server", "s3")
        return real(cls, uri, fs)

    return [(ObjectStore, "from_uri", classmethod(from_uri))]


def _airflow_patches(trip):
    dag_module = sys.modules.get("airflow.sdk.definitions.dag")  # DAG runs happen in-process via dag.test()
    if dag_module is None:
        return []
    return [(dag_module.DAG, "test", lambda *a, **k: trip("runs a DAG (dag.test)", "airflow"))]


@contextmanager
def guarded(item):
    marks = _markers(item)
    trips: list[str] = []

    def trip(what: str, marker: str):
        msg = f"{item.nodeid} {what} without @pytest.mark.{marker}: mark the test (unmarked tests are the fast tier)"
        trips.append(msg)
        raise UnmarkedHeavyUse(msg)

    patches = []
    if "models" not in marks:
        patches += _model_patches(trip)
    if "opensearch" not in marks:
        patches += _opensearch_patches(trip)
    if "airflow" not in marks:
        patches += _airflow_patches(trip)
    if "s3" not in marks:
        patches += _s3_patches(trip)
    mp = pytest.MonkeyPatch()
    try:
        for owner, name, replacement in patches:
            mp.setattr(owner, name, replacement)
        yield trips
    finally:
        mp.undo()


def _check_fixtures(item) -> None:
    names = set(getattr(item, "fixturenames", ()))
    for fixtures, marker, what in ((MODEL_FIXTURES, "models", "the real models"), (S3_FIXTURES, "s3", "the S3 server")):
        wanted = fixtures & names
        if wanted and marker not in _markers(item):
            pytest.fail(
                f"{item.nodeid} uses {', '.join(sorted(wanted))} ({what}) without @pytest.mark.{marker}",
                pytrace=False,
            )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    _check_fixtures(item)  # before session fixtures load the model
    with guarded(item) as trips:
        result = yield
    if trips:
        pytest.fail("\n".join(trips), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with guarded(item) as trips:
        result = yield
    if trips:
        pytest.fail("\n".join(trips), pytrace=False)
    return result
