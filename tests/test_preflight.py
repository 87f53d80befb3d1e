"""The pre-flight check's reading of `_cluster/state/blocks` (sourcegate/pipelines/search/opensearch/health.py): the write block
every complete version carries is by design and stops no night (a second night on OpenSearch failed its pre-flight
check on it); any other block on what a night writes is named."""

from __future__ import annotations

from sourcegate.pipelines.search.opensearch.health import LOCK_INDEX, blocks_in

WRITE = {"8": {"description": "index write (api)", "retryable": False, "levels": ["write"]}}
FLOOD = {"12": {"description": "disk usage exceeded flood-stage watermark, index has read-only-allow-delete block"}}


def state(indices: dict, global_blocks: dict | None = None) -> dict:
    return {"blocks": {"indices": indices, **({"global": global_blocks} if global_blocks else {})}}


def test_the_write_block_of_a_complete_version_stops_no_night():
    assert blocks_in(state({"sg-20260101-020000": WRITE, "sg-20260102-020000": WRITE}), "sg") == []


def test_a_write_block_on_the_promotions_log_or_the_lock_index_is_named():
    found = blocks_in(state({"sg-_promotions": WRITE, LOCK_INDEX: WRITE}), "sg")
    assert found == [f"index {LOCK_INDEX}: index write (api)", "index sg-_promotions: index write (api)"]


def test_a_flood_stage_on_a_version_and_a_global_block_are_named_and_other_prefixes_ignored():
    found = blocks_in(
        state({"sg-20260101-020000": {**WRITE, **FLOOD}, "other-v1": FLOOD}, {"3": {"description": "create-index"}}),
        "sg",
    )
    assert found == ["cluster: create-index", f"index sg-20260101-020000: {FLOOD['12']['description']}"]
