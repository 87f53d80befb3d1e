"""A second corpus end to end (benchmark 28): a deterministic SciFact slice, its eval sets, and the nights' record.

The slice: every abstract judged relevant to any of SciFact's 300 test queries (283), plus a seeded sample
(random.Random(SEED).sample over the sorted ids of the others) up to TOTAL abstracts, written in the corpus file's
own order as a BEIR folder (`corpus.jsonl`), which `sourcegate init --format beir` and `run` ingest as is.

The should-answer questions are SciFact's test queries, each labelled with every abstract the benchmark's
annotators judged relevant (`expected`): nobody here wrote them. Sorted by query id, even positions go to the fit
set and odd ones to the check set. `sets` assembles each set from three parts, counted apart: those queries, the
half of the reviewed off-topic pool that `sourcegate init` put in that set's file, and the hand-reviewed borrowing
asks (benchmarks/second_corpus/borrowing-fit.jsonl and borrowing-check.jsonl).

    export SOURCEGATE_SHARED=/path/to/shared   # the folder holding datasets/scifact
    python -m benchmarks.second_corpus slice --out /tmp/sc                      # /tmp/sc/corpus/corpus.jsonl
    sourcegate init /tmp/sc/corpus --format beir --out /tmp/sc/cfg               # config + the pool's halves
    python -m benchmarks.second_corpus sets --init /tmp/sc/cfg                  # fills cfg/evals/{fit,check}.jsonl (+ -near-topic)
    sourcegate --config /tmp/sc/cfg/pipeline.yaml run --no-promote --run-id 20261205-200000
    python -m benchmarks.second_corpus record --runs /tmp/sc/cfg/artifacts/runs RUN_ID [RUN_ID ...] \\
        [--model /tmp/sc/cfg/models/in_domain] --out benchmarks/results/second_corpus_scifact.json
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from benchmarks._common import ROOT, SCIFACT, uptime

TOTAL = 1000  # abstracts in the slice: the judged ones and a seeded sample of the rest
SEED = 13
REVIEWED = ROOT / "benchmarks" / "second_corpus"  # the borrowing asks a person reviewed or wrote
# The pool's questions about health, medicine, nutrition or biology (human or animal), read off the pool's text: in a
# biomedical corpus's domain, so `near_topic` by config/evals/README.md's definitions (scored, not gated). Chosen
# after the first night had been scored (docs/benchmarks/28-second-corpus.md says so), by topic, not by score.
POOL_IN_DOMAIN = (
    "pool-o-028", "pool-o-029", "pool-o-030", "pool-o-031", "pool-o-032",
    "pool-o-033", "pool-o-050", "pool-o-051", "pool-o-061", "pool-o-072",
)  # fmt: skip


def judged_abstracts() -> dict[str, list[str]]:
    """Query id -> the abstracts SciFact's annotators judged relevant, in the qrels file's order."""
    qrels: dict[str, list[str]] = {}
    for line in (SCIFACT / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        query, doc, _ = line.split("\t")
        qrels.setdefault(query, []).append(doc)
    return qrels


def slice_ids(all_ids: list[str], judged: set[str], total: int, seed: int) -> set[str]:
    """The judged abstracts plus a seeded sample of the others, `total` in all."""
    others = sorted(set(all_ids) - judged)
    return judged | set(random.Random(seed).sample(others, max(0, total - len(judged))))


def answer_questions(qrels: dict[str, list[str]]) -> tuple[list[dict], list[dict]]:
    """SciFact's test queries as should-answer questions: (fit, check), alternating by sorted query id."""
    texts = {}
    for line in (SCIFACT / "queries.jsonl").read_text(encoding="utf-8").splitlines():
        q = json.loads(line)
        texts[q["_id"]] = q["text"]
    rows = [
        {"id": f"sf-{qid}", "question": texts[qid], "label": "answer", "expected": qrels[qid], "kind": "claim"}
        for qid in sorted(qrels, key=int)
    ]
    return rows[0::2], rows[1::2]


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def cmd_slice(args) -> None:
    out = Path(args.out)
    lines = (SCIFACT / "corpus.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    ids = [json.loads(line)["_id"] for line in lines]
    qrels = judged_abstracts()
    judged = {d for docs in qrels.values() for d in docs}
    keep = slice_ids(ids, judged, args.total, args.seed)
    (out / "corpus").mkdir(parents=True, exist_ok=True)
    (out / "corpus" / "corpus.jsonl").write_text("".join(x for x, i in zip(lines, ids) if i in keep), "utf-8")
    print(f"{len(keep)} abstracts ({len(judged)} judged, {len(keep) - len(judged)} sampled, seed {args.seed})")


def in_domain_as_near_topic(rows: list[dict]) -> list[dict]:
    """The pool's in-domain questions relabelled `near_topic`; every other row as it was."""
    return [{**r, "kind": "near_topic"} if r["id"] in POOL_IN_DOMAIN else r for r in rows]


def cmd_sets(args) -> None:
    evals = Path(args.init) / "evals"
    fit_q, check_q = answer_questions(judged_abstracts())
    counts = {}
    for name, questions in (("fit", fit_q), ("check", check_q)):
        pool = [r for r in _read(evals / f"{name}.jsonl") if r["id"].startswith("pool-")]  # what init placed
        borrowing = _read(REVIEWED / f"borrowing-{name}.jsonl")
        (evals / f"{name}.jsonl").write_text(_jsonl(questions + pool + borrowing), encoding="utf-8")
        relabelled = in_domain_as_near_topic(pool)
        (evals / f"{name}-near-topic.jsonl").write_text(_jsonl(questions + relabelled + borrowing), encoding="utf-8")
        near = sum(r["kind"] == "near_topic" for r in relabelled)
        counts[name] = {"benchmark_labels": len(questions), "pool": len(pool), "borrowing": len(borrowing)}
        counts[name]["pool_relabelled_near_topic"] = near
    print(json.dumps(counts))


CANDIDATES = ("rerank_top", "cosine_top", "answer_support", "bm25_top")


def declined_at_full_coverage(rows: list[dict], signal: str) -> dict:
    """Each set's declines by kind, at the threshold that keeps every fit should-answer question (the fit set's
    lowest should-answer score; a question at or above it is kept): what each candidate would do, picked or not."""
    fit = [r for r in rows if r["set"] == "calibration"]
    floor = min(r["signals"][signal] for r in fit if r["label"] == "answer")
    out: dict = {"threshold": floor}
    for name in ("calibration", "check"):
        for r in (r for r in rows if r["set"] == name):
            cell = out.setdefault(name, {}).setdefault(f"{r['label']}/{r['kind']}", {"n": 0, "below": 0})
            cell["n"] += 1
            cell["below"] += r["signals"][signal] < floor
    return out


def night_record(run: Path) -> dict:
    """What a night decided and why, from its gate.json and run.json."""
    gate = json.loads((run / "gate.json").read_text(encoding="utf-8"))
    info = json.loads((run / "run.json").read_text(encoding="utf-8"))
    rows = _read(run / "questions.jsonl")
    return {
        "run": run.name,
        "passed": gate["passed"],
        "gating_signal": gate.get("gating_signal"),
        "signal_choice": gate.get("signal_choice"),
        "checks": [{k: c.get(k) for k in ("name", "passed", "detail")} for c in gate["checks"]],
        "reasons": gate.get("reasons"),
        "answer_model_corpus": gate.get("answer_model_corpus"),
        "coverage": gate.get("coverage"),
        "check_scoring": gate.get("check_scoring"),
        "candidates_at_full_coverage": {s: declined_at_full_coverage(rows, s) for s in CANDIDATES},
        "timings_s": info.get("timings_s"),
        "counts": info.get("counts"),
    }


def cmd_record(args) -> None:
    runs = Path(args.runs)
    result = {
        "benchmark": "second_corpus_scifact",
        "slice": {"total": args.total, "seed": args.seed},
        "load": uptime(),
        "nights": [night_record(runs / r) for r in args.run_ids],
    }
    if args.model:  # the corpus-trained answer model: its recipe and its training log, as written
        model = Path(args.model)
        recipe = json.loads((model / "recipe.json").read_text(encoding="utf-8"))
        log = (model / "training.log").read_text(encoding="utf-8").splitlines()
        result["trained_model"] = {"command": recipe.get("command"), "synthetic": recipe.get("synthetic"), "log": log}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("slice")
    p.add_argument("--out", required=True), p.add_argument("--total", type=int, default=TOTAL)
    p.add_argument("--seed", type=int, default=SEED)
    p.set_defaults(func=cmd_slice)
    p = sub.add_parser("sets")
    p.add_argument("--init", required=True, help="the folder `sourcegate init --out` wrote")
    p.set_defaults(func=cmd_sets)
    p = sub.add_parser("record")
    p.add_argument("--runs", required=True)
    p.add_argument("run_ids", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--model", help="a model folder train-in-domain wrote: its recipe and log go in the record")
    p.add_argument("--total", type=int, default=TOTAL), p.add_argument("--seed", type=int, default=SEED)
    p.set_defaults(func=cmd_record)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
