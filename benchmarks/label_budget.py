"""docs/benchmarks/25-label-budget.md: the hand-written training questions of the label budget's rows.

    python -m benchmarks.label_budget draw --sizes 100 300 --seed 13 --out config/evals/budget

Each row of the table trains on the corpus's synthetic pairs plus the first N questions of one seeded shuffle of
the hand-written training sets (sets.yaml role `training`, the generated place asks left out), drawn in
proportion to their labels, so the 100 are among the 300 and each size keeps the sets' answer/decline mix.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from evals.evalset import load_evalset

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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("draw")
    d.add_argument("--sizes", type=int, nargs="+", required=True)
    d.add_argument("--seed", type=int, default=13)
    d.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    items = [q for path in HAND_WRITTEN for q in load_evalset(path)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for n in args.sizes:
        rows = draw(items, n, args.seed)
        (out / f"hand-{n}.jsonl").write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in rows))
        print(f"{out}/hand-{n}.jsonl: {len(rows)} of {len(items)} hand-written questions (seed {args.seed})")


if __name__ == "__main__":
    main()
