"""Answer modes, decided in code from calibrated signals and thresholds in config (evals/answer_modes.py).

decline  : answer.signal < answer.adjacent (or `open`, if configured) — with the three closest
           candidates and their scores, so a refusal can be checked.
sourced  : otherwise, when answer.strong_signal >= answer.strong
adjacent : otherwise: the closest sources, flagged.
"""

from __future__ import annotations

from dataclasses import dataclass

from evals.answer_modes import mode_for
from pipelines import config
from pipelines.retrieval.retriever import Candidate, Retrieval

# Which per-passage score is on the same scale as each gating signal (for the noise cut).
PASSAGE_SCORE = {"rerank_top": "rerank_probability", "cosine_top": "cosine", "bm25_top": "bm25_score"}


@dataclass
class Answer:
    mode: str
    signal: str
    value: float | None
    threshold: float
    passages: list[Candidate]
    dropped_as_noise: int = 0


def decide(retrieval: Retrieval, answer: config.Answer, max_passages: int = 5) -> Answer:
    mode, signal, threshold = mode_for(retrieval.signals, answer)
    value = retrieval.signals.get(signal)
    if mode not in ("sourced", "adjacent"):
        return Answer(mode, signal, value, threshold, retrieval.ranked[:3])
    passages, dropped = drop_noise(retrieval.ranked[:max_passages], signal, threshold)
    return Answer(mode, signal, value, threshold, passages, dropped)


def drop_noise(candidates: list[Candidate], signal: str, threshold: float) -> tuple[list[Candidate], int]:
    """Passages scoring under half the threshold are noise: fewer, better passages beat padding."""
    attr = PASSAGE_SCORE.get(signal)
    if attr is None:
        return candidates, 0
    keep = [c for c in candidates if getattr(c, attr) is None or getattr(c, attr) >= threshold / 2]
    return keep, len(candidates) - len(keep)
