"""What the reports plugin may serve and how it names it: the allowed files, a valid run id, a verdict's and a LIVE
pointer's text. Shared by the local-folder runs (reports.py) and the bucket runs (bucket_runs.py)."""

import json

from sourcegate.artifact_io import run_folder as rf

# name -> media type. Everything else in a run folder (Parquet, index files, ...) is not served.
ALLOWED = {
    rf.REPORT: "text/html; charset=utf-8",
    rf.GATE: "application/json",
    rf.CALIBRATION: "application/json",
    rf.PRECISION: "application/json",
    rf.JUNIT: "application/xml",
    rf.RUN_INFO: "application/json",
}


def valid_run_id(run_id: str) -> bool:
    """One run folder's name: the pipeline's run id pattern, never `.` or `..`."""
    return bool(rf.RUN_ID.match(run_id)) and run_id not in (".", "..")


NOSNIFF = {"X-Content-Type-Options": "nosniff"}


def not_found():
    from fastapi import HTTPException

    return HTTPException(status_code=404, detail="not found")


def live_name(data: bytes | None) -> str | None:
    """The run a LIVE pointer's bytes name (None: no pointer, or an empty one)."""
    return (data or b"").decode("utf-8", "replace").strip() or None


def gate_status(data: bytes | None) -> str:
    """A run's verdict for the table, from its gate.json bytes (None: no gate.json)."""
    try:
        gate = json.loads(data) if data is not None else None
    except ValueError:
        gate = None
    if not isinstance(gate, dict):
        return "-"
    return "passed" if gate.get("passed") is True else "FAILED"
