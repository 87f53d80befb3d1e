"""docs/benchmarks/30-answer-window.md: the answer model's window trimmed to what changes a decision.

    python -m benchmarks.answer_window fit --index RUN_DIR --windows 10 5 3 --out DIR
    python -m benchmarks.answer_window check --index RUN_DIR --windows 10 5 --out DIR

Each window is one `calibrate` over the fit set with the shipped answer model read over the fused top W passages,
the gating signal's threshold placed on the fit set as a night places it (`answer.signal: auto` with
`answer_support` its only candidate). `check` adds the configured check set, judged at that threshold and logged
like any check scoring. Every window's decisions are compared with the first window's, question by question.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks._common import RESULTS, finished, machine
from benchmarks.label_budget import check_figures, fit_figures

SIGNAL = "answer_support"


def calibrate(index: str, window: int, out: Path, check: bool) -> dict:
    """One `calibrate` at window `window`; its calibration.json."""
    from sourcegate.api import cli as sourcegate

    settings = ["--set", "answer.signal=auto", "--set", f"answer.candidates=[{SIGNAL}]"]
    settings += ["--set", f"answerability.answer_passages={window}"]
    if not check:
        settings += ["--set", "evals.check_set=null"]
    command = [*settings, "calibrate", "--index", index, "--questions", "config/evals/calibration.jsonl"]
    sourcegate([*command, "--out", str(out), "--quiet"])
    return json.loads((out / "calibration.json").read_text(encoding="utf-8")) | {"command": command}


def decisions(rows: list[dict], threshold: float) -> dict[str, dict]:
    """Per question: its label, kind, score and whether the threshold answers it (a missing score declines)."""
    out = {}
    for r in rows:
        score = r["signals"].get(SIGNAL)
        answered = score is not None and score >= threshold
        out[r["id"]] = {"label": r["label"], "kind": r.get("kind"), "score": score, "answered": answered}
    return out


def differences(base: dict[str, dict], other: dict[str, dict]) -> list[dict]:
    """The questions whose decision differs between two windows, with both scores."""
    return [
        {
            "id": q,
            "label": b["label"],
            "kind": b["kind"],
            "score_before": b["score"],
            "score_after": other[q]["score"],
            "answered_before": b["answered"],
            "answered_after": other[q]["answered"],
        }
        for q, b in base.items()
        if q in other and other[q]["answered"] != b["answered"]
    ]


def gated(diff: list[dict]) -> list[dict]:
    """The differences the gate holds: should-answer and off-topic questions (near-topic ones are reported)."""
    return [d for d in diff if d["label"] == "answer" or d["kind"] == "off_topic"]


def run(args) -> int:
    rows, base = [], None
    for window in args.windows:
        cal = calibrate(args.index, window, Path(args.out) / f"w{window}", args.cmd == "check")
        threshold = cal["signal_choice"]["threshold"]
        row = {"window": window, "command": "sourcegate " + " ".join(cal["command"]), "threshold": threshold}
        row["fit"] = fit_figures(cal["questions"], SIGNAL)
        sets = {"fit": decisions(cal["questions"], threshold)}
        if args.cmd == "check":
            row["check"] = check_figures(cal["check"])
            sets["check"] = decisions(cal["check"]["questions"], threshold)
        base = base or sets
        for name, found in sets.items():
            diff = differences(base[name], found)
            row[f"{name}_differences"] = diff
            row[f"{name}_gated_differences"] = len(gated(diff))
        rows.append(row)
        print(
            json.dumps(
                {k: v for k, v in row.items() if not k.endswith("_differences")}
                | {k: v for k, v in row.items() if k.endswith("gated_differences")}
            )
        )
    result = {"benchmark": f"answer_window_{args.cmd}", "machine": machine(), "index": args.index, "rows": rows}
    return finished(result, args.result or RESULTS / f"answer_window_{args.cmd}.json")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=["fit", "check"])
    ap.add_argument("--index", required=True, help="a run folder: the version every window is scored on")
    ap.add_argument("--windows", type=int, nargs="+", required=True, help="the first is the one compared against")
    ap.add_argument("--out", required=True, help="one calibrate folder per window")
    ap.add_argument("--result", default=None)
    raise SystemExit(run(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
