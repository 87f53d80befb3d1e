"""The reports plugin's runs on an object store (`artifacts: s3://bucket/prefix`).

The store is reached exactly as a DAG task reaches it: the Airflow connection `artifacts_airflow_conn_id`
(sourcegate.dags.common.aws_connection_options; aws_default left undefined: the AWS environment), handed to
sourcegate/pipelines/versions/object_store.py, the only code that talks to the store. The index is one listing of
`runs/` (keys and sizes, no object read) plus each valid run's run.json and gate.json; a served file is
streamed from the store, never a run folder downloaded. Every key is built from a valid run id and a name
in ALLOWED and checked once more before use: the store resolves `..` in a key (`runs/../x` reads `x`), so a
key that could leave `runs/` is never sent. reports.py imports this module only for a bucket.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime

from fastapi import HTTPException
from fastapi.responses import StreamingResponse

from sourcegate.artifact_io import run_folder as rf
from sourcegate.pipelines.app.staging import LIVE, run_of
from sourcegate.pipelines.versions.object_store import CHUNK, ObjectStore, connection, key_problem
from sourcegate.plugins.served import ALLOWED, NOSNIFF, gate_status, live_name, not_found, valid_run_id

RUNS = "runs/"


def safe_key(key: str) -> bool:
    """A key that names one object under `runs/` (object_store.key_problem: no `.`, `..` or empty segment, no
    backslash or control character)."""
    return key.startswith(RUNS) and key_problem(key) is None


def run_key(run_id: str, name: str) -> str | None:
    """The key of a file the plugin may serve, None for anything else."""
    if name not in ALLOWED or not valid_run_id(run_id):
        return None
    key = f"{RUNS}{run_id}/{name}"
    return key if safe_key(key) else None


def files_by_run(keys) -> dict[str, set[str]]:
    """Run id -> the names directly inside its folder, from the listing's keys (a run with only subfolders: empty)."""
    runs: dict[str, set[str]] = {}
    for key in keys:
        run = run_of(key)
        if run:
            inside = key.split("/", 2)[2]
            runs.setdefault(run, set()).update([inside] if "/" not in inside else [])
    return runs


def started(run_json: bytes | None) -> float:
    """run.json's `started_at` as epoch seconds, 0 when missing or unreadable (the table's newest-first order)."""
    try:
        info = json.loads(run_json) if run_json is not None else {}
        return datetime.fromisoformat(info["started_at"]).timestamp()
    except (ValueError, TypeError, KeyError, AttributeError):
        return 0.0


def unavailable(uri: str, exc: Exception) -> HTTPException:
    return HTTPException(status_code=503, detail=f"object store {uri}: {exc}")


class BucketRuns:
    """The runs of `uri` (s3://bucket/prefix), reached through the Airflow connection `conn_id`."""

    def __init__(self, uri: str, conn_id: str | None):
        from sourcegate.dags import common

        self.uri = uri.rstrip("/")
        self.conn_id = conn_id or common.AWS_CONN_ID
        self.location = f"{self.uri}/runs"

    def store(self) -> ObjectStore:
        """The store as a DAG task opens it, per request (a connection edited in the UI applies to the next page).
        The filesystem keeps the connection's options, so it stays usable after the block."""
        from airflow.sdk.exceptions import AirflowFailException

        from sourcegate.dags import common

        try:
            with connection(common.aws_connection_options(self.conn_id)):
                return ObjectStore.from_uri(self.uri)
        except AirflowFailException as exc:  # the connection the config names is missing or incomplete
            raise unavailable(self.uri, exc) from None

    def rows(self) -> list[dict]:
        store = self.store()
        try:
            runs = files_by_run(store.listing(RUNS))
            live = live_name(store.get(LIVE))
            rows = [self.row(store, run, names, live) for run, names in runs.items()]
        except OSError as exc:
            raise unavailable(self.uri, exc) from None
        rows.sort(key=lambda r: (r.pop("started"), r["name"]), reverse=True)  # newest first
        return rows

    def row(self, store: ObjectStore, run: str, names: set[str], live: str | None) -> dict:
        """One table row; a run whose folder name is not a valid run id is shown, never read."""
        valid = valid_run_id(run)

        def read(name: str) -> bytes | None:
            key = run_key(run, name) if valid and name in names else None
            return store.get(key) if key else None

        return {
            "name": run,
            "live": run == live,
            "gate": gate_status(read(rf.GATE)),
            "files": [n for n in ALLOWED if n in names] if valid else [],
            "started": started(read(rf.RUN_INFO)),
        }

    def response(self, run_id: str, name: str) -> StreamingResponse:
        key = run_key(run_id, name)
        if key is None:
            raise not_found()
        store = self.store()
        try:
            stream = store.fs.open_input_stream(store.path(key))
        except FileNotFoundError:
            raise not_found() from None
        except OSError as exc:
            raise unavailable(self.uri, exc) from None
        return StreamingResponse(blocks(stream), media_type=ALLOWED[name], headers=NOSNIFF)


def blocks(stream) -> Iterator[bytes]:
    """The object's bytes in CHUNK-sized blocks, the stream closed at the end (or when the client goes away)."""
    try:
        while block := stream.read(CHUNK):
            yield block
    finally:
        stream.close()
