"""What a complete OpenSearch version holds, as digests the node cannot change alone (G2).

Per chunk: the SHA-256 of its ``_source`` as loaded (the fields canonical JSON, the embedding as float32
bytes). Per version: ``content_sha256`` over the sorted (chunk_id, digest) pairs, computed from the Parquet
at load and kept in the manifest, whose own hash is in the promotions log and the verdict. Checking it
reads every ``_source`` (``verify``, and before a delta clones the live version); opening a version checks
the cheap proof instead: each primary shard's ``max_seq_no``, which any write after completion moves.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import pyarrow.parquet as pq

from sourcegate.pipelines.search.opensearch.bulk import document_sources

SCAN_PAGE = 2_000  # documents per scroll page when reading `_source` (embeddings make pages large)


def chunk_digest(source: Mapping) -> str:
    """SHA-256 of one document's `_source`: its fields as canonical JSON, then its embedding's float32 bytes."""
    fields = {k: v for k, v in source.items() if k != "embedding"}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
    digest.update(np.asarray(source.get("embedding") or [], dtype=np.float32).tobytes())
    return digest.hexdigest()


def content_checksum(digests: Mapping[str, str]) -> str:
    """SHA-256 over the sorted (chunk_id, digest) pairs: a version's content, independent of load order."""
    total = hashlib.sha256()
    for chunk_id in sorted(digests):
        total.update(f"{chunk_id}\t{digests[chunk_id]}\n".encode())
    return total.hexdigest()


def parquet_digests(pf: pq.ParquetFile, columns: list[str], dim: int) -> dict[str, str]:
    """{chunk_id: digest} of the documents a load of `pf` sends, one record batch at a time."""
    return {
        source["chunk_id"]: chunk_digest(source)
        for batch in pf.iter_batches(batch_size=4096, columns=columns)
        for source in document_sources(batch, columns, dim)
    }


def index_digests(client, index: str) -> dict[str, str]:
    """{_id: digest} of every document `index` holds, from a scroll over `_source`."""
    from opensearchpy.helpers import scan

    hits = scan(client, index=index, query={"query": {"match_all": {}}}, size=SCAN_PAGE)
    return {h["_id"]: chunk_digest(h["_source"]) for h in hits}


def differing_chunks(expected: Mapping[str, str], found: Mapping[str, str]) -> list[str]:
    """One line per chunk whose document differs from what was loaded, is missing, or was added."""
    lines = [f"chunk {c}: _source differs from what was loaded (edited in place)" for c in _changed(expected, found)]
    lines += [f"chunk {c}: missing" for c in sorted(set(expected) - set(found))]
    lines += [f"chunk {c}: not in the version as loaded" for c in sorted(set(found) - set(expected))]
    return lines


def _changed(expected: Mapping[str, str], found: Mapping[str, str]) -> Iterator[str]:
    return (c for c in sorted(set(expected) & set(found)) if expected[c] != found[c])


def max_seq_nos(client, index: str) -> dict[str, int]:
    """{shard: max_seq_no} of each primary shard: any document write after completion raises one."""
    stats = client.indices.stats(index=index, level="shards", metric="docs")
    shards = stats["indices"][index]["shards"]
    return {
        number: int(copy["seq_no"]["max_seq_no"])
        for number, copies in sorted(shards.items())
        for copy in copies
        if copy["routing"]["primary"]
    }


def seq_no_problems(index: str, recorded: Mapping[str, int] | None, now: Mapping[str, int]) -> list[str]:
    """The shards written to since the version completed (recorded in its manifest)."""
    if recorded is None:
        return [f"{index}: its manifest records no max_seq_no (loaded before edit detection); rebuild it"]
    moved: Iterable[str] = sorted(set(recorded) | set(now))
    return [
        f"{index}: shard {s} was written to after the version completed "
        f"(max_seq_no {recorded.get(s)} -> {now.get(s)}): a document was edited, added or deleted in place"
        for s in moved
        if recorded.get(s) != now.get(s)
    ]
