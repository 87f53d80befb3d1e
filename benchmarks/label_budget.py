"""docs/benchmarks/25-label-budget.md: the label budget's rows: their hand-written questions, and one scoring of all.

    python -m benchmarks.label_budget draw --sizes 100 300 --seed 13 --out config/evals/budget
    python -m benchmarks.label_budget score --index RUN_DIR --check config/evals/riders-final-5.jsonl --out DIR \
        --design "cosine_top=cosine_top" --design "synthetic=answer_support@MODEL" ...

`draw`: each row of the table trains on the corpus's synthetic pairs plus the first N questions of one seeded
shuffle of the hand-written training sets (sets.yaml role `training`, the generated place asks left out), drawn in
proportion to their labels, so the 100 are among the 300 and each size keeps the sets' answer/decline mix.

`score`: every frozen design (a gating signal, and for `answer_support` the model folder it reads) is judged by one
`calibrate` each, in one command: the signal is the only candidate of the `auto` rule, so its threshold is placed
on the fit set by `calibration.placement` exactly as a night places it, and the check set is judged at that
threshold and logged (sourcegate/evals/check_log.py) like any check scoring. The fit figures are at the tightest threshold.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

from benchmarks._common import RESULTS, finished, machine
from sourcegate.evals.evalset import load_evalset
from sourcegate.evals.sweep import roc_auc

HAND_WRITTEN = (  # the training sets a person wrote (place-asks-train.jsonl was generated from templates)
    "config/evals/riders.jsonl",
    "config/evals/riders-final.jsonl",
    "config/evals/riders-final-3.jsonl",
    "config/evals/riders-train.jsonl",
    "config/evals/riders-train-2.jsonl",
)


def draw(items: list[dict], n: int, seed: int) -> list[dict]:
    """The first `n` of one seeded shuffle per label, in proportion to the labels (largest remainder), in
    file order: nested across sizes for one seed."""
    by_label: dict[str, list[dict]] = {}
    for q in items:
        by_label.setdefault(q["label"], []).append(q)
    rng = random.Random(seed)
    shuffled = {label: rng.sample(qs, len(qs)) for label, qs in sorted(by_label.items())}
    exact = {label: n * len(qs) / len(items) for label, qs in shuffled.items()}
    take = {label: int(x) for label, x in exact.items()}
    for label in sorted(exact, key=lambda k: take[k] - exact[k])[: n - sum(take.values())]:
        take[label] += 1
    chosen = {id(q) for label, qs in shuffled.items() for q in qs[: take[label]]}
    return [q for q in items if id(q) in chosen]


def fit_figures(rows: list[dict], signal: str) -> dict:
    """Answerable vs off-topic on the fit set at the tightest threshold (the lowest should-answer score)."""
    score = lambda r: r["signals"].get(signal)
    answer = [score(r) for r in rows if r["label"] == "answer" and score(r) is not None]
    off = [score(r) for r in rows if r.get("kind") == "off_topic" and score(r) is not None]
    near = [score(r) for r in rows if r.get("kind") == "near_topic" and score(r) is not None]
    lowest = min(answer)
    auc = roc_auc(np.asarray(answer), np.asarray(off))
    return {
        "gap_off_topic": round(lowest - max(off), 6),
        "off_topic_declined_at_full_coverage": f"{sum(o < lowest for o in off)}/{len(off)}",
        "near_topic_declined_at_full_coverage": f"{sum(o < lowest for o in near)}/{len(near)}",
        "auc_off_topic": round(auc, 4),
    }


def check_figures(check: dict) -> dict:
    """The check set at the threshold placed on the fit set: kept should-answer, declined by kind."""
    threshold, signal = check["threshold"], check["signal"]
    counts: dict[str, list[int]] = {}
    for q in check["questions"]:
        group = "answer" if q["label"] == "answer" else q.get("kind") or "decline"
        value = q["signals"].get(signal)
        kept = value is not None and value >= threshold
        hit = kept if group == "answer" else not kept
        counts.setdefault(group, [0, 0])
        counts[group][0] += hit
        counts[group][1] += 1
    names = {"answer": "should_answer_kept", "off_topic": "off_topic_declined", "near_topic": "near_topic_declined"}
    return {"threshold": threshold} | {
        names.get(g, f"{g}_declined"): f"{a}/{n}" for g, (a, n) in sorted(counts.items())
    }


def onnx_hashes(model: str) -> dict[str, str]:
    """Every model.onnx of a model folder (an ensemble has one per member), by path: the design as frozen."""
    from sourcegate.pipelines.versions.manifest import sha256_file

    folder = Path(model) if model else None
    return {str(f.relative_to(folder)): sha256_file(f) for f in sorted(folder.rglob("model.onnx"))} if folder else {}


def score(args) -> int:
    from sourcegate.api import cli as sourcegate

    rows = []
    for spec in args.design:
        name, _, rest = spec.partition("=")
        signal, _, model = rest.partition("@")
        out = Path(args.out) / name
        settings = ["--set", "answer.signal=auto", "--set", f"answer.candidates=[{signal}]"]
        settings += ["--set", f"evals.check_set={args.check}", *[w for o in args.set for w in ("--set", o)]]
        if model:
            settings += ["--set", f"answerability.answer_model_path={model}"]
        command = [*settings, "calibrate", "--index", args.index, "--questions", args.fit, "--out", str(out)]
        exit_code = sourcegate([*command, "--quiet"])
        calibration = json.loads((out / "calibration.json").read_text(encoding="utf-8"))
        gate = json.loads((out / "gate.json").read_text(encoding="utf-8"))
        rows.append(
            {
                "design": name,
                "signal": signal,
                "model": model or None,
                "command": "sourcegate " + " ".join(command),
                "exit_code": exit_code,
                "model_onnx_sha256": onnx_hashes(model),
                "fit": fit_figures(calibration["questions"], signal),
                "fit_signal_choice": calibration["signal_choice"]["candidates"][0],
                "check": check_figures(calibration["check"]),
                "gate_passed": gate["passed"],
            }
        )
        print(json.dumps(rows[-1]))
    result = {"benchmark": "label_budget", "machine": machine(), "fit": args.fit, "check": args.check}
    result |= {"index": args.index, "designs_scored_on_the_check_set": len(rows), "rows": rows}
    return finished(result, args.result)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("draw")
    d.add_argument("--sizes", type=int, nargs="+", required=True)
    d.add_argument("--seed", type=int, default=13)
    d.add_argument("--out", required=True)
    s = sub.add_parser("score")
    s.add_argument("--index", required=True, help="a run folder: the version every design is scored on")
    s.add_argument("--fit", default="config/evals/calibration.jsonl")
    s.add_argument("--check", required=True, help="the never-scored check set all designs are judged on, once")
    s.add_argument("--design", action="append", required=True, help="NAME=SIGNAL or NAME=answer_support@MODEL")
    s.add_argument("--out", required=True, help="one calibrate folder per design")
    s.add_argument("--result", default=str(RESULTS / "label_budget.json"))
    s.add_argument("--set", action="append", default=[], help="a config override for every design (KEY=VALUE)")
    args = ap.parse_args(argv)
    if args.cmd == "score":
        raise SystemExit(score(args))
    items = [q for path in HAND_WRITTEN for q in load_evalset(path)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for n in args.sizes:
        rows = draw(items, n, args.seed)
        (out / f"hand-{n}.jsonl").write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in rows))
        print(f"{out}/hand-{n}.jsonl: {len(rows)} of {len(items)} hand-written questions (seed {args.seed})")


if __name__ == "__main__":
    main()
