"""Before anything is scored: the eval sets fit this corpus and the baseline is there, or the night stops.

What a night could only refuse after minutes of scoring (a set naming sections another corpus has, too few questions
of a label to claim a gap, a baseline that is not there) is not a verdict on the index: it is checked first, from the
files and the version's chunk list, and stops the night with exit 2 saying what to write and where.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sourcegate.evals.evalset import EvalSetError, check_labels, load_evalset
from sourcegate.evals.regression import BaselineError, check_baseline

HOW_TO_WRITE = (
    "Each line of an eval set is one JSON question: should-answer ones "
    '{"id": "a-001", "question": "<in your users\' words>", "label": "answer", "expected": ["<doc id>#<section id>"]}, '
    'should-decline ones {"id": "o-001", "question": "...", "label": "decline", "kind": "off_topic"}; '
    "`sourcegate init CORPUS --out DIR` scaffolds the files with a reviewed pool of off-topic questions, generated "
    "candidates to review, and the corpus's section ids (docs/calibration.md, 'Your own corpus')"
)
RETIRED = (
    "a document renamed or moved has a new id: label that one; a should-answer question whose document was removed "
    'asks what this corpus no longer answers: relabel it {"label": "decline", "kind": "near_topic"} (without '
    '"expected") or delete it'
)
SHOW = 5  # unknown labels named per set (all are counted)


class PreflightError(ValueError):
    """The night cannot be judged as configured (not a verdict: exit 2)."""


def _label_counts(items: Sequence[Mapping], decline_kinds: Sequence[str]) -> tuple[int, int]:
    answer = sum(q["label"] == "answer" for q in items)
    gated = sum(q["label"] == "decline" and (not decline_kinds or q.get("kind") in decline_kinds) for q in items)
    return answer, gated


def misspelt_kinds(items: Sequence[Mapping], decline_kinds: Sequence[str]) -> list[tuple[str, str, str]]:
    """(id, kind, gated kind) of each should-decline question whose kind is a gated one spelt otherwise ("off-topic",
    "Off_Topic" for "off_topic"): it would silently not be held to the gap."""

    def plain(kind: str) -> str:
        return "".join(c for c in kind.lower() if c.isalnum())

    gated = {plain(k): k for k in decline_kinds}
    return [
        (q["id"], q["kind"], gated[plain(q["kind"])])
        for q in items
        if q["label"] == "decline" and q.get("kind") not in decline_kinds and plain(q.get("kind") or "") in gated
    ]


def set_problems(
    role: str,
    path: str | None,
    chunks: list[dict],
    need: int | None = None,
    decline_kinds: Sequence[str] = (),
    set_aside: Mapping[str, str] | None = None,
    removed: Callable[[], Mapping[str, str]] | None = None,
) -> list[str]:
    """What keeps one eval set from judging this corpus: unreadable, labels naming no section of it (each says why:
    evalset.check_labels), and for the fit set (`need` set) fewer than `need` should-answer or gated should-decline
    questions."""
    if path is None:
        return []
    try:
        items = load_evalset(path)
    except EvalSetError as exc:
        return [f"the {role} set: {exc}"]
    found = []
    unknown = check_labels(items, chunks, str(path), dict(set_aside or {}), removed)
    if unknown:
        shown = "; ".join(u.split(": ", 1)[1] for u in unknown[:SHOW])
        more = f" and {len(unknown) - SHOW} more" if len(unknown) > SHOW else ""
        fix = "label each question with a doc id or doc#section of this corpus"
        if any("set aside tonight" in u for u in unknown):
            fix = f"fix the documents set aside (the run's quarantine.jsonl), or {fix}"
        if any("removed from the corpus" in u for u in unknown):
            fix += f"; {RETIRED}"
        found.append(
            f"the {role} set {path}: {len(unknown)} label(s) name nothing in this corpus ({shown}{more}); {fix}"
        )
    misspelt = misspelt_kinds(items, decline_kinds)
    if misspelt:
        shown = "; ".join(f"{q} has kind {k!r}, gated as {g!r}" for q, k, g in misspelt[:SHOW])
        more = f" and {len(misspelt) - SHOW} more" if len(misspelt) > SHOW else ""
        found.append(
            f"the {role} set {path}: {len(misspelt)} should-decline question(s) of a kind spelt unlike the gated one "
            f"({shown}{more}), so never held to the gap; write the kind as calibration.gate_decline_kinds does"
        )
    if need:
        answer, gated = _label_counts(items, decline_kinds)
        kinds = f" ({', '.join(decline_kinds)})" if decline_kinds else ""
        for label, have in (("should-answer", answer), (f"should-decline{kinds}", gated)):
            if have < need:
                found.append(
                    f"the {role} set {path}: {have} {label} question(s), {need} needed (calibration.min_per_label): "
                    f"write {need - have} more"
                )
    return found


def baseline_problems(path: str | None) -> list[str]:
    """A configured baseline must exist and be well formed (null: none accepted yet, said by the gate)."""
    if path is None:
        return []
    if not Path(path).is_file():
        return [
            f"evals.baseline {path} not found: after a night you trust, `sourcegate accept RUN_DIR` writes it; "
            "a corpus's first nights run with evals.baseline: null"
        ]
    try:
        check_baseline(json.loads(Path(path).read_text(encoding="utf-8")), str(path))
    except json.JSONDecodeError as exc:
        return [f"evals.baseline {path}: not valid JSON ({exc.msg}); re-accept a run you trust"]
    except BaselineError as exc:
        return [str(exc)]
    return []


def preflight(
    evals,
    calibration,
    chunks: list[dict],
    set_aside: Mapping[str, str] | None = None,
    removed: Callable[[], Mapping[str, str]] | None = None,
) -> None:
    """Raise PreflightError naming every problem of the configured eval sets and baseline (`evals` and
    `calibration`: the config's sections, read by attribute) against this version's chunks (`set_aside`: the
    documents its night quarantined, {doc id: reason}; `removed()`: the documents removed from the corpus, {doc id:
    the run that found it deleted}, asked only when a label names a document absent tonight)."""
    kinds = list(calibration.gate_decline_kinds or [])
    seen = {"set_aside": set_aside, "removed": removed}
    problems = set_problems("fit", evals.calibration_set, chunks, calibration.min_per_label, kinds, **seen)
    problems += set_problems("check", evals.check_set, chunks, None, kinds, **seen)
    problems += set_problems("precision", evals.precision_set, chunks, **seen)
    problems += baseline_problems(evals.baseline)
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems)
        raise PreflightError(
            f"the night cannot be judged as configured (nothing was scored):\n{listed}\n{HOW_TO_WRITE}"
        )
