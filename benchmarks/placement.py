"""docs/benchmarks/19-placement.md: which threshold placement keeps unseen should-answer questions (issue #28).

Each rule (sourcegate/evals/placement.py: tightest, linear midpoint, logit midpoint of the gap) is placed
on data and judged on data it was not placed on, never on the check set:
- cross-fitted on each dataset: the threshold placed without a fold, kept/declined counted on
  that fold (deterministic folds, sourcegate/evals/placement.cross_fitted);
- demo -> BEIR: placed on the demo's fit set, applied to SciFact's and NFCorpus's queries.

Two stages:
  python -m benchmarks.placement scores --out /tmp/coverage/beir   # index + score each BEIR set
  python -m benchmarks.placement table --demo RUN/calibration.json [MORE.json ...] --out /tmp/coverage/beir \
      [--exclude a-o-] [--result placement-fit14.json]   # drop demo fit questions by id prefix; result file name

`scores` indexes each dataset like `sourcegate beir` (cached under --out) and scores its test
queries as should-answer and the demo fit set's off-topic questions as should-decline
(calibration.json per dataset). `table` prints the Markdown table of docs/benchmarks/19-placement.md and
writes benchmarks/results/placement.json (or --result).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks._common import RESULTS, SCIFACT
from sourcegate.artifact_io import read_json, write_json
from sourcegate.evals.placement import RULES, cross_fitted, place

DATASETS = {"scifact": SCIFACT, "nfcorpus": SCIFACT.parent / "nfcorpus"}
FIT_SET = Path("config/evals/calibration.jsonl")
GATED_KINDS = ("off_topic",)


def off_topic_file(fit_set: Path) -> Path:
    """The fit set's off-topic questions (the gated decline kind) as a file of their own."""
    rows = [line for line in fit_set.read_text(encoding="utf-8").splitlines() if '"off_topic"' in line]
    out = Path(tempfile.mkdtemp()) / "off_topic.jsonl"
    out.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return out


def dataset_retriever(cfg, dataset: Path, folder: Path):
    """The shipped config's retriever over a BEIR dataset, indexed like `sourcegate beir` (cached under `folder`)."""
    from sourcegate import api as factories
    from sourcegate.api import index_dataset

    folder.mkdir(parents=True, exist_ok=True)
    bcfg, version = index_dataset(cfg, dataset, folder, progress=True)
    return factories.retriever_for(cfg, factories.open_store(bcfg).open(version))[0]


def score_datasets(out: Path) -> None:
    from sourcegate.api import calibrate_beir, load_queries
    from sourcegate.pipelines.config import load

    cfg = load("config/pipeline.yaml")
    decline = off_topic_file(FIT_SET)
    for name, dataset in DATASETS.items():
        folder = out / name
        retriever = dataset_retriever(cfg, dataset, folder)
        queries, _ = load_queries(dataset)
        print(name, calibrate_beir(cfg, retriever, queries, str(decline), folder), flush=True)


def gated_rows(calibration: dict, signal: str) -> list[dict]:
    """The questions the gap holds, scored on `signal`: should-answer and the gated decline kinds."""
    return [
        q
        for q in calibration["questions"]
        if q["signals"].get(signal) is not None and (q["label"] == "answer" or q.get("kind") in GATED_KINDS)
    ]


def gated_scores(calibration: dict, signal: str) -> tuple[list[float], list[bool]]:
    """(scores, is_answer) of the questions the gap holds: should-answer and the gated decline kinds."""
    rows = gated_rows(calibration, signal)
    return [q["signals"][signal] for q in rows], [q["label"] == "answer" for q in rows]


def transfer(threshold: float | None, scores: list[float], is_answer: list[bool], ids: list[str] | None = None) -> dict:
    """What a threshold placed elsewhere keeps and declines here (with `ids`: the should-decline it answers)."""
    answer = [s for s, a in zip(scores, is_answer) if a]
    decline = [s for s, a in zip(scores, is_answer) if not a]
    out = {
        "kept": sum(s >= threshold for s in answer),
        "n_answer": len(answer),
        "declined": sum(s < threshold for s in decline),
        "n_decline": len(decline),
    }
    if ids is not None:
        out["not_declined"] = {i: s for i, s, a in zip(ids, scores, is_answer) if not a and s >= threshold}
    return out


def demo_calibration(calibrations: list[Path], exclude: tuple[str, ...] = ()) -> dict:
    """The demo fit set, merged from calibration.json files (ids unique across them), without the
    questions whose id starts with one of `exclude` (e.g. a-o-: the fit set before offtopic-extra)."""
    merged: dict[str, dict] = {}
    for path in calibrations:
        merged.update({q["id"]: q for q in read_json(path)["questions"] if not q["id"].startswith(exclude)})
    return {"questions": list(merged.values())}


def demo_scores(calibrations: list[Path], signal: str, exclude: tuple[str, ...] = ()) -> tuple[list[float], list[bool]]:
    """The demo fit set's gated scores (see demo_calibration)."""
    return gated_scores(demo_calibration(calibrations, exclude), signal)


def table(demo: list[Path], out: Path, signal: str, folds: int, exclude: tuple[str, ...] = ()) -> dict:
    """Every rule cross-fitted on each dataset, and placed on the demo and applied to each BEIR set.
    A BEIR set without scores under `out` is listed in `not_measured`, never filled in."""
    scored = {"demo (fit set)": demo_scores(demo, signal, exclude)}
    present = [name for name in DATASETS if (out / name / "calibration.json").exists()]
    beir_rows = {name: gated_rows(read_json(out / name / "calibration.json"), signal) for name in present}
    scored.update({name: gated_scores({"questions": rows}, signal) for name, rows in beir_rows.items()})
    fit_scores, fit_answer = scored["demo (fit set)"]
    answer = [s for s, a in zip(fit_scores, fit_answer) if a]
    decline = [s for s, a in zip(fit_scores, fit_answer) if not a]
    result = {
        "signal": signal,
        "folds": folds,
        "demo": [str(p) for p in demo],
        "demo_excluded_id_prefixes": list(exclude),
        "beir": {name: str(out / name / "calibration.json") for name in present},
        "not_measured": sorted(set(DATASETS) - set(present)),
        "rules": {},
    }
    for rule in RULES:
        row = {"cross_fitted": {name: cross_fitted(s, a, rule, folds) for name, (s, a) in scored.items()}}
        row["demo threshold"] = place(answer, decline, rule)
        row["transfer"] = {
            name: transfer(row["demo threshold"], *scored[name], ids=[q["id"] for q in beir_rows[name]])
            for name in present
        }
        result["rules"][rule] = row
    return result


def _cell(r: dict) -> str:
    cell = f"{r['kept']}/{r['n_answer']} / {r['declined']}/{r['n_decline']}"
    if r.get("not_declined"):
        cell += (
            " (" + ", ".join(f"{i} {s:.3g}" for i, s in sorted(r["not_declined"].items(), key=lambda x: -x[1])) + ")"
        )
    return cell


def markdown(result: dict) -> str:
    first = next(iter(result["rules"].values()))
    names, beir = list(first["cross_fitted"]), list(first["transfer"])
    head = "| rule | " + " | ".join(f"{n}: kept / declined (cross-fitted)" for n in names)
    head += " | demo threshold | " + "".join(f"{n}: kept / declined at it | " for n in beir)
    lines = [head.rstrip(" |") + " |", "|" + "---|" * (2 + len(names) + len(beir))]
    for rule, row in result["rules"].items():
        cells = [_cell(row["cross_fitted"][n]) for n in names] + [f"{row['demo threshold']:.4g}"]
        cells += [_cell(row["transfer"][n]) for n in beir]
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    if result["not_measured"]:
        lines.append(f"\nnot measured: {', '.join(result['not_measured'])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=["scores", "table"])
    parser.add_argument("--out", type=Path, required=True, help="the BEIR caches and per-dataset calibration.json")
    parser.add_argument("--demo", type=Path, nargs="+", help="table: calibration.json files of the demo fit set")
    parser.add_argument("--signal", default="rerank_top")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument(
        "--exclude", nargs="*", default=[], help="table: drop demo questions whose id starts with these (e.g. a-o-)"
    )
    parser.add_argument("--result", default="placement.json", help="table: file name under benchmarks/results/")
    args = parser.parse_args(argv)
    if args.stage == "scores":
        score_datasets(args.out)
        return 0
    if not args.demo:
        parser.error("table needs --demo")
    result = table(args.demo, args.out, args.signal, args.folds, tuple(args.exclude))
    write_json(result, RESULTS / args.result)
    print(markdown(result))
    print(json.dumps({r: row["demo threshold"] for r, row in result["rules"].items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
