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


def build(cfg: PipelineConfig, run_id: str, progress: bool = False, shards: int = 1, judged: bool = False) -> dict:
    """Build one index version. `judged`: the configured eval sets will judge it, so they are checked against its
    chunks before anything is embedded (a set that cannot judge this corpus stops the night in seconds)."""
    run = RunFolder(cfg.artifacts, run_id)
    counts = steps.ingest_step(cfg, run_id)
    steps.chunk_step(cfg, run_id)
    if judged:
        steps.check_eval_sets(cfg, run / rf.CHUNKS_TEXT)
    stats = [steps.embed_step(cfg, run_id, s, shards, progress=progress) for s in range(shards)]
    encoded = steps.merge_step(cfg, run_id, stats)
    steps.validate_step(cfg, run_id)
    indexed = steps.load_step(cfg, run_id)
    quarantined = run.info()["quarantine"]["total"]  # every step's
    return {"ingest": counts, "encoded": encoded, "indexed": indexed, "quarantined": quarantined}


def run_pipeline(cfg: PipelineConfig, run_id: str | None = None, progress: bool = False, promote: bool = True) -> dict:
    run_id = run_id or steps.new_run_id()
    factories.preflight(cfg)  # a red cluster or a write block fails the night before its first write
    # the whole night is one writer; s3:// artifacts: staged in scratch, published after
    with writer_lock(cfg, f"sourcegate run {run_id}"), staging.staged(cfg, run_id) as local:
        return _run_locked(local, run_id, progress, promote)


def _run_locked(cfg: PipelineConfig, run_id: str, progress: bool, promote: bool) -> dict:
    built = build(cfg, run_id, progress=progress, judged=True)
    steps.evaluate_step(cfg, run_id, progress=progress)
    gate = steps.gate_step(cfg, run_id)
    if gate["passed"] and promote:  # --no-promote: a dry-run night; `sourcegate promote RUN` can finish it
        steps.promote_step(cfg, run_id)
        steps.cleanup_step(cfg)
    c = built["ingest"]
    summary = (
        f"{c['documents']} documents ({c['added']} added, {c['changed']} changed, {c['deleted']} deleted, "
        f"{c['unchanged']} unchanged, {built['quarantined']} quarantined); {built['indexed']} chunks, "
        f"{built['encoded']} texts encoded"
    )
    return {
        "run_id": run_id,
        "run_dir": RunFolder(cfg.artifacts, run_id).published(),  # where it is published, not the scratch
        "passed": gate["passed"],
        "reasons": gate["reasons"],
        "signal": gating_signal_text(gate),
        "summary": summary,
        "live": factories.open_store(cfg).live(),
        "built": built,
    }
