"""Every scoring of a check set, logged; a check set scored under more than one design promises less.

A check set's exact bound holds for one look: the design (signal, threshold, models, window) it judged was frozen
before its questions were scored. Scored again under a second design, the better of two looks is kept, and the bound
must pay for the choice. The log (`check_scorings.jsonl` in the artifacts folder) holds one line per scoring: the run,
the check set's content hash, the design's hash and the result; the gate counts the distinct designs that scored this
check set's content (m) and states the check figure at confidence 1 - (1 - c) / m (Bonferroni), naming m.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sourcegate.evals.placement import exact_lower_bound

LOG = "check_scorings.jsonl"


def design_hash(design: Mapping[str, Any]) -> str:
    """The hash of what a check set judges: the decision and every model behind its scores (not the code version:
    a refactor that changes no score is not a new design; a changed score shows in the fingerprints or the result)."""
    return "sha256:" + hashlib.sha256(json.dumps(design, sort_keys=True, default=str).encode()).hexdigest()


def read(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def designs_scored(log: Sequence[Mapping], check_sha256: str, design: str, keys: Sequence[str] = ()) -> list[str]:
    """The distinct designs that scored this check content, this one included, in first-scored order.

    By question where the rows record their `question_keys` (evalset.question_key): a set reordered, reformatted
    or grown by a few questions is not a fresh one. Each of its questions counts the designs that saw it, and the
    set pays for the most any of its questions has seen. Rows without keys count by the file's hash."""
    wanted = set(keys)
    by_key: dict[str, list[str]] = {k: [] for k in wanted}
    for r in log:
        if r.get("question_keys"):
            seen = wanted & set(r["question_keys"])
        else:
            seen = wanted if r.get("check_sha256") == check_sha256 else set()
        for k in seen:
            by_key[k].append(r["design_sha256"])
    if not wanted:  # no keys known: by the file's hash alone
        by_key = {"": [r["design_sha256"] for r in log if r.get("check_sha256") == check_sha256]}
    return max((list(dict.fromkeys([*seen, design])) for seen in by_key.values()), key=len)


def append(path: Path, record: Mapping[str, Any]) -> bool:
    """Log one scoring once (a rerun of the same run and design is not a new look); True if it was new."""
    log = read(path)
    if any(r.get("run") == record["run"] and r.get("design_sha256") == record["design_sha256"] for r in log):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(dict(record), sort_keys=True) + "\n")
    return True


def account(coverage: Mapping[str, Any], designs: int) -> dict[str, Any]:
    """The coverage figures with the check figure at Bonferroni confidence over `designs` looks (as is for one)."""
    figures = [dict(f) for f in coverage.get("figures") or ()]
    for f in figures:
        if f["name"] == "check" and f.get("n"):
            confidence = 1 - (1 - f["confidence"]) / designs
            f |= {"value": exact_lower_bound(f["kept"], f["n"], confidence), "designs_scored": designs}
            if designs > 1:
                f["bound"] += (
                    f"; this check set was scored under {designs} designs: confidence {confidence:.4f} "
                    f"(Bonferroni over {designs} looks)"
                )
    known = [f for f in figures if f["value"] is not None]
    return {**coverage, "figures": figures, "headline": min(known, key=lambda f: f["value"]) if known else None}
