"""sourcegate_recalibrate: re-run the calibration sweep, precision evals and gate against the LIVE index.

No reindexing and no promotion: live_version -> evaluate -> gate. Runs when the eval sets asset
(`config/evals`) gets an event (UI "Create Asset Event" or the REST API after editing the sets) and
on manual trigger. Artifacts go to the run folder `recal-<logical date or run_after>`; a failed gate
fails the run. The live alias is never touched here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from airflow.sdk import dag, task

if str(Path(__file__).parent) not in sys.path:  # _common.py sits beside this file, whatever DAGS_FOLDER is
    sys.path.append(str(Path(__file__).parent))
from _common import EVAL_SETS, START_DATE, cfg, config_params, enforce_gate, live_version, recal_run_id


@dag(
    dag_id="sourcegate_recalibrate",
    schedule=[EVAL_SETS],
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    params=config_params(),
    tags=["sourcegate"],
    doc_md=__doc__,
)
def sourcegate_recalibrate():
    @task(task_id="live_version")
    def live() -> str:
        return live_version(cfg())

    @task
    def evaluate(version: str) -> dict:
        from pipelines.app import steps

        return steps.evaluate_step(cfg(), recal_run_id(), version=version)

    @task
    def gate() -> dict:
        from pipelines.app import steps

        return enforce_gate(steps.gate_step(cfg(), recal_run_id()))

    evaluate(live()) >> gate()


sourcegate_recalibrate()
