"""`sourcegate runs`: every run folder as one row, by SQL (DuckDB) over the folders' run.json and gate.json.

A run that crashed before writing run.json is not listed; one whose run.json does not parse is listed
as `unreadable` rather than failing the listing.
"""

from __future__ import annotations

from pathlib import Path

from sourcegate.artifact_io import run_folder as rf

COLUMNS = (
    "run",
    "started",
    "backend",
    "verdict",
    "promoted",
    "documents",
    "chunks",
    "embedded",
    "questions",
    "seconds",
)
# --json also: why a night stopped (run.json's `stopped.error`; after a passed gate too, e.g. at promote), the
# version its evaluation judged (a recalibration's run judges LIVE's, and has none of its own to promote), and
# whether the run is the live version now (`promoted` says it ever was: a rollback may have left it since)
FIELDS = (*COLUMNS, "stopped", "judged", "live")

# A run's name is its folder's name. $info / $gate: lists of run.json / gate.json paths
# (read_text fails on an empty list, so "no gate.json yet" reads the gate-less GATE_NONE instead).
INFO = r"""
    SELECT regexp_extract(filename, '([^/]+)/run\.json$', 1) AS run, TRY_CAST(content AS JSON) AS j
    FROM read_text($info)
"""
GATE = r"""
    SELECT regexp_extract(filename, '([^/]+)/gate\.json$', 1) AS run, TRY_CAST(content AS JSON) AS g
    FROM read_text($gate)
"""
GATE_NONE = "SELECT NULL::VARCHAR AS run, NULL::JSON AS g WHERE false"
PROMOTED_INFO = "(j -> '$.promoted') IS NOT NULL"
PROMOTED_LOG = "list_contains($promoted::VARCHAR[], info.run)"
QUERY = r"""
WITH info AS ({info}), gate AS ({gate})
SELECT info.run,
       j ->> '$.started_at' AS started,
       j ->> '$.backend' AS backend,
       CASE WHEN j IS NULL THEN 'unreadable'
            WHEN g IS NULL AND (j ->> '$.stopped.step') IS NOT NULL THEN 'stopped: ' || (j ->> '$.stopped.step')
            WHEN g IS NULL THEN 'no verdict'
            WHEN json_type(g, '$.passed') = 'BOOLEAN' AND (g ->> '$.passed') = 'true' THEN 'passed'
            ELSE 'failed' END AS verdict,
       {promoted} AS promoted,
       TRY_CAST(j ->> '$.counts.ingest.documents' AS BIGINT) AS documents,
       TRY_CAST(j ->> '$.counts.chunks' AS BIGINT) AS chunks,
       TRY_CAST(j ->> '$.counts.embedded' AS BIGINT) AS embedded,
       TRY_CAST(j ->> '$.counts.eval_questions' AS BIGINT) AS questions,
       round(list_sum(map_values(TRY_CAST(j -> '$.timings_s' AS MAP(VARCHAR, DOUBLE)))), 1) AS seconds,
       j ->> '$.stopped.error' AS stopped,
       j ->> '$.evaluated_version' AS judged
FROM info LEFT JOIN gate USING (run)
ORDER BY started NULLS FIRST, info.run
"""


def list_runs(artifacts: str | Path, promoted: set[str] | None = None, live: str | None = None) -> list[dict]:
    """One dict per run folder under `artifacts`/runs (keys: FIELDS), oldest first. `promoted`: the versions
    the promotions log names (the truth: run.json's `promoted` can lag a crash); None reads run.json. `live`: the
    live version."""
    import duckdb

    runs = Path(artifacts) / rf.RUNS
    params = {
        "info": sorted(str(p) for p in runs.glob("*/run.json")),
        "gate": sorted(str(p) for p in runs.glob("*/gate.json")),
    }
    if not params["info"]:
        return []
    if not params["gate"]:
        del params["gate"]
    if promoted is not None:
        params["promoted"] = sorted(promoted)
    sql = QUERY.format(
        info=INFO,
        gate=GATE if "gate" in params else GATE_NONE,
        promoted=PROMOTED_LOG if promoted is not None else PROMOTED_INFO,
    )
    with duckdb.connect() as con:
        rows = con.execute(sql, params).fetchall()
    return [{**dict(zip(FIELDS, row)), "live": row[0] == live} for row in rows]


def _cell(value) -> str:
    if value is None:
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def format_table(rows: list[dict]) -> str:
    """A plain-text table, one line per run."""
    cells = [COLUMNS] + [tuple(_cell(r[c]) for c in COLUMNS) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells)
