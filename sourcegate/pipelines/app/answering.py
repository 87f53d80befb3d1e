"""One question answered under a `Serving` (the version and the decision its verdict proved), as the payload
`sourcegate query --json` prints and `sourcegate serve` returns: one function, so the two never drift apart."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sourcegate.pipelines.config import PipelineConfig


@dataclass
class Answered:
    """A question's retrieval, the decision applied to it, and the payload that reports both."""

    retrieval: object
    answer: object
    payload: dict

    @property
    def applied(self) -> bool:
        return bool(self.answer.applied)


def ask(cfg: PipelineConfig, serving, question: str, context: Sequence[str] = ()) -> Answered:
    """Retrieve `question` (after its prior turns `context`) and apply the serving decision to it."""
    from sourcegate.pipelines.retrieval.answer import decide

    retrieval = serving.retriever.retrieve(question, list(context))
    answer = decide(retrieval, serving.decision)
    payload = {
        "question": question,
        "context": list(context),
        "query": retrieval.query,
        "mode": answer.mode,
        "signal": answer.signal,
        "value": answer.value,
        "threshold": answer.threshold,
        "proven_by": None if serving.overridden else serving.proven_by,
        "unproven": bool(serving.overridden),
        "overridden": serving.overridden,
        "decision_applied": answer.applied,
        "notice": query_notice(serving, answer),
        "calibrated_by": cfg.answer.calibrated_by,
        "reranked": retrieval.reranked,
        "signals": retrieval.signals,
        "dropped_as_noise": answer.dropped_as_noise,
        "passages": [c.to_dict() for c in answer.passages],
    }
    return Answered(retrieval, answer, payload)


def query_notice(serving, answer) -> str | None:
    """The first line of a query that is not the proven decision applied: answered unproven, and/or its gating
    signal missing (a decline that measured nothing)."""
    notes = []
    if serving.overridden:
        basis = serving.unproven_basis or "the config as it is"
        notes.append(f"UNPROVEN: answered with {basis}, not a proven decision: " + "; ".join(serving.overridden))
    if not answer.applied:
        decision = "the decision" if serving.overridden else f"the proven decision ({serving.proven_by})"
        signal = serving.decision["signal"]
        why = (
            "its gating signal is `auto`, which only a night chooses, and no verdict of this version records a choice"
            if signal == "auto"
            else f"its gating signal {signal} could not be computed (see the log, -v)"
        )
        notes.append(f"NOT APPLIED: {decision} could not be applied: {why}, so the question is declined")
    return " | ".join(notes) or None
