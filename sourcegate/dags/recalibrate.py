"""sourcegate_recalibrate: re-run the calibration sweep, precision evals and gate against the LIVE index, and retrain
the answer model when the corpus outgrew it.

No reindexing and no promotion: live_version -> evaluate -> gate. Beside it, live_version -> corpus_share ->
retrain -> judge -> ship: when the configured corpus-specific answer model learned less than
`answerability.retrain_below_share` of the live version's sections, it is retrained by its recipe on that version
(or on the newest night's, when that night failed its gate because the model learned too little of it: the corpus
outgrew the model in one step, and no night passes until it learns it; retrain_step.retrain_version),
judged in the run folder `recal-…-retrained` and shipped only through accept when the fit set has a gap and the check
set passes (sourcegate/pipelines/app/retrain_step.py); otherwise corpus_share skips the rest, or ship keeps the old model, and
the task log and `retrain.json` say why. Runs when the eval sets asset
(`config/evals`) gets an event (UI "Create Asset Event" or the REST API after editing the sets) and
on manual trigger. Artifacts go to the run folder `recal-<logical date or run_after>`; a failed gate
fails the run. The live alias is never touched here.

Like the nightly DAG, the tasks share nothing but the artifact store and the search backend: with
`artifacts: s3://…` each stages into a scratch folder of its own only what its step reads (live_version:
LIVE; evaluate: the live version's index and chunks; gate: the evaluation's outputs and the live run's
question records), publishes what it wrote and removes the scratch (`common.in_store`).
A DAG file builds it with `recalibrate_dag()` (the repository's dags/sourcegate_recalibrate.py is one such file).
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import dag, task
from airflow.sdk.exceptions import AirflowFailException

from sourcegate.dags.common import (
    DEFAULT_ARGS,
    EVAL_SETS,
    START_DATE,
    absolute,
    cfg,
    config_params,
    enforce_gate,
    in_store,
    live_version,
    log,
    params,
    recal_run_id,
)
from sourcegate.dags.common import PROJECT_ROOT as ROOT


def recalibrate_dag(dag_id: str = "sourcegate_recalibrate", schedule=(EVAL_SETS,), start_date=START_DATE, **kwargs):
    """The recalibration DAG with today's id, trigger (an event on the eval sets asset) and params by default;
    `kwargs` go to Airflow's @dag over ours. Call it at the top level of a DAG file."""
    settings = {
        "catchup": False,
        "max_active_runs": 1,
        "default_args": DEFAULT_ARGS,
        "params": config_params(),
        "tags": ["sourcegate"],
        "doc_md": __doc__,
        **kwargs,
    }

    @dag(
        dag_id=dag_id,
        schedule=list(schedule) if isinstance(schedule, tuple) else schedule,
        start_date=start_date,
        **settings,
    )
    def sourcegate_recalibrate():
        recalibrate_tasks()

    return sourcegate_recalibrate()


def recalibrate_tasks() -> None:
    """Evaluate and gate the live version; beside it, retrain the answer model when the corpus outgrew it."""

    @task(task_id="live_version")
    def live() -> str:
        return in_store("live_version", live_version, run=recal_run_id())

    @task
    def evaluate(version: str) -> dict:
        from sourcegate.pipelines.app import steps

        def evaluate_live(run, config) -> dict:
            if live_version(run, config) != version:  # promoted meanwhile: its files are not the ones staged
                raise AirflowFailException(f"the live version moved from {version} since live_version: run again")
            return steps.evaluate_step(run, config, version=version)

        return in_store("evaluate_live", evaluate_live, run=recal_run_id())

    @task
    def gate() -> dict:
        from sourcegate.pipelines.app import steps

        return enforce_gate(in_store("gate", steps.gate_step, run=recal_run_id()))

    @task.short_circuit(task_id="corpus_share")
    def corpus_share(live_version: str) -> dict | bool:
        from sourcegate.pipelines.app import retrain_step

        version, which = retrain_step.retrain_version(cfg(), live_version)
        decided = retrain_step.needed(cfg(), version)
        log.info("retrain: measured on %s: %s", which, decided["why"])
        return {**decided, "version": version} if decided["retrain"] else False

    @task(task_id="retrain")
    def retrain(decided: dict) -> dict:
        from sourcegate.pipelines.app import retrain_step

        return retrain_step.train_candidate(cfg(), recal_run_id(), decided["version"], decided["model"])

    @task
    def judge(trained: dict) -> dict:
        from sourcegate.pipelines.app import retrain_step

        return retrain_step.judge(cfg(), recal_run_id(), trained["version"])

    @task
    def ship(judged: dict) -> dict:
        from sourcegate.pipelines.app import retrain_step

        shipped = retrain_step.ship(cfg(), recal_run_id(), Path(absolute(params()["config"])), ROOT)
        (log.info if shipped["shipped"] else log.warning)("retrain: %s", shipped)
        return shipped

    version = live()
    evaluate(version) >> gate()
    ship(judge(retrain(corpus_share(version))))
