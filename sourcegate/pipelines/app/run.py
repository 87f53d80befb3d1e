"""`sourcegate run`: the whole nightly job in one process, step after step.

build (ingest -> chunk -> embed -> validate -> load a new version) -> evaluate -> gate ->
promote only if the gate passed -> retention. A failed night leaves the live index alone.
"""

from __future__ import annotations

from sourcegate.artifact_io import run_folder as rf
from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.evals.gate import gating_signal_text
from sourcegate.pipelines.app import factories, staging, steps
from sourcegate.pipelines.config import PipelineConfig
from sourcegate.pipelines.release.lock import writer_lock


def build(run: RunFolder, cfg: PipelineConfig, progress: bool = False, shards: int = 1, judged: bool = False) -> dict:
    """Build one index version. `judged`: the configured eval sets will judge it, so they are checked against its
    chunks before anything is embedded (a set that cannot judge this corpus stops the night in seconds)."""
    counts = steps.ingest_step(run, cfg)
    steps.chunk_step(run, cfg.chunking, cfg.embedding)
    if judged:
        steps.check_eval_sets(cfg, run, run / rf.CHUNKS_TEXT)
    stats = [steps.embed_step(run, cfg.embedding, s, shards, progress=progress) for s in range(shards)]
    encoded = steps.merge_step(run, cfg.embedding, stats)
    steps.validate_step(run)
    indexed = steps.load_step(run, cfg, progress=progress)
    quarantined = run.info()["quarantine"]["total"]  # every step's
    return {"ingest": counts, "encoded": encoded, "indexed": indexed, "quarantined": quarantined}


def run_pipeline(cfg: PipelineConfig, run_id: str | None = None, progress: bool = False, promote: bool = True) -> dict:
    run_id = run_id or steps.new_run_id()
    factories.preflight(cfg)  # a red cluster or a write block fails the night before its first write
    # the whole night is one writer; s3:// artifacts: staged in scratch, published after
    with writer_lock(cfg, f"sourcegate run {run_id}"), staging.staged(cfg, run_id) as root:
        return _run_locked(RunFolder(root, run_id), cfg, progress, promote)


def _run_locked(run: RunFolder, cfg: PipelineConfig, progress: bool, promote: bool) -> dict:
    steps.record_stop(run, None)  # a rerun of a night that stopped: no longer stopped
    try:
        return _night(run, cfg, progress, promote)
    except BaseException as exc:  # an interrupt too: the folder says the night stopped, and where
        steps.record_stop(run, exc)
        raise


def _night(run: RunFolder, cfg: PipelineConfig, progress: bool, promote: bool) -> dict:
    built = build(run, cfg, progress=progress, judged=True)
    steps.evaluate_step(run, cfg, progress=progress)
    gate = steps.gate_step(run, cfg)
    if gate["passed"] and promote:  # --no-promote: a dry-run night; `sourcegate promote RUN` can finish it
        steps.promote_step(run, cfg)
    if promote:  # retention after a failed gate too: a streak of failed nights keeps only backend.keep_failed_days
        steps.cleanup_step(run.root, cfg)
    c = built["ingest"]
    summary = (
        f"{c['documents']} documents ({c['added']} added, {c['changed']} changed, {c['deleted']} deleted, "
        f"{c['unchanged']} unchanged, {built['quarantined']} quarantined); {built['indexed']} chunks, "
        f"{built['encoded']} texts encoded"
    )
    return {
        "run_id": run.run_id,
        "run_dir": run.published(),  # where it is published, not the scratch
        "passed": gate["passed"],
        "reasons": gate["reasons"],
        "signal": gating_signal_text(gate),
        "summary": summary,
        "live": factories.open_store(cfg, run.root).live(),
        "built": built,
    }
