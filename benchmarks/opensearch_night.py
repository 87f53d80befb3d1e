"""Benchmark 14: an OpenSearch night that costs what changed — full load vs clone + delta.

For each base size: synthetic chunks (benchmarks.search's generator: seeded unit vectors and Zipf
texts, 384-d; no model — the embedding of the changed chunks is the embedding benchmarks' cost, not
the load's) are written to a base Parquet and loaded whole with `OpenSearchStore.load` (mode
`full`: this is the full-load cost of a corpus of that size, the code path and row count a full
load of the night would have), then promoted. Each night is the base with some chunks changed, half
edited in place (same id, new text and vector) and half replaced (the id removed, a new id added, as
a changed document's content-addressed chunks are); its version is built with
`OpenSearchStore.load(..., base_chunks=base)`: write block on the live index, `_clone`, deletes,
bulk of the added and changed chunks, refresh, `_count` + ids' checksum against the night's Parquet.
The steps' wall times come from the version's manifest (`build.steps_s`). Nights: `--change` of
the corpus (1%: the headline) and a fixed `--fixed` chunks at every size (the same change on a
bigger corpus: what scales with the corpus and what with the change).

Then the ids' checksum of the night's index is computed four ways (what the verify step could use).
Every index is deleted at the end. Uses the node at OPENSEARCH_URL (scripts/opensearch; never
starts or stops one).

    nice -n 10 .venv/bin/python -m benchmarks.opensearch_night --sizes 20000,100000 [--change 0.01] [--fixed 200]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import secrets
import tempfile
from pathlib import Path

import numpy as np

from benchmarks._common import Result, log, peak_rss_mb, timed
from benchmarks.search import DIM, stored_table, synth, texts_of, vocabulary


def write_base(path: Path, n: int, seed: int):
    import pyarrow as pa
    import pyarrow.parquet as pq

    offsets, flat, vectors = synth(n, seed)
    table = stored_table(texts_of(offsets, flat, vocabulary()))
    table = table.append_column("embedding", pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), DIM))
    pq.write_table(table, path)
    return table


def write_night(base, path: Path, changed: int, seed: int) -> dict:
    """`base` with `changed` chunks changed: half edited in place, half replaced by new ids."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    n = base.num_rows
    picked = rng.choice(n, size=changed, replace=False)
    edited, replaced = np.sort(picked[: changed // 2]), np.sort(picked[changed // 2 :])
    offsets, flat, vectors = synth(changed, seed)
    texts = texts_of(offsets, flat, vocabulary())
    new_text = base["text"].to_pylist()
    new_vectors = base["embedding"].combine_chunks().flatten().to_numpy().reshape(n, DIM).copy()
    for j, i in enumerate(edited):
        new_text[i], new_vectors[i] = texts[j], vectors[j]
    table = base.set_column(base.schema.get_field_index("text"), "text", pa.array(new_text))
    table = table.set_column(
        table.schema.get_field_index("embedding"),
        "embedding",
        pa.FixedSizeListArray.from_arrays(pa.array(new_vectors.reshape(-1)), DIM),
    )
    keep = np.ones(n, bool)
    keep[replaced] = False
    added = table.take(pa.array(replaced))  # the same shape; new ids, texts, vectors
    k = len(replaced)
    added = added.set_column(0, "chunk_id", pa.array([f"n{seed}-{i:07d}" for i in range(k)]))
    added = added.set_column(added.schema.get_field_index("text"), "text", pa.array(texts[len(edited) :]))
    added = added.set_column(
        added.schema.get_field_index("embedding"),
        "embedding",
        pa.FixedSizeListArray.from_arrays(pa.array(vectors[len(edited) :].reshape(-1)), DIM),
    )
    pq.write_table(pa.concat_tables([table.filter(pa.array(keep)), added]), path)
    return {"edited_in_place": len(edited), "replaced": k}


def checksums(client, index: str) -> dict:
    """The ids' SHA-256 of `index` four ways, each timed: what `verify` could read."""
    from opensearchpy.helpers import scan

    from sourcegate.pipelines.search.opensearch import ids_checksum

    def scroll_ids(size: int):
        hits = scan(client, index=index, query={"_source": False, "query": {"match_all": {}}}, size=size)
        return ids_checksum(h["_id"] for h in hits)

    def scroll_docvalues():
        body = {
            "_source": False,
            "stored_fields": "_none_",
            "docvalue_fields": ["chunk_id"],
            "query": {"match_all": {}},
        }
        hits = scan(client, index=index, query=body, size=10_000)
        return ids_checksum(h["fields"]["chunk_id"][0] for h in hits)

    def composite():
        digest, after = hashlib.sha256(), None
        while True:
            source = {"size": 10_000, "sources": [{"id": {"terms": {"field": "chunk_id"}}}]}
            if after:
                source["after"] = after
            resp = client.search(index=index, body={"size": 0, "aggs": {"ids": {"composite": source}}})
            buckets = resp["aggregations"]["ids"]["buckets"]
            for b in buckets:  # sorted by key: no sort on the client
                digest.update(b["key"]["id"].encode("utf-8") + b"\n")
            after = resp["aggregations"]["ids"].get("after_key")
            if not buckets or not after:
                return digest.hexdigest()

    methods = {
        "scroll _id, 1,000 a page (what verify reads)": lambda: scroll_ids(1000),
        "scroll _id, 10,000 a page": lambda: scroll_ids(10_000),
        "scroll chunk_id doc values, no stored fields": scroll_docvalues,
        "composite aggregation on chunk_id (sorted keys)": composite,
    }
    out = {}
    for name, fn in methods.items():
        t, value = timed(fn)
        out[name] = {"seconds": round(t, 3), "sha256": value}
    return out


def night(store, base_version: str, base_path: Path, night_path: Path, version: str, shape: dict) -> dict:
    t, count = timed(store.load, version, str(night_path), base_chunks=base_path)
    build = store.manifest(version)["build"]
    assert build["mode"] == "delta", build  # a benchmark of the delta path must have taken it
    log(f"  {version}: {count} chunks, delta in {t:.1f}s: {build['steps_s']}")
    return {"version": version, "count": count, "wall_s": round(t, 2), "build": build, "shape": shape}


def run_size(store, n: int, args, tmp: Path) -> dict:
    base_path = tmp / f"base-{n}.parquet"
    base = write_base(base_path, n, args.seed)
    base_version = f"base-{n}"
    log(f"{n} chunks: full load of the base ...")
    t_full, count = timed(store.load, base_version, str(base_path))
    full_build = store.manifest(base_version)["build"]
    log(f"  full: {count} chunks in {t_full:.1f}s ({count / t_full:.0f} chunks/s): {full_build['steps_s']}")
    store.promote(base_version)
    out = {
        "chunks": n,
        "full_load": {"wall_s": round(t_full, 2), "chunks_per_s": round(count / t_full, 1), "build": full_build},
        "nights": [],
    }
    nights = {"change": round(n * args.change), "fixed": args.fixed}
    if nights["fixed"] == nights["change"]:
        del nights["fixed"]  # the same night twice
    for label, changed in nights.items():
        path = tmp / f"night-{n}-{label}.parquet"
        shape = write_night(base, path, changed, args.seed + 1)
        result = night(store, base_version, base_path, path, f"night-{n}-{label}", shape)
        result["changed_chunks"] = changed
        result["vs_full"] = round(result["wall_s"] / t_full, 4)
        out["nights"].append(result)
        if label == "change":
            out["checksums"] = checksums(store.client, store.index_name(result["version"]))
            log(f"  checksums: { {k: v['seconds'] for k, v in out['checksums'].items()} }")
        store.drop(result["version"])
    store.client.indices.delete(index=store.index_name(base_version))  # and the alias: the next size starts bare
    out["peak_rss_mb_client"] = peak_rss_mb()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="20000,100000", help="base sizes, comma-separated")
    ap.add_argument("--change", type=float, default=0.01, help="share of the base changed in the headline night")
    ap.add_argument("--fixed", type=int, default=200, help="chunks changed in the same-change night at every size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="opensearch_night", help="result file name (benchmarks/results/<name>.json)")
    args = ap.parse_args()
    logging.getLogger("opensearch").setLevel(logging.ERROR)  # the 404s of absent aliases and indexes
    from sourcegate.pipelines.config import OpenSearch
    from sourcegate.pipelines.search.opensearch import OpenSearchStore

    prefix = f"sgbench-night-{secrets.token_hex(4)}"
    store = OpenSearchStore(section=OpenSearch(index_prefix=prefix), progress=False)
    res = Result(args.name, prefix=prefix, change=args.change, fixed=args.fixed, dimension=DIM)
    res["node"] = store.client.info()["version"]["number"]
    res["node_heap"] = "1 GB (scripts/opensearch default)"
    res["sizes"] = []
    try:
        with tempfile.TemporaryDirectory(prefix="sgbench-night-") as tmp:
            for n in [int(s) for s in args.sizes.split(",")]:
                res["sizes"].append(run_size(store, n, args, Path(tmp)))
                res.write()  # what is measured so far survives a later size's failure
    finally:
        store.client.indices.delete(index=f"{prefix}-*", ignore_unavailable=True)
        res["indexes_left_after_cleanup"] = sorted(store.client.indices.get(index=f"{prefix}-*"))
        res.write()


if __name__ == "__main__":
    main()
