"""The answer mode a question's signals get under the thresholds in config (`answer.*`).

Each state rests on its own signal (docs/decisions/0004): `decline` on `answer.signal` (the gating signal: coverage
means "not declined", and the gate holds it to every set), `sourced` on `answer.strong_signal` (the
signal that is surest a passage answers; the gating signal when unset). One rule for both sides: the
evaluation records each question's mode with it (questions.jsonl, `sourcegate diff`, the report's
bands), and `sourcegate.pipelines.retrieval.answer.decide` applies it to a live query.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

MODES = ("sourced", "adjacent", "decline", "open")


def _get(answer, key: str):
    return answer.get(key) if isinstance(answer, Mapping) else getattr(answer, key, None)


def signals_read(answer) -> frozenset[str]:
    """The signals `mode_for` reads under `answer`: the gating signal and the strong one (the gating one when unset)."""
    keep_signal = _get(answer, "signal")
    return frozenset(filter(None, (keep_signal, _get(answer, "strong_signal") or keep_signal)))


def has_score(value: float | None) -> bool:
    """A signal's value that can be compared: not missing, not NaN or infinite (a model's NaN logit is no score)."""
    return value is not None and math.isfinite(value)


def mode_for(signals: Mapping[str, float | None], answer) -> tuple[str, str, float]:
    """(mode, the signal that decided it, its threshold) for one question's signals; `answer` is the
    config's `answer` section (sourcegate.pipelines.config.Answer) or the same keys as a mapping."""
    keep_signal, adjacent = _get(answer, "signal"), _get(answer, "adjacent")
    strong_signal = _get(answer, "strong_signal") or keep_signal
    kept = signals.get(keep_signal)
    # A missing signal (e.g. the reranker failed while it gates) is treated as no source, as the sweep treats it.
    if not has_score(kept) or kept < adjacent:
        return _get(answer, "below") or "decline", keep_signal, adjacent
    sure = signals.get(strong_signal)
    if has_score(sure) and sure >= _get(answer, "strong"):
        return "sourced", strong_signal, _get(answer, "strong")
    return "adjacent", keep_signal, adjacent


def mode_bands(records: Iterable[Mapping], answer) -> dict[str, dict[str, int]]:
    """How many questions of each kind (and label) fall in each answer mode: what each band holds."""
    bands: dict[str, dict[str, int]] = {}
    for r in records:
        kind = f"{r['label']}/{r.get('kind') or '-'}"
        mode = mode_for(r.get("signals") or {}, answer)[0]
        bands.setdefault(kind, dict.fromkeys(MODES, 0))[mode] += 1
    return dict(sorted(bands.items()))
