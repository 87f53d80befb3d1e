"""No test reads a check set's questions: a check set judges a decision once, and a test that held its questions
would make every CI run a look at it (config/evals/sets.yaml: roles `check` and `next-check`).

Installed by tests/conftest.py as an audit hook on `open`, so any read in the test process, through any API that
opens the file from Python, raises. Subprocesses a test starts (Airflow tasks) are not covered: their nights run on
the test sets of tests/promotable.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
EVALS = ROOT / "config" / "evals"
GUARDED_ROLES = ("check", "next-check")


def guarded_paths() -> frozenset[str]:
    sets = yaml.safe_load((EVALS / "sets.yaml").read_text(encoding="utf-8"))["sets"]
    return frozenset(str((EVALS / s["file"]).resolve()) for s in sets if s["role"] in GUARDED_ROLES)


GUARDED = guarded_paths()
_NAMES = frozenset(os.path.basename(p) for p in GUARDED)


def _refuse_check_sets(event: str, args: tuple) -> None:
    if event != "open" or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path = os.fsdecode(args[0])
    if os.path.basename(path) in _NAMES and str(Path(path).resolve()) in GUARDED:
        raise PermissionError(f"a test opened the check set {path}: tests never read check-set questions")


def install() -> None:
    sys.addaudithook(_refuse_check_sets)
