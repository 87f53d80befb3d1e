"""The answer mode a gating-signal value gets under the thresholds in config (`answer.*`).

One rule for both sides: the evaluation records each question's mode with it (questions.jsonl,
`sourcegate diff`), and `pipelines.retrieval.answer.decide` applies it to a live query.
"""

from __future__ import annotations


def mode_for(value: float | None, answer) -> tuple[str, float]:
    """The answer mode for a gating-signal value, and the threshold that decided it (`answer`: the config's
    `answer` section, pipelines.config.Answer)."""
    strong, adjacent = answer.strong, answer.adjacent
    if value is not None and value >= strong:
        return "sourced", strong
    if value is not None and value >= adjacent:
        return "adjacent", adjacent
    # A missing signal (e.g. the reranker failed while it gates) is treated as no source.
    return answer.below, adjacent
