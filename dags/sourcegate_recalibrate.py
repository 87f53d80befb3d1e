"""sourcegate_recalibrate: re-run the calibration sweep, precision evals and gate against the LIVE index.

No reindexing and no promotion: live_version -> evaluate -> gate. Runs when the eval sets asset
(`config/evals`) gets an event (UI "Create Asset Event" or the REST API after editing the sets) and
on manual trigger. Artifacts go to the run folder `recal-<logical date or run_after>`; a failed gate
fails the run. The live alias is never touched here.

Like the nightly DAG, the tasks share nothing but the artifact store and the search backend: with
`artifacts: s3://…` each stages into a scratch folder of its own only what its step reads (live_version:
LIVE; evaluate: the live version's index and chunks; gate: the evaluation's outputs and the live run's
question records), publishes what it wrote and removes the scratch (`_common.in_store`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from airflow.sdk import dag, task
from airflow.sdk.exceptions import AirflowFailException

if str(Path(__file__).parent) not in sys.path:  # _common.py sits beside this file, whatever DAGS_FOLDER is
    sys.path.append(str(Path(__file__).parent))
from _common import (
    DEFAULT_ARGS,
    EVAL_SETS,
    START_DATE,
    config_params,
    enforce_gate,
    in_store,
    live_version,
    recal_run_id,
)


@dag(
    dag_id="sourcegate_recalibrate",
    schedule=[EVAL_SETS],
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    params=config_params(),
    tags=["sourcegate"],
    doc_md=__doc__,
)
def sourcegate_recalibrate():
    @task(task_id="live_version")
    def live() -> str:
        return in_store("live_version", live_version, run=recal_run_id())

    @task
    def evaluate(version: str) -> dict:
        from pipelines.app import steps

        def evaluate_live(config: dict) -> dict:
            if live_version(config) != version:  # promoted meanwhile: its files are not the ones staged
                raise AirflowFailException(f"the live version moved from {version} since live_version: run again")
            return steps.evaluate_step(config, recal_run_id(), version=version)

        return in_store("evaluate_live", evaluate_live, run=recal_run_id())

    @task
    def gate() -> dict:
        from pipelines.app import steps

        return enforce_gate(in_store("gate", lambda c: steps.gate_step(c, recal_run_id()), run=recal_run_id()))

    evaluate(live()) >> gate()


sourcegate_recalibrate()
