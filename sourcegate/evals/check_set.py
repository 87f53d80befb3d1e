"""A check set stays a check set: once a threshold has seen its questions, they are fit data.

A check question is unseen while no accepted threshold was chosen after its scores could be read.
`sourcegate accept` adopting a run whose shipped threshold differs from the one the baseline was
accepted with adopts a threshold that may have been moved by those scores (reusing a holdout until
it passes is tuning to it), so every check question that run scored moves into the fit set, and the
move is logged. Fresh check questions are then written from the articles, in users' words, before
any of their scores is looked at (docs/calibration.md, "Adding fresh check questions").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sourcegate.artifact_io import write_text
from sourcegate.evals.evalset import load_evalset


def threshold_of(calibration: Mapping) -> dict[str, Any] | None:
    shipped = calibration.get("shipped") or {}
    return {"signal": shipped["signal"], "adjacent": shipped["threshold"]} if shipped else None


def seen_check_questions(calibration: Mapping, baseline: Mapping | None) -> list[str]:
    """Ids of the run's check questions a newly accepted threshold has seen ([] when it is not new)."""
    check = calibration.get("check") or {}
    accepted = (baseline or {}).get("threshold")
    if not check or threshold_of(calibration) == accepted:
        return []
    return [q["id"] for q in check.get("questions", ())]


def _lines_by_id(path: Path) -> dict[str, str]:
    rows = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rows[json.loads(line)["id"]] = line
    return rows


def move_to_fit(check_path: str | Path, fit_path: str | Path, ids: list[str]) -> dict[str, Any]:
    """Move the check set's lines for `ids` to the end of the fit set, each file rewritten atomically.

    Both files are validated first (sourcegate/evals/evalset.py); an id already in the fit set is an error,
    and nothing is written.
    """
    check_path, fit_path = Path(check_path), Path(fit_path)
    load_evalset(check_path), load_evalset(fit_path)
    check, fit = _lines_by_id(check_path), _lines_by_id(fit_path)
    wanted = [i for i in ids if i in check]
    clash = sorted(set(wanted) & set(fit))
    if clash:
        raise ValueError(f"check questions {', '.join(clash[:5])} already have an id in the fit set {fit_path}")
    kept = [line for i, line in check.items() if i not in set(wanted)]
    fit_text = fit_path.read_text(encoding="utf-8")
    moved = "".join(check[i] + "\n" for i in wanted)
    write_text(fit_text + ("" if not fit_text or fit_text.endswith("\n") else "\n") + moved, fit_path)
    write_text("".join(line + "\n" for line in kept), check_path)
    return {"moved": wanted, "remaining": len(kept), "check_set": str(check_path), "fit_set": str(fit_path)}


def log_move(record: Mapping[str, Any], log_path: str | Path) -> Path:
    """Append one move to the log (JSON Lines), rewritten atomically: every move stays on record."""
    path = Path(log_path)
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    return write_text(before + json.dumps(dict(record), sort_keys=True) + "\n", path)
