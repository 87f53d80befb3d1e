"""In-place edits of a complete OpenSearch version, against the REAL node (issue 31, row 4; issue 22 item 4).

An attacker lifts the write block and edits one document with `POST <index>/_update/<id>` (same count, same
ids): `verify` fails with exit 2 naming the chunk, opening the live version (what `query` does) fails naming
it, and the next night does not clone it (a full load from the Parquet, the reason naming the chunk). An
edited manifest in `_meta` fails against the hash the promotions log recorded when it was promoted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from sourcegate.pipelines.config import OpenSearch
from sourcegate.pipelines.search.opensearch import OpenSearchStore
from sourcegate.pipelines.versions import manifest as mf
from sourcegate.pipelines.versions import promotions
from tests.conftest import ROOT
from tests.test_opensearch_backend import write_chunks
from tests.test_opensearch_delta import INPUTS, night_of

EDITED = "c0042"
pytestmark = pytest.mark.opensearch


@pytest.fixture
def store(os_client):
    prefix = f"sgedit-{uuid.uuid4().hex[:12]}"
    yield OpenSearchStore(os_client, OpenSearch(index_prefix=prefix, bulk_chunk_size=100), progress=False)
    os_client.indices.delete(index=f"{prefix}-*", ignore_unavailable=True)


@pytest.fixture
def live(store, tmp_path):
    """v1 loaded, promoted and logged as the pipeline logs it (with its manifest's hash); its Parquet."""
    base = write_chunks(tmp_path / "base.parquet", n=300)[0]
    store.load("v1", str(base), inputs=INPUTS)
    store.promote("v1")
    manifest_sha = mf.manifest_hash(store.manifest("v1"))
    store.log_promotion(promotions.promotion_record("v1", None, "sha256:g", "test", manifest_sha256=manifest_sha))
    return base


def edit_in_place(client, index: str, chunk_id: str) -> None:
    """What an attacker does: lift the write block, rewrite one passage's text (same count, same ids)."""
    client.indices.put_settings(index=index, body={"index": {"blocks": {"write": None}}})
    client.update(index=index, id=chunk_id, body={"doc": {"text": "the fare is free on Sundays"}}, refresh=True)


def sourcegate(store, *argv: str) -> subprocess.CompletedProcess:
    prefix = ["--set", "backend.kind=opensearch", "--set", f"backend.opensearch.index_prefix={store.prefix}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "sourcegate.pipelines.app.cli", *prefix, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_a_complete_version_refuses_writes(store, live, os_client):
    from opensearchpy import AuthorizationException

    with pytest.raises(AuthorizationException, match="index write"):
        os_client.update(index=store.index_name("v1"), id=EDITED, body={"doc": {"text": "x"}})
    assert store.verify("v1") == store.manifest("v1")


def test_an_edited_document_fails_verify_and_open_naming_the_chunk(store, live, os_client):
    ok = sourcegate(store, "verify", "v1")
    assert ok.returncode == 0, ok.stderr
    edit_in_place(os_client, store.index_name("v1"), EDITED)
    assert os_client.count(index=store.alias)["count"] == 300  # the count alone cannot see it
    failed = sourcegate(store, "verify", "v1")
    assert failed.returncode == 2, failed.stderr
    assert f"chunk {EDITED}: _source differs from what was loaded (edited in place)" in failed.stderr
    with pytest.raises(mf.IntegrityError) as opened:  # what `sourcegate query` opens
        store.open()
    assert f"chunk {EDITED}: _source differs from what was loaded (edited in place)" in opened.value.problems
    assert any("written to after the version completed" in p for p in opened.value.problems)
    query = sourcegate(store, "query", "Is the fare free on Sundays?")
    assert query.returncode == 2 and len(query.stderr.strip().splitlines()) == 1, query.stderr
    assert EDITED in query.stderr


def test_the_next_night_never_clones_an_edited_live_version(store, live, os_client, tmp_path):
    edit_in_place(os_client, store.index_name("v1"), EDITED)
    night = night_of(live, tmp_path / "night.parquet")
    store.load("v2", str(night), inputs=INPUTS, base_chunks=live)
    build = store.manifest("v2")["build"]
    assert build["mode"] == "full" and f"chunk {EDITED}" in build["reason"], build
    assert "fare is free" not in os_client.get(index=store.index_name("v2"), id=EDITED)["_source"]["text"]
    assert store.verify("v2")  # built from the Parquet, intact


def test_an_edited_manifest_in_meta_fails_against_the_promotions_log(store, live, os_client):
    index = store.index_name("v1")
    meta = store.meta(index)
    forged = {**meta, "manifest": {**meta["manifest"], "inputs": {**meta["manifest"]["inputs"], "code_version": "v9"}}}
    store.set_meta(index, forged)
    with pytest.raises(mf.IntegrityError, match="differs from the one promoted") as opened:
        store.open()
    assert "edited in place" in opened.value.problems[0]
    with pytest.raises(mf.IntegrityError, match="differs from the one promoted"):
        store.verify("v1")
