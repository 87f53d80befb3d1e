"""A deployment whose corpus outgrew its answer model, in a tmp folder, for the retraining tests
(tests/test_retrain_step.py without Airflow, tests/test_dag_runs.py through the recalibrate DAG).

Everything a retrain could change lives in the tmp folder: its config file, eval sets (copies of the tests' promotable
fit and check sets; the next check set two synthetic questions), roles file, baseline and check-move log. The model is
trained from three should-answer and three off-topic rider questions for one epoch (as in
tests/test_in_domain_training.py) against the live version; "it learned less of today's corpus" is its
learned_corpus.json with a fifth of the sections left out, as `record-corpus` writes it for a model trained on an
older version.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from sourcegate.evals.evalset import load_evalset
from tests.promotable import PROMOTABLE, promotable_sections

ROOT = Path(__file__).resolve().parents[1]
RIDERS = "config/evals/riders.jsonl"
FRESH = [
    {"id": "n-a-1", "question": "How do I get a day pass?", "label": "answer", "kind": "single",
     "expected": ["fares-and-passes#day-passes"]},
    {"id": "n-o-1", "question": "What is the capital of Peru?", "label": "decline", "kind": "off_topic",
     "expected": []},
]  # fmt: skip


def lines(items: list[dict]) -> str:
    return "".join(json.dumps(q) + "\n" for q in items)


def tiny_training_set() -> list[dict]:
    riders = load_evalset(RIDERS)
    return [q for q in riders if q["label"] == "answer"][:3] + [q for q in riders if q["kind"] == "off_topic"][:3]


def write_config(path: Path, sections: dict) -> Path:
    """The project's config with the promotable sections and `sections` merged in, key by key."""

    def merge(base: dict, extra: dict) -> dict:
        for key, value in extra.items():
            base[key] = merge(base.get(key) or {}, value) if isinstance(value, dict) else value
        return base

    body = yaml.safe_load((ROOT / "config" / "pipeline.yaml").read_text())
    merge(body, promotable_sections())
    merge(body, sections)
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def outgrown(root: Path, artifacts: Path, version: str) -> dict:
    """The tmp deployment over `artifacts` (whose run `version` is live): its config file, and a tiny model that
    learned four fifths of the live version's sections, named in it with `retrain_below_share` 0.95."""
    from sourcegate.pipelines.app.cli import main
    from sourcegate.pipelines.retrieval import learned_corpus

    evals = root / "evals"
    evals.mkdir(parents=True)
    for name, key in (("fit.jsonl", "evals.calibration_set"), ("check.jsonl", "evals.check_set")):
        shutil.copy(ROOT / PROMOTABLE[key], evals / name)
    (evals / "next.jsonl").write_text(lines(FRESH))
    roles = [("fit.jsonl", "fit"), ("check.jsonl", "check"), ("next.jsonl", "next-check")]
    (evals / "sets.yaml").write_text(
        "sets:\n" + "".join(f"  - file: {f}\n    role: {r}\n    provenance: test copy\n" for f, r in roles)
    )
    shutil.copy(ROOT / PROMOTABLE["evals.baseline"], root / "baseline.json")
    (root / "train.jsonl").write_text(lines(tiny_training_set()))
    model = root / "models" / "tiny"
    sections = {
        "artifacts": str(artifacts),
        "evals": {
            "calibration_set": str(evals / "fit.jsonl"),
            "check_set": str(evals / "check.jsonl"),
            "check_moves": str(root / "check_moves.jsonl"),
            "baseline": str(root / "baseline.json"),
        },
        "answerability": {"combiner": None, "retrain_below_share": 0.95},
    }
    config_file = write_config(root / "pipeline.yaml", sections)  # trained under the generic answer model
    args = ["train-in-domain", "--index", str(artifacts / "runs" / version), "--train", str(root / "train.jsonl")]
    assert main(["--config", str(config_file), *args, "--out", str(model), "--epochs", "1"]) == 0
    sections["answerability"]["answer_model_path"] = str(model)  # then named in the config, as a deployment does
    write_config(config_file, sections)
    learned = learned_corpus.read(model)
    kept = {k: h for i, (k, h) in enumerate(sorted(learned["sections"].items())) if i % 5}
    learned_corpus.write(model, {**learned, "sections": kept, "note": "a fifth of the sections left out by the test"})
    return {"root": root, "config_file": config_file, "version": version, "model": model}
