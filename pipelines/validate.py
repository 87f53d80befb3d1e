"""Validate chunks with a Great Expectations suite before anything is loaded.

A failure stops the run; quality.json says which expectation failed and on what.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipelines.embed import embedding_matrix
from pipelines.io import write_json

log = logging.getLogger(__name__)


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


def validate_chunks(
    chunks_parquet: str | Path, out_dir: str | Path, *, dimension: int, max_chars: int = 20_000
) -> dict:
    """Run the suite; write quality.json; raise ValidationFailed when any expectation fails."""
    import great_expectations as gx
    import pandas as pd

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
    results = []
    for exp in expectations(dimension, max_chars):
        r = batch.validate(exp)
        res = r.result or {}
        results.append(
            {
                "expectation": type(exp).__name__,
                "column": getattr(exp, "column", None),
                "success": bool(r.success),
                "unexpected_count": res.get("unexpected_count"),
                "partial_unexpected_list": [str(x) for x in (res.get("partial_unexpected_list") or [])[:10]],
            }
        )
    report = {
        "success": all(r["success"] for r in results) and table.num_rows > 0,
        "rows": table.num_rows,
        "great_expectations": gx.__version__,
        "results": results,
    }
    if table.num_rows == 0:
        report["error"] = "no chunks: nothing to index"
    write_json(report, Path(out_dir) / "quality.json")
    if not report["success"]:
        failed = [
            f"{r['expectation']}({r['column']}): {r['unexpected_count']} unexpected"
            for r in results
            if not r["success"]
        ]
        raise ValidationFailed("chunk validation failed: " + "; ".join(failed or [report.get("error", "")]))
    return report
