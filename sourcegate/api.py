"""The public API: what a script outside the pipeline calls (the benchmarks, a notebook, a team's own job).

A night's steps over a run folder and the whole build; the components a config names; the BEIR runner; one question
answered under the proven decision; staging a task's folder on an object store; the command line. What is not named
here may move between releases; tests/test_layers.py holds the benchmarks to this module.
"""

from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines.app.answering import ask
from sourcegate.pipelines.app.beir import (
    calibrate_beir,
    doc_ranking,
    evaluate_systems,
    index_dataset,
    run_beir,
)
from sourcegate.pipelines.app.cli import DEFAULT_CONFIG
from sourcegate.pipelines.app.cli import main as cli
from sourcegate.pipelines.app.factories import (
    answer_scorer_for,
    get_embedder,
    judging,
    open_store,
    retriever_for,
    scorer_for,
    serving_for,
)
from sourcegate.pipelines.app.run import build
from sourcegate.pipelines.app.staging import Snapshot, publish, task_staged
from sourcegate.pipelines.app.steps import (
    chunk_step,
    cleanup_step,
    embed_step,
    evaluate_step,
    gate_step,
    ingest_step,
    load_step,
    merge_step,
    new_run_id,
    promote_step,
    validate_step,
)
from sourcegate.pipelines.build.beir_queries import load_queries
from sourcegate.pipelines.config import load as load_config
from sourcegate.pipelines.release.verdict import embedding_fingerprint

__all__ = [
    "DEFAULT_CONFIG",
    "RunFolder",
    "Snapshot",
    "answer_scorer_for",
    "ask",
    "build",
    "calibrate_beir",
    "chunk_step",
    "cleanup_step",
    "cli",
    "doc_ranking",
    "embed_step",
    "embedding_fingerprint",
    "evaluate_step",
    "evaluate_systems",
    "gate_step",
    "get_embedder",
    "judging",
    "index_dataset",
    "ingest_step",
    "load_config",
    "load_queries",
    "load_step",
    "merge_step",
    "new_run_id",
    "open_store",
    "promote_step",
    "publish",
    "retriever_for",
    "run_beir",
    "scorer_for",
    "serving_for",
    "task_staged",
    "validate_step",
]
