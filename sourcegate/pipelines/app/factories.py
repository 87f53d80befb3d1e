"""The models, stores and retriever a config names, built once per process.

Steps, the CLI, the BEIR runner and the benchmarks get their embedder, cross-encoder,
index store and `Retriever` here, so each is built the same way everywhere.
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from sourcegate.artifact_io import run_folder as rf
from sourcegate.pipelines.build import embed_backends
from sourcegate.pipelines.build.embed import Embedder
from sourcegate.pipelines.config import Embedding, PipelineConfig
from sourcegate.pipelines.release import decision as decisions
from sourcegate.pipelines.release import verdict
from sourcegate.pipelines.versions import manifest as mf
from sourcegate.pipelines.versions.object_store import ObjectStore, is_remote

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # the harness imports the statistics (scipy): a query, which judges nothing, never loads them
    from sourcegate.evals.harness import Judging


@lru_cache(maxsize=2)
def embedder_for(model_id: str, model_path: str | None, batch_size: int, backend: str = "torch") -> Embedder:
    return embed_backends.load_embedder(model_id, model_path, batch_size, backend)


_SCORERS: dict[tuple, object] = {}


def scorer_for(kind: str, model_path: str | None, required: bool = False):
    """One cross-encoder per process, so its memoised pair scores (exact: one pair per session run)
    carry over between evaluations. A scorer that failed to load is not remembered: None is logged
    by load_scorer (or, `required`, ModelUnavailable raised) and the next call tries again."""
    from sourcegate.pipelines.retrieval.rerank import load_scorer

    return _one_per_process((kind, model_path), lambda: load_scorer(kind, model_path, required=required))


def _one_per_process(key: tuple, load):
    if key not in _SCORERS:
        scorer = load()
        if scorer is None:
            return None
        _SCORERS[key] = scorer
    return _SCORERS[key]


def answer_scorer_for(model_path: str | None, required: bool = False):
    """The answer-support cross-encoder, one per process like the reranker (None, logged, when it cannot load;
    `required`: its files checked against their recipes first, and ModelUnavailable raised when it cannot be used)."""
    from sourcegate.pipelines.retrieval.answer_support import load_answer_model

    key = ("answer_support", model_path)
    return _one_per_process(key, lambda: load_answer_model(model_path, required=required))


def get_embedder(embedding: Embedding) -> Embedder:
    """The bi-encoder the config's `embedding` section names."""
    e = embedding
    return embedder_for(e.model_id, e.model_path, e.batch_size, e.backend)


def judging(cfg: PipelineConfig) -> Judging:
    """The sections of `cfg` an evaluation and its gate read (sourcegate/evals/harness.py)."""
    from sourcegate.evals.harness import Judging

    r = cfg.retrieval
    return Judging(
        cfg.evals, cfg.calibration, cfg.answer, cfg.reranker, r.rerank_depth, cfg.answerability.answer_passages
    )


def open_store(cfg: PipelineConfig, root: str | Path | None = None, progress: bool = False):
    """The config's index store. `root`: the local artifacts folder the steps work in, when it is not
    `cfg.artifacts` (a scratch folder staged from an object store: sourcegate/pipelines/app/staging.py).
    `progress`: a bar while OpenSearch loads (a quiet run and a DAG task show none)."""
    if cfg.backend.kind == "opensearch":
        from sourcegate.pipelines.search.opensearch import OpenSearchStore

        return OpenSearchStore.from_config(cfg, progress=progress)
    from sourcegate.pipelines.search.embedded import EmbeddedStore

    if root is None and is_remote(cfg.artifacts):  # serving from an object store: versions cached locally, verified
        from sourcegate.pipelines.app.version_cache import CachedStore

        return CachedStore(cfg.artifacts)
    root = Path(root if root is not None else cfg.artifacts)
    return EmbeddedStore(root / rf.RUNS, root / "LIVE")


def retriever_for(cfg: PipelineConfig, searcher, required: bool = True, wanted: frozenset[str] | None = None):
    """The config's retriever over `searcher`, and its reranker. `required` (a night, a calibration, a benchmark):
    a configured reranker or answer model that cannot be used raises ModelUnavailable before anything is scored,
    since a signal it would give would be missing from every question and the verdict would measure the
    failure. Serving (`serving_for`) passes False: there the reranker is a preference. `wanted`: the signals
    computed (None: every one, as a night)."""
    from sourcegate.pipelines.retrieval.retriever import Retriever

    embedder = get_embedder(cfg.embedding)
    mf.check_model(getattr(searcher, "manifest", None), embedder.fingerprint)  # a verified version records it
    scorer = scorer_for(cfg.reranker.kind, cfg.reranker.model_path, required=required)
    section = cfg.answerability
    answer = answer_scorer_for(section.answer_model_path, required=required) if section.answer_support else None
    return Retriever.from_config(searcher, embedder, scorer, cfg, answer_scorer=answer, wanted=wanted), scorer


@dataclass
class Serving:
    """What answers a query: the retriever, the decision `answer.decide` applies, the verdict it was proven by,
    what differs from that verdict's decision (empty unless answering `unproven`), what an unproven answer uses
    (`decision.unproven`), and how many text vectors the verdict's night lent (its bound text_vectors.parquet; 0:
    every text is encoded)."""

    retriever: object
    decision: dict
    proven_by: str
    overridden: list[str] = field(default_factory=list)
    kept_vectors: int = 0
    unproven_basis: str = ""


def verdict_of(cfg: PipelineConfig, version: str) -> tuple[dict | None, str]:
    """A version's gate verdict (None when it has none) and where it was read, from the artifacts store."""
    key = f"runs/{version}/gate.json"
    if is_remote(cfg.artifacts):
        data = ObjectStore.from_uri(cfg.artifacts).get(key)
        return (json.loads(data) if data else None), f"{cfg.artifacts.rstrip('/')}/{key}"
    path = Path(cfg.artifacts) / key
    return (json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None), str(path)


def serving_for(
    cfg: PipelineConfig, index: str | Path | None = None, unproven: bool = False, all_signals: bool = False
) -> Serving:
    """The live version (or the embedded run folder `index`) and the decision its passed verdict proved (G11).

    The version is opened (and verified) first; then a config value or a model on disk that differs from the
    decision, or a version without a passed verdict, is refused (decision.NotProven) unless `unproven`, which
    answers with the config as it is (or the decision a failed verdict's night chose with that config) and lists
    what differs. A question computes the signals the decision reads
    (its gating and strong signals, and the cheap ones beside them); `all_signals`: every signal a night measures."""
    from sourcegate.evals.answer_modes import signals_read
    from sourcegate.pipelines.retrieval.retriever import ENCODED_SIGNALS

    if index is not None:
        from sourcegate.pipelines.search.embedded import open_run_folder

        searcher = open_run_folder(index)
        path = Path(index) / rf.GATE
        gate, where = (json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None), str(path)
    else:
        store = open_store(cfg)
        live = store.live()
        searcher = store.open(live)
        gate, where = verdict_of(cfg, live)
    try:
        decision = decisions.of_verdict(gate, where)
        overridden = decisions.mismatches(decision, cfg, None if all_signals else signals_read(decision))
    except decisions.NotProven as exc:
        decision, overridden = {}, [str(exc)]
    if overridden and not unproven:
        raise decisions.refusal(where, overridden)
    basis = ""
    if overridden:
        decision, basis = decisions.unproven(gate, cfg)
    loading = preload_cross_encoders(cfg)  # only for a version that can be served
    get_embedder(cfg.embedding)  # torch's import and the bi-encoder, beside the cross-encoders' sessions
    loading.join()
    wanted = None if all_signals else signals_read(decision)  # each signal is computed as alone (retriever.wanted)
    retriever, _ = retriever_for(cfg, searcher, required=False, wanted=wanted)  # serving: the reranker is a preference
    if not retriever.wants(*ENCODED_SIGNALS):  # the kept vectors serve only the signals that encode texts
        lent = 0
    elif is_remote(where):  # the verdict's folder on the store: its kept vectors fetched, then checked as a local file
        with tempfile.TemporaryDirectory(prefix="sourcegate-kept-") as tmp:
            fetch_kept(cfg, f"{rf.RUNS}/{live}/{rf.TEXT_VECTORS}", Path(tmp) / rf.TEXT_VECTORS)
            lent = kept_text_vectors(retriever, gate, Path(tmp))
    else:
        lent = kept_text_vectors(retriever, gate, Path(where).parent)
    return Serving(retriever, decision, where, overridden, lent, basis)


def preload_cross_encoders(cfg: PipelineConfig) -> threading.Thread:
    """Load the configured reranker and answer model on a thread while the caller imports torch: ONNX Runtime
    builds its sessions mostly outside the GIL (about 0.3 s of a cold `query` on two cores,
    docs/benchmarks/26-serve.md's last section). One that fails is loaded again by `retriever_for`, which reports it."""

    def load() -> None:
        try:
            scorer_for(cfg.reranker.kind, cfg.reranker.model_path)
            if cfg.answerability.answer_support:
                answer_scorer_for(cfg.answerability.answer_model_path)
        except Exception:  # noqa: BLE001 - retriever_for loads it again and says why
            log.debug("preloading the cross-encoders failed", exc_info=True)

    thread = threading.Thread(target=load, name="sourcegate-preload", daemon=True)
    thread.start()
    return thread


def fetch_kept(cfg: PipelineConfig, key: str, dest: Path) -> None:
    """A kept file from the artifacts store as `dest` (a large one is stored as a pointer to segments: rebuilt);
    nothing when it cannot be fetched, since serving then encodes every text as before."""
    from sourcegate.pipelines.versions import segments

    store = ObjectStore.from_uri(cfg.artifacts)
    try:
        if store.exists(key):
            segments.download(store, key, dest)
    except (OSError, segments.RebuildMismatch) as exc:
        log.warning("serving without kept text vectors: %s could not be fetched: %s", key, exc)


def kept_text_vectors(retriever, gate: dict | None, folder: Path) -> int:
    """Load the passage-sentence and word vectors the verdict's night kept, if the file is the one the verdict
    bound (exact under the bi-encoder's binding, sourcegate/pipelines/retrieval/kept.py): a question then encodes
    only its own texts. Any other file is not read, and every text is encoded as before; returns how many."""
    path, why_not = verdict.bound_kept_file(gate, folder, rf.TEXT_VECTORS)
    if path is None:  # a file there but not read is worth a warning: it was altered, or no verdict bound it
        level = logging.WARNING if (folder / rf.TEXT_VECTORS).is_file() else logging.INFO
        log.log(level, "serving without kept text vectors: %s", why_not)
        return 0
    return retriever.text_vectors.load_kept(path)


def preflight(cfg: PipelineConfig) -> None:
    """The backend's pre-flight check before a night writes (OpenSearch: health and blocks; embedded: none)."""
    if cfg.backend.kind == "opensearch":
        from sourcegate.pipelines.search.opensearch.health import preflight as opensearch_preflight

        store = open_store(cfg)
        opensearch_preflight(store.client, store.prefix)
