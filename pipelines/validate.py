"""Validate chunks with a Great Expectations suite before anything is loaded.

Two kinds of expectation. A per-row one (non-empty text, length bounds, unit norm, no NaN)
that fails on some chunks quarantines their documents, naming the expectation and the
chunks, and the night goes on without them: the chunks that pass are written to
`chunks.valid.parquet`, which is what gets loaded (`loadable_chunks`). A whole-table one
(unique chunk ids, the model's dimension) failing means the run itself is broken: it stops.
quality.json says which expectation failed and on what.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines import quarantine
from pipelines.embed import embedding_matrix
from pipelines.io import write_json, write_parquet

log = logging.getLogger(__name__)
VALID_CHUNKS = "chunks.valid.parquet"
TABLE_WIDE = {("ExpectColumnValuesToBeUnique", "chunk_id"), ("ExpectColumnValuesToBeBetween", "embedding_dim")}


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


def loadable_chunks(folder: str | Path) -> Path:
    """The chunks to load and evaluate: the validated ones when validation quarantined any, else all."""
    valid = Path(folder) / VALID_CHUNKS
    return valid if valid.exists() else Path(folder) / "chunks.parquet"


def validate_chunks(
    chunks_parquet: str | Path, out_dir: str | Path, *, dimension: int, max_chars: int = 20_000
) -> dict:
    """Run the suite; quarantine documents failing a per-row expectation; write quality.json;
    raise ValidationFailed when a whole-table expectation fails or no chunk is left."""
    import great_expectations as gx
    import pandas as pd

    out_dir = Path(out_dir)
    table = pq.read_table(chunks_parquet)
    vectors = embedding_matrix(table) if table.num_rows else np.zeros((0, dimension), np.float32)
    df = pd.DataFrame(
        {
            "chunk_id": table["chunk_id"].to_pylist(),
            "text": table["text"].to_pylist(),
            "body": table["body"].to_pylist(),
            "embedding_dim": [table["embedding"].type.list_size] * table.num_rows,
            "embedding_norm": np.linalg.norm(vectors, axis=1) if len(vectors) else [],
            "embedding_has_nan": np.isnan(vectors).any(axis=1) if len(vectors) else [],
        }
    )
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)  # logs, not terminal noise
    batch = (
        ctx.data_sources.add_pandas("chunks")
        .add_dataframe_asset("chunks")
        .add_batch_definition_whole_dataframe("all")
        .get_batch(batch_parameters={"dataframe": df})
    )
    results, failed_rows = [], {}  # row index -> names of the per-row expectations it failed
    for exp in expectations(dimension, max_chars):
        r = batch.validate(exp, result_format="COMPLETE")
        res = r.result or {}
        name = f"{type(exp).__name__}({getattr(exp, 'column', None)})"
        table_wide = (type(exp).__name__, getattr(exp, "column", None)) in TABLE_WIDE
        results.append(
            {
                "expectation": type(exp).__name__,
                "column": getattr(exp, "column", None),
                "scope": "table" if table_wide else "row",
                "success": bool(r.success),
                "unexpected_count": res.get("unexpected_count"),
                "partial_unexpected_list": [_short(x) for x in (res.get("unexpected_list") or [])[:10]],
            }
        )
        if not r.success and not table_wide:
            for i in res.get("unexpected_index_list") or []:
                failed_rows.setdefault(int(i), []).append(name)
    rejected = quarantine_rows(table, failed_rows, out_dir / "documents.parquet")
    bad_docs = [r["doc_id"] for r in rejected]
    kept = table.filter(pc.invert(pc.is_in(table["doc_id"], pa.array(bad_docs, pa.string())))) if bad_docs else table
    table_ok = all(r["success"] for r in results if r["scope"] == "table")
    report = {
        "success": table_ok and kept.num_rows > 0,
        "rows": table.num_rows,
        "rows_loaded": kept.num_rows,
        "quarantined": rejected,
        "great_expectations": gx.__version__,
        "results": results,
    }
    if kept.num_rows == 0:
        report["error"] = "no chunks: nothing to index" + (" after quarantine" if bad_docs else "")
    quarantine.write_stage(out_dir, "validate", rejected)
    write_json(report, out_dir / "quality.json")
    if bad_docs:
        write_parquet(kept, out_dir / VALID_CHUNKS)
        log.warning("validation quarantined %d document(s): %s", len(bad_docs), ", ".join(bad_docs[:10]))
    else:
        (out_dir / VALID_CHUNKS).unlink(missing_ok=True)  # a retried step must not load an older filter
    if not report["success"]:
        failed = [
            f"{r['expectation']}({r['column']}): {r['unexpected_count']} unexpected, e.g. {r['partial_unexpected_list'][:3]}"
            for r in results
            if not r["success"] and r["scope"] == "table"
        ]
        raise ValidationFailed("chunk validation failed: " + "; ".join(failed or [report.get("error", "")]))
    return report


def quarantine_rows(table: pa.Table, failed_rows: dict[int, list[str]], documents_parquet: Path) -> list[dict]:
    """One quarantine row per document with a failing chunk, naming the expectation and the chunk(s)."""
    doc_ids, chunk_ids = table["doc_id"].to_pylist(), table["chunk_id"].to_pylist()
    by_doc: dict[str, dict] = {}
    for i in sorted(failed_rows):
        entry = by_doc.setdefault(doc_ids[i], {"doc_id": doc_ids[i], "chunk_ids": [], "expectations": []})
        entry["chunk_ids"].append(chunk_ids[i])
        entry["expectations"] += [e for e in failed_rows[i] if e not in entry["expectations"]]
    sources = {}
    if by_doc and documents_parquet.exists():
        docs = pq.read_table(documents_parquet, columns=["doc_id", "source"])
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
