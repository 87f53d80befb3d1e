"""The models, stores and retriever a config names, built once per process.

Steps, the CLI, the BEIR runner and the benchmarks get their embedder, cross-encoder,
index store and `Retriever` here, so each is built the same way everywhere.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pipelines.build import embed_backends
from pipelines.build.embed import Embedder
from pipelines.config import PipelineConfig
from pipelines.versions import manifest as mf
from pipelines.versions.object_store import is_remote


@lru_cache(maxsize=2)
def embedder_for(model_id: str, model_path: str | None, batch_size: int, backend: str = "torch") -> Embedder:
    return embed_backends.load_embedder(model_id, model_path, batch_size, backend)


_SCORERS: dict[tuple, object] = {}


def scorer_for(kind: str, model_path: str | None):
    """One cross-encoder per process, so its memoised pair scores (exact: one pair per session run)
    carry over between evaluations. A scorer that failed to load is not remembered: None is logged
    by load_scorer and the next call tries again."""
    from pipelines.retrieval.rerank import load_scorer

    return _one_per_process((kind, model_path), lambda: load_scorer(kind, model_path))


def _one_per_process(key: tuple, load):
    if key not in _SCORERS:
        scorer = load()
        if scorer is None:
            return None
        _SCORERS[key] = scorer
    return _SCORERS[key]


def answer_scorer_for(model_path: str | None):
    """The answer-support cross-encoder, one per process like the reranker (None, logged, when it cannot load)."""
    from pipelines.retrieval.answer_support import load_answer_model

    return _one_per_process(("answer_support", model_path), lambda: load_answer_model(model_path))


def get_embedder(cfg: PipelineConfig) -> Embedder:
    e = cfg.embedding
    return embedder_for(e.model_id, e.model_path, e.batch_size, e.backend)


def open_store(cfg: PipelineConfig):
    if cfg.backend.kind == "opensearch":
        from pipelines.search.opensearch import OpenSearchStore

        return OpenSearchStore.from_config(cfg)
    from pipelines.search.embedded import EmbeddedStore

    if is_remote(cfg.artifacts):  # serving from an object store: versions cached locally, verified
        from pipelines.app.version_cache import CachedStore

        return CachedStore(cfg.artifacts)
    root = Path(cfg.artifacts)
    return EmbeddedStore(root / "runs", root / "LIVE")


def retriever_for(cfg: PipelineConfig, searcher):
    from pipelines.retrieval.retriever import Retriever

    embedder = get_embedder(cfg)
    mf.check_model(getattr(searcher, "manifest", None), embedder.fingerprint)  # a verified version records it
    scorer = scorer_for(cfg.reranker.kind, cfg.reranker.model_path)
    answer = answer_scorer_for(cfg.answerability.answer_model_path) if cfg.answerability.answer_support else None
    return Retriever.from_config(searcher, embedder, scorer, cfg, answer_scorer=answer), scorer


def preflight(cfg: PipelineConfig) -> None:
    """The backend's pre-flight check before a night writes (OpenSearch: health and blocks; embedded: none)."""
    if cfg.backend.kind == "opensearch":
        from pipelines.search.opensearch.health import preflight as opensearch_preflight

        store = open_store(cfg)
        opensearch_preflight(store.client, store.prefix)
