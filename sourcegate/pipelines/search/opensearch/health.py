"""The night's pre-flight check on OpenSearch: a red cluster, or a block on what a night writes, fails it
before anything is written (a lock document, an index), naming the block and the way out.

A disk flood stage puts `read_only_allow_delete` on every index (the lock index and the promotions index
included) and can leave a persistent `cluster.blocks.create_index` behind after the disk is freed; both are
named here rather than found halfway through a night as a 429 from the bulk loader or the alias swap.
"""

from __future__ import annotations

from collections.abc import Mapping

from sourcegate.pipelines.search.opensearch.mapping import DEFAULT_PREFIX
from sourcegate.pipelines.versions.promotions import PROMOTIONS_INDEX

LOCK_INDEX = ".sourcegate-locks"  # the alias lock's documents (sourcegate/pipelines/release/lock.py)
WRITE_BLOCK_ID = "8"  # `index.blocks.write` ("index write (api)"): every complete version carries it (G1)
RECOVERY = "free disk, then clear the block (docs/operations.md: a full disk)"


class PreflightFailed(RuntimeError):
    """The node cannot take a night's writes (a red cluster, or a block on the indices it writes)."""


def concerns(index: str, prefix: str) -> bool:
    """Whether a night writes `index`: its versions, its promotions log, the lock index."""
    return index in (LOCK_INDEX, prefix) or index.startswith(f"{prefix}-")


def own_block(index: str, block_id: str, prefix: str) -> bool:
    """The write block a load puts on a version once it is complete: a night never writes there again (it
    loads a new index; a delta clones the live one), so it stops nothing. On the promotions log it would."""
    return block_id == WRITE_BLOCK_ID and index.startswith(f"{prefix}-") and index != f"{prefix}-{PROMOTIONS_INDEX}"


def blocks_in(state: Mapping, prefix: str) -> list[str]:
    """Each block that stops a night's writes, as '<where>: <description>', from `_cluster/state/blocks`."""
    blocks = state.get("blocks") or {}
    found = [f"cluster: {b.get('description')}" for b in (blocks.get("global") or {}).values()]
    for index, by_id in sorted((blocks.get("indices") or {}).items()):
        if concerns(index, prefix):
            found += [
                f"index {index}: {b.get('description')}" for i, b in by_id.items() if not own_block(index, i, prefix)
            ]
    return found


def free_disk(client) -> str:
    """Free disk per data node, for the refusal's message."""
    nodes = client.nodes.stats(metric="fs").get("nodes") or {}
    parts = []
    for node in nodes.values():
        total = (node.get("fs") or {}).get("total") or {}
        if total.get("total_in_bytes"):
            parts.append(
                f"{node.get('name')}: {total['available_in_bytes'] / 2**30:.1f} GiB free of "
                f"{total['total_in_bytes'] / 2**30:.1f} GiB"
            )
    return "; ".join(parts) or "free disk unknown"


def preflight(client, prefix: str = DEFAULT_PREFIX) -> None:
    """Raise PreflightFailed when the cluster is red or a block stops a night's writes."""
    health = client.cluster.health()
    if health.get("status") == "red":
        raise PreflightFailed(
            f"OpenSearch cluster {health.get('cluster_name')} is red ({health.get('unassigned_shards')} "
            "unassigned shards); a night would write to it: fix the cluster first"
        )
    blocks = blocks_in(client.cluster.state(metric="blocks"), prefix)
    if blocks:
        raise PreflightFailed(f"OpenSearch refuses writes: {'; '.join(blocks)} ({free_disk(client)}); {RECOVERY}")
