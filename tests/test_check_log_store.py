"""The log of check-set scorings lives in the artifact store: on `s3://…` artifacts each scoring is one object
under `check_scorings/` (sourcegate/pipelines/app/staging.py), so two gates on two workers never rewrite one log, and the next
gate on any worker counts every design that looked (sourcegate/evals/check_log.py). Against the real moto S3 server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sourcegate.evals import check_log
from sourcegate.pipelines import config
from sourcegate.pipelines.app import staging
from sourcegate.pipelines.versions.object_store import ObjectStore

ROOT = Path(__file__).resolve().parents[1]


def scoring(run: str, threshold: float) -> dict:
    design = check_log.design_hash({"signal": "answer_support", "threshold": threshold})
    return {"run": run, "check_sha256": "c1", "design_sha256": design, "passed": True}


def gate_task(cfg, run: str, record: dict | None) -> list[dict]:
    """What one gate task does with the log: read it from its staged folder, append its own scoring."""
    with staging.task_staged(cfg, "gate", run) as local:
        log = Path(local) / check_log.LOG
        seen = check_log.read(log)
        if record is not None:
            check_log.append(log, record)
    return seen


@pytest.mark.s3
def test_each_scoring_is_one_object_on_the_store_and_every_later_gate_reads_them_all(s3_server, s3_env):
    uri = s3_server.bucket("check-log") + "/sg"
    cfg = config.load(ROOT / "config" / "pipeline.yaml", {"artifacts": uri})
    store = ObjectStore.from_uri(uri)
    first, second = scoring("20260101-020000", 0.1), scoring("20260102-020000", 0.2)

    assert gate_task(cfg, "20260101-020000", first) == []
    assert gate_task(cfg, "20260102-020000", second) == [first]  # the first worker's look, read from the store
    keys = sorted(store.listing(staging.CHECK_SCORINGS_PREFIX))
    assert keys == [staging.scoring_key(first), staging.scoring_key(second)]
    assert json.loads(store.get(keys[1])) == second

    # a rerun of the second night under the same design is the same look: nothing new is written
    assert gate_task(cfg, "20260102-020000", second) == [first, second]
    assert len(store.listing(staging.CHECK_SCORINGS_PREFIX)) == 2
    seen = gate_task(cfg, "20260103-020000", None)
    assert check_log.designs_scored(seen, "c1", first["design_sha256"]) == [
        first["design_sha256"],
        second["design_sha256"],
    ]


@pytest.mark.s3
def test_a_task_that_does_not_read_the_log_neither_stages_nor_publishes_it(s3_server, s3_env):
    uri = s3_server.bucket("check-log-other") + "/sg"
    cfg = config.load(ROOT / "config" / "pipeline.yaml", {"artifacts": uri})
    gate_task(cfg, "20260101-020000", scoring("20260101-020000", 0.1))
    with staging.task_staged(cfg, "promote", "20260101-020000") as local:
        assert not (Path(local) / check_log.LOG).exists()
    assert len(ObjectStore.from_uri(uri).listing(staging.CHECK_SCORINGS_PREFIX)) == 1
