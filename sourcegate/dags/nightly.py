"""sourcegate_nightly: rebuild the retrieval index, evaluate it, promote it only if the gate passes.

ingest -> chunk -> embed (mapped over shards) -> merge -> validate -> load a NEW index version
-> evaluate -> gate -> promote (alias swap; emits the live-index asset) -> cleanup (retention; a teardown, so it
also runs after a failed gate, and the run's state is promote's).

The run id (run folder and index version) is the logical date, `YYYYMMDD-HHMMSS` (UTC): re-running
a night reuses its folder and, once loaded, its index version (never rebuilt: a rerun from other
inputs is refused and needs a new run id). A failed gate fails the run
before promote, so the live index stays on the last good version; the failed version stays on disk
with its report for a maintainer to inspect. Params override the config file's corpus and backend.
Every task body is a call into `sourcegate.pipelines.app.steps`; the wiring helpers are in `common.py`.
A DAG file builds it with `nightly_dag()` (the repository's dags/sourcegate_nightly.py is one such file).
"""

from __future__ import annotations

from airflow.sdk import dag, task

from sourcegate.dags.common import (
    DEFAULT_ARGS,
    LIVE_INDEX,
    NIGHTLY_SCHEDULE,
    RETRY_ARGS,
    START_DATE,
    dag_actor,
    enforce_gate,
    in_store,
    nightly_params,
    params,
    shard_list,
)


def nightly_dag(dag_id: str = "sourcegate_nightly", schedule=NIGHTLY_SCHEDULE, start_date=START_DATE, **kwargs):
    """The nightly DAG with today's id, schedule and params by default; `kwargs` go to Airflow's @dag (tags,
    default_args, max_active_runs, ...) over ours. Call it at the top level of a DAG file."""
    settings = {
        "catchup": False,
        "max_active_runs": 1,
        "default_args": DEFAULT_ARGS,
        "params": nightly_params(),
        "tags": ["sourcegate"],
        "doc_md": __doc__,
        # No backfills: a night builds today's corpus whatever its logical date, so a backfill would build N copies
        # of today under past run ids, beside the scheduled night (backfills have their own max_active_runs)
        "allowed_run_types": ["scheduled", "manual", "operator_triggered"],
        **kwargs,
    }

    @dag(dag_id=dag_id, schedule=schedule, start_date=start_date, **settings)
    def sourcegate_nightly():
        nightly_tasks()

    return sourcegate_nightly()


def nightly_tasks() -> None:
    """The night's tasks and their order, inside the DAG being built."""

    @task
    def ingest() -> dict:
        from sourcegate.pipelines.app import steps

        return in_store("ingest", steps.ingest_step)

    @task
    def chunk() -> list[int]:
        from sourcegate.pipelines.app import steps

        return shard_list(in_store("chunk", lambda run, c: steps.chunk_step(run, c.chunking, c.embedding)))

    @task
    def embed(shard: int, shards: list[int]) -> dict:
        from sourcegate.pipelines.app import steps

        cache = not params()["full_rebuild"]
        part = (shard, len(shards))
        return in_store("embed", lambda run, c: steps.embed_step(run, c.embedding, *part, use_cache=cache), shard=part)

    @task
    def merge(shard_stats) -> int:
        from sourcegate.pipelines.app import steps

        return in_store("merge", lambda run, c: steps.merge_step(run, c.embedding, list(shard_stats)))

    @task
    def validate() -> bool:
        from sourcegate.pipelines.app import steps

        return in_store("validate", lambda run, _: steps.validate_step(run))

    @task(**RETRY_ARGS)
    def load() -> int:
        from sourcegate.pipelines.app import steps

        full = params()["full_rebuild"]
        return in_store("load", lambda run, c: steps.load_step(run, c, full=full))

    @task
    def evaluate() -> dict:
        from sourcegate.pipelines.app import steps

        return in_store("evaluate", steps.evaluate_step)

    @task
    def gate() -> dict:
        from sourcegate.pipelines.app import steps

        return enforce_gate(in_store("gate", steps.gate_step))

    @task(outlets=[LIVE_INDEX], **RETRY_ARGS)
    def promote() -> str:
        from sourcegate.pipelines.app import steps

        return in_store("promote", lambda run, c: steps.promote_step(run, c, actor=dag_actor()))

    @task
    def cleanup() -> dict:
        from sourcegate.pipelines.app import steps

        return in_store("cleanup", lambda run, c: steps.cleanup_step(run.root, c))

    shards = chunk()
    ingest() >> shards
    shard_stats = embed.partial(shards=shards).expand(shard=shards)
    # cleanup is a teardown: it runs once promote is done whatever its state (retention also after a failed gate,
    # so a streak of failed nights does not keep every version until the next pass), and the run's state stays
    # promote's: a failed gate still fails the run
    merge(shard_stats) >> validate() >> load() >> evaluate() >> gate() >> promote() >> cleanup().as_teardown()
