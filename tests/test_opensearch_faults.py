"""OpenSearch under faults that would break the shared node, each on a private node (tests/private_node.py):
a disk flood stage set by transient cluster settings, and the persistent create-index block it leaves. The
night fails its pre-flight check with exit 2, one line naming the blocks and the recovery, and writes nothing;
the recovery in docs/operations.md (free disk, clear the index blocks, clear the create-index block) lets the
next night pass the check."""

from __future__ import annotations

import time

import pytest

from sourcegate.pipelines.app import cli
from sourcegate.pipelines.search.opensearch.health import LOCK_INDEX, preflight
from tests.private_node import private_node

pytestmark = pytest.mark.opensearch

PREFIX = "sg-faults"
FLOOD = {  # every watermark at 1% used: any real disk is past the flood stage
    "cluster.routing.allocation.disk.threshold_enabled": True,
    "cluster.routing.allocation.disk.watermark.low": "1%",
    "cluster.routing.allocation.disk.watermark.high": "1%",
    "cluster.routing.allocation.disk.watermark.flood_stage": "1%",
    "cluster.info.update.interval": "10s",  # the node's minimum
}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from opensearchpy import OpenSearch

    with private_node(tmp_path_factory.mktemp("private-node")) as url:
        yield url, OpenSearch(hosts=[url], timeout=30)


def flood(client) -> None:
    """Reach the flood stage; wait (bounded) until the node has blocked the lock index."""
    client.cluster.put_settings(body={"transient": FLOOD})
    for _ in range(60):
        blocks = client.cluster.state(metric="blocks")["blocks"].get("indices", {})
        if "12" in blocks.get(LOCK_INDEX, {}):
            return
        time.sleep(1)
    raise AssertionError(f"no flood-stage block after 60 s: {blocks}")


def recover(client) -> None:
    """docs/operations.md, "a full disk": free disk (here: drop the low watermarks), clear the index blocks,
    then the persistent create-index block the flood stage left."""
    client.cluster.put_settings(body={"transient": {key: None for key in FLOOD}})
    client.indices.put_settings(
        index="_all", body={"index.blocks.read_only_allow_delete": None}, expand_wildcards="all"
    )
    client.cluster.put_settings(body={"persistent": {"cluster.blocks.create_index": None}})


def night(url: str, artifacts, monkeypatch) -> int:
    monkeypatch.setenv("OPENSEARCH_URL", url)
    args = ["--set", f"backend.opensearch.index_prefix={PREFIX}", "run", "--backend", "opensearch"]
    return cli.main([*args, "--artifacts", str(artifacts), "--quiet"])


def test_a_flood_stage_fails_the_night_early_with_exit_2_and_writes_nothing(node, tmp_path, monkeypatch, capsys):
    url, client = node
    client.indices.create(index=LOCK_INDEX)  # as after earlier nights
    client.indices.create(index=f"{PREFIX}-_promotions")
    try:
        flood(client)
        code = night(url, tmp_path / "artifacts", monkeypatch)
        err = capsys.readouterr().err
        assert code == 2
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith("sourcegate: OpenSearch refuses writes: ")
        assert f"index {LOCK_INDEX}: disk usage exceeded flood-stage watermark" in err
        assert "free disk, then clear the block" in err and "nothing was written" in err
        assert not (tmp_path / "artifacts").exists()  # not even the lock file
        assert client.search(index=LOCK_INDEX)["hits"]["total"]["value"] == 0  # no lock document
        assert not client.indices.exists_alias(name=PREFIX)
    finally:
        recover(client)
    preflight(client, PREFIX)  # the documented recovery leaves nothing blocking the next night


def test_the_create_index_block_a_flood_stage_leaves_is_named(node, tmp_path, monkeypatch, capsys):
    url, client = node
    client.cluster.put_settings(body={"persistent": {"cluster.blocks.create_index": True}})
    try:
        code = night(url, tmp_path / "artifacts", monkeypatch)
    finally:
        client.cluster.put_settings(body={"persistent": {"cluster.blocks.create_index": None}})
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("sourcegate: OpenSearch refuses writes: cluster: cluster create-index blocked (api)")
    assert client.indices.get(index=f"{PREFIX}-2*", ignore_unavailable=True) == {}
