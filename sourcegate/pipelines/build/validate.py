"""Validate chunks before anything is loaded: the Great Expectations suite, checked over every row in batches.

Two kinds of expectation. A per-row one (non-empty text, length bounds, unit norm, no NaN)
that fails on some chunks quarantines their documents, naming the expectation and the
chunks, and the night goes on without them: the chunks that pass are written to
`chunks.valid.parquet`, which is what gets loaded (`loadable_chunks`). A whole-table one
(unique chunk ids, the model's dimension) failing means the run itself is broken: it stops.
quality.json says which expectation failed and on what.

The suite is Great Expectations'; its checks run over every row with pyarrow/numpy, one record
batch at a time (`ROW_CHECKS`, the same semantics: a null is left to the not-null expectations, a
NaN norm to the NaN one), so memory holds a batch, not the corpus. Great Expectations itself
validates a bounded sample (the first `GE_SAMPLE_ROWS` rows and up to `GE_SAMPLE_ROWS` failing
ones) and must agree with those checks row for row on it; its verdict on the sample is in
quality.json (`great_expectations_sample`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sourcegate.artifact_io import run_folder as rf
from sourcegate.artifact_io import write_json
from sourcegate.artifact_io.run_folder import CHUNKS_VALID as VALID_CHUNKS
from sourcegate.artifact_io.run_folder import loadable_chunks  # noqa: F401  (the validated chunks, where they are read)
from sourcegate.pipelines.batches import iter_batches, write_batches
from sourcegate.pipelines.build import quarantine
from sourcegate.pipelines.build.embed import embedding_matrix

log = logging.getLogger(__name__)
TABLE_WIDE = {("ExpectColumnValuesToBeUnique", "chunk_id"), ("ExpectColumnValuesToBeBetween", "embedding_dim")}
GE_SAMPLE_ROWS = 1_000
EXAMPLES = 10


class ValidationFailed(RuntimeError):
    pass


def expectations(dimension: int, max_chars: int):
    import great_expectations as gx

    E = gx.expectations
    return [
        E.ExpectColumnValuesToBeUnique(column="chunk_id"),
        E.ExpectColumnValuesToNotBeNull(column="chunk_id"),
        E.ExpectColumnValuesToNotBeNull(column="text"),
        E.ExpectColumnValuesToNotBeNull(column="body"),
        E.ExpectColumnValueLengthsToBeBetween(column="body", min_value=1, max_value=max_chars),
        E.ExpectColumnValueLengthsToBeBetween(column="text", min_value=1, max_value=max_chars),
        E.ExpectColumnValuesToBeBetween(column="embedding_dim", min_value=dimension, max_value=dimension),
        E.ExpectColumnValuesToBeBetween(column="embedding_norm", min_value=0.99, max_value=1.01),
        E.ExpectColumnValuesToBeInSet(column="embedding_has_nan", value_set=[False]),
    ]


def derived_columns(table: pa.Table) -> pa.Table:
    """The columns the suite reads: chunk_id, text, body and the embedding's dimension, norm and NaN flag."""
    n = table.num_rows
    dim = table["embedding"].type.list_size
    vectors = embedding_matrix(table) if n else np.zeros((0, dim), np.float32)
    with np.errstate(invalid="ignore"):
        norms = np.linalg.norm(vectors, axis=1)
    return pa.table(
        {
            "chunk_id": table["chunk_id"],
            "text": table["text"],
            "body": table["body"],
            "embedding_dim": pa.array(np.full(n, dim, np.int64)),
            "embedding_norm": pa.array(norms),
            "embedding_has_nan": pa.array(np.isnan(vectors).any(axis=1)),
        }
    )


def row_failures(cols: pa.Table, dimension: int, max_chars: int) -> list[tuple[str, str, np.ndarray]]:
    """(expectation, column, failing-row mask) for each expectation of the suite, in its order, on one batch.

    The uniqueness of chunk ids is the table's business (its mask here is all False; see `duplicate_ids`).
    """

    def mask(array) -> np.ndarray:
        return pc.fill_null(array, False).to_numpy(zero_copy_only=False).astype(bool)

    def length_out(column: str) -> np.ndarray:
        n = pc.utf8_length(cols[column])
        return mask(pc.or_(pc.less(n, 1), pc.greater(n, max_chars)))

    norms = cols["embedding_norm"].to_numpy()
    with np.errstate(invalid="ignore"):
        bad_norm = ~np.isnan(norms) & ((norms < 0.99) | (norms > 1.01))  # NaN: the NaN expectation's
    dims = cols["embedding_dim"].to_numpy()
    return [
        ("ExpectColumnValuesToBeUnique", "chunk_id", np.zeros(cols.num_rows, bool)),
        ("ExpectColumnValuesToNotBeNull", "chunk_id", mask(pc.is_null(cols["chunk_id"]))),
        ("ExpectColumnValuesToNotBeNull", "text", mask(pc.is_null(cols["text"]))),
        ("ExpectColumnValuesToNotBeNull", "body", mask(pc.is_null(cols["body"]))),
        ("ExpectColumnValueLengthsToBeBetween", "body", length_out("body")),
        ("ExpectColumnValueLengthsToBeBetween", "text", length_out("text")),
        ("ExpectColumnValuesToBeBetween", "embedding_dim", dims != dimension),
        ("ExpectColumnValuesToBeBetween", "embedding_norm", bad_norm),
        ("ExpectColumnValuesToBeInSet", "embedding_has_nan", cols["embedding_has_nan"].to_numpy(zero_copy_only=False)),
    ]


def duplicate_ids(chunks_parquet: str | Path) -> pa.Array:
    """Chunk ids that occur more than once (the ids alone are read: Arrow strings, not Python objects)."""
    ids = pq.read_table(chunks_parquet, columns=["chunk_id"])["chunk_id"]
    counts = pc.value_counts(ids.drop_null())
    return counts.field("values").filter(pc.greater(counts.field("counts"), 1))


def validate_chunks(
    chunks_parquet: str | Path,
    out_dir: str | Path,
    *,
    dimension: int,
    max_chars: int = 20_000,
    rows: int | None = None,
) -> dict:
    """Run the suite over every row, batch by batch; quarantine documents failing a per-row expectation;
    write quality.json; raise ValidationFailed when a whole-table expectation fails or no chunk is left."""
    import great_expectations as gx

    out_dir = Path(out_dir)
    duplicates = duplicate_ids(chunks_parquet)
    results: dict[tuple[str, str], dict] = {}
    failing: list[tuple[str, str, list[str]]] = []  # (doc_id, chunk_id, per-row expectations failed), row order
    sample: list[pa.Table] = []  # what Great Expectations checks: first rows and failing rows, bounded
    sampled_failures, total = 0, 0
    for table in iter_batches(chunks_parquet, ["chunk_id", "doc_id", "text", "body", "embedding"], rows):
        cols = derived_columns(table)
        checks = row_failures(cols, dimension, max_chars)
        checks[0] = (*checks[0][:2], pc.is_in(cols["chunk_id"], duplicates).to_numpy(zero_copy_only=False))
        for name, column, bad in checks:
            entry = results.setdefault((name, column), {"unexpected_count": 0, "examples": []})
            entry["unexpected_count"] += int(bad.sum())
            room = EXAMPLES - len(entry["examples"])
            if room > 0 and bad.any():
                entry["examples"] += cols[column].filter(pa.array(bad)).slice(0, room).to_pylist()
        per_row = [(f"{n}({c})", bad) for n, c, bad in checks if (n, c) not in TABLE_WIDE]
        any_bad = np.logical_or.reduce([bad for _, bad in per_row]) if per_row else np.zeros(table.num_rows, bool)
        doc_ids, chunk_ids = table["doc_id"], table["chunk_id"]
        for i in np.flatnonzero(any_bad):
            names = [name for name, bad in per_row if bad[i]]
            failing.append((doc_ids[int(i)].as_py(), chunk_ids[int(i)].as_py(), names))
        head = max(GE_SAMPLE_ROWS - total, 0)
        pick = np.zeros(table.num_rows, bool)
        pick[:head] = True
        extra = np.flatnonzero(any_bad & ~pick)[: max(GE_SAMPLE_ROWS - sampled_failures, 0)]
        pick[extra] = True
        sampled_failures += len(extra)
        if pick.any():
            sample.append(cols.filter(pa.array(pick)))
        total += table.num_rows

    report_rows = []
    for exp in expectations(dimension, max_chars):
        key = (type(exp).__name__, getattr(exp, "column", None))
        entry = results.get(key, {"unexpected_count": 0, "examples": []})
        report_rows.append(
            {
                "expectation": key[0],
                "column": key[1],
                "scope": "table" if key in TABLE_WIDE else "row",
                "success": entry["unexpected_count"] == 0,
                "unexpected_count": entry["unexpected_count"],
                "partial_unexpected_list": [_short(x) for x in entry["examples"]],
            }
        )
    ge_sample = great_expectations_on_sample(sample, dimension, max_chars)
    rejected = quarantine_rows(failing, out_dir / rf.DOCUMENTS)
    bad_docs = pa.array([r["doc_id"] for r in rejected], pa.string())
    kept = total
    if len(bad_docs):
        source = pq.ParquetFile(chunks_parquet)
        parts = (t.filter(pc.invert(pc.is_in(t["doc_id"], bad_docs))) for t in iter_batches(chunks_parquet, rows=rows))
        kept = write_batches(parts, out_dir / VALID_CHUNKS, source.schema_arrow)
    table_ok = all(r["success"] for r in report_rows if r["scope"] == "table")
    report = {
        "success": table_ok and kept > 0,
        "rows": total,
        "rows_loaded": kept,
        "quarantined": rejected,
        "great_expectations": gx.__version__,
        "great_expectations_sample": ge_sample,
        "results": report_rows,
    }
    if kept == 0:
        report["error"] = "no chunks: nothing to index" + (" after quarantine" if len(bad_docs) else "")
    quarantine.write_stage(out_dir, "validate", rejected)
    write_json(report, out_dir / rf.QUALITY)
    if len(bad_docs):
        log.warning("validation quarantined %d document(s): %s", len(bad_docs), ", ".join(bad_docs.to_pylist()[:10]))
    else:
        (out_dir / VALID_CHUNKS).unlink(missing_ok=True)  # a retried step must not load an older filter
    if not report["success"]:
        failed = [
            f"{r['expectation']}({r['column']}): {r['unexpected_count']} unexpected, e.g. {r['partial_unexpected_list'][:3]}"
            for r in report_rows
            if not r["success"] and r["scope"] == "table"
        ]
        raise ValidationFailed("chunk validation failed: " + "; ".join(failed or [report.get("error", "")]))
    return report


def great_expectations_on_sample(sample: list[pa.Table], dimension: int, max_chars: int) -> dict:
    """The suite run by Great Expectations on the sampled rows; its per-row verdicts must be ours.

    Uniqueness is not compared: a sample cannot judge it (it is checked over every id above).
    """
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    # GX pins this module's logger at INFO ("Created temporary directory ... for ephemeral docs site" on every night):
    # defer to the application's level, so only --verbose shows it
    logging.getLogger(ProgressBarsConfig.__module__).setLevel(logging.NOTSET)
    cols = pa.concat_tables(sample) if sample else derived_columns(_empty(dimension))
    df = cols.to_pandas()
    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)  # logs, not terminal noise
    batch = (
        ctx.data_sources.add_pandas("chunks")
        .add_dataframe_asset("chunks")
        .add_batch_definition_whole_dataframe("sample")
        .get_batch(batch_parameters={"dataframe": df})
    )
    ours = {(n, c): bad for n, c, bad in row_failures(cols, dimension, max_chars)}
    verdicts, disagree = [], []
    for exp in expectations(dimension, max_chars):
        key = (type(exp).__name__, getattr(exp, "column", None))
        r = batch.validate(exp, result_format="COMPLETE")
        res = r.result or {}
        verdicts.append({"expectation": key[0], "column": key[1], "success": bool(r.success), **_count(res)})
        if key == ("ExpectColumnValuesToBeUnique", "chunk_id"):
            continue
        theirs = sorted(int(i) for i in res.get("unexpected_index_list") or [])
        if theirs != np.flatnonzero(ours[key]).tolist():
            disagree.append(f"{key[0]}({key[1]})")
    if disagree:
        raise RuntimeError(f"the batch checks disagree with Great Expectations on the sample: {', '.join(disagree)}")
    return {"rows": len(df), "agrees": True, "results": verdicts}


def _count(result: dict) -> dict:
    return {"unexpected_count": result.get("unexpected_count")}


def _empty(dimension: int) -> pa.Table:
    return pa.table(
        {
            "chunk_id": pa.array([], pa.string()),
            "text": pa.array([], pa.string()),
            "body": pa.array([], pa.string()),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array([], pa.float32()), dimension),
        }
    )


def quarantine_rows(failing: list[tuple[str, str, list[str]]], documents_parquet: Path) -> list[dict]:
    """One quarantine row per document with a failing chunk, naming the expectation and the chunk(s)."""
    by_doc: dict[str, dict] = {}
    for doc_id, chunk_id, names in failing:
        entry = by_doc.setdefault(doc_id, {"doc_id": doc_id, "chunk_ids": [], "expectations": []})
        entry["chunk_ids"].append(chunk_id)
        entry["expectations"] += [e for e in names if e not in entry["expectations"]]
    sources = {}
    if by_doc and documents_parquet.exists():
        docs = pq.read_table(
            documents_parquet, columns=["doc_id", "source"], filters=[("doc_id", "in", sorted(by_doc))]
        )
        sources = dict(zip(docs["doc_id"].to_pylist(), docs["source"].to_pylist()))
    rows = []
    for doc_id, entry in sorted(by_doc.items()):
        more = len(entry["chunk_ids"]) - 1
        reason = f"failed {entry['expectations'][0]}: chunk {entry['chunk_ids'][0]} of document {doc_id!r}"
        reason += f" and {more} more chunk(s)" if more else ""
        rows.append({"source": sources.get(doc_id), **entry, "reason": reason})
    return rows


def _short(value, limit: int = 200) -> str:
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
