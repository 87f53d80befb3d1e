"""Answer modes, decided in code from calibrated signals and thresholds (sourcegate/evals/answer_modes.py): those of the
decision the live version's verdict proved (sourcegate/pipelines/release/decision.py; `answer.*` of the config only when
answering unproven, which says so).

decline  : the gating signal < adjacent (or `open`, if `below` says so) — with the three closest
           candidates and their scores, so a refusal can be checked.
sourced  : otherwise, when the strong signal >= strong
adjacent : otherwise: the closest sources, flagged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sourcegate.evals.answer_modes import mode_for
from sourcegate.pipelines import config
from sourcegate.pipelines.retrieval.retriever import Candidate, Retrieval

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
    applied: bool = True  # False: the gating signal could not be computed, so the decision could not be applied


def decide(retrieval: Retrieval, decision: config.Answer | Mapping, max_passages: int = 5) -> Answer:
    """The answer under `decision` (a proven decision, or the config's `answer` section: the same keys)."""
    mode, signal, threshold = mode_for(retrieval.signals, decision)
    value = retrieval.signals.get(signal)
    gating = decision.get("signal") if isinstance(decision, Mapping) else decision.signal
    applied = retrieval.signals.get(gating) is not None  # a missing signal declines: never a measured decline
    if mode not in ("sourced", "adjacent"):
        return Answer(mode, signal, value, threshold, retrieval.ranked[:3], applied=applied)
    passages, dropped = drop_noise(retrieval.ranked[:max_passages], signal, threshold)
    return Answer(mode, signal, value, threshold, passages, dropped, applied)


def drop_noise(candidates: list[Candidate], signal: str, threshold: float) -> tuple[list[Candidate], int]:
    """Passages scoring under half the threshold are noise: fewer, better passages beat padding."""
    attr = PASSAGE_SCORE.get(signal)
    if attr is None:
        return candidates, 0
    keep = [c for c in candidates if getattr(c, attr) is None or getattr(c, attr) >= threshold / 2]
    return keep, len(candidates) - len(keep)
