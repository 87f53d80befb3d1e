"""A demo night whose gate passes, for the tests of what follows a pass.

Promotion, rollback, retention, reuse, the DAG's promote task and the fault suite need versions that passed, at a
test's cost. The shipped decision passes on the demo (`answer_support` of one in-domain model,
docs/decisions/0009-one-answer-model.md), but a night of it on the full sets scores several times the
answer-support pairs of a test night; before it the shipped verdict was FAILED, honestly (docs/calibration.md).
So the test nights run the demo with a sample of the fit set the gate passed on before #28
(tests/data/evals/calibration-pre28.jsonl: config/evals/calibration.jsonl without a-o-101..110, 14 off-topic, hence
min_per_label 14) and, as its check set, 14 of those questions under new ids (tests/data/evals/check-pre28.jsonl): a
gate without a check set fails ("coverage is unchecked"). They keep the decision their own baseline
(tests/data/baselines/promotable.json) was accepted with (`rerank_top` >= 0.14, whose per-question declines the gate
pairs) and the SQuAD-trained answer-support model reading the top 3. This claims nothing about quality: it is a fixture of a passing gate, not a check.

The sample keeps a night's evaluation to about a third of the full sets' (the cross-encoder, one pair per run,
is most of a first night): promotable-fit.jsonl is every should-decline question of calibration-pre28.jsonl and
every fourth should-answer one (63 of 149), promotable-precision.jsonl every second question of
config/evals/precision.jsonl (30 of 60); the accepted baseline pairs them by id and lists the rest as missing.
`sample` is that rule, and tests/test_promotable.py holds the files to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sourcegate.pipelines import config

ROOT = Path(__file__).resolve().parents[1]
WHOLE_FIT = (
    "tests/data/evals/calibration-pre28.jsonl"  # the fit set the gate passed on before #28; the nights sample it
)
PROMOTABLE = {
    "evals.calibration_set": "tests/data/evals/promotable-fit.jsonl",
    "evals.check_set": "tests/data/evals/check-pre28.jsonl",
    "evals.precision_set": "tests/data/evals/promotable-precision.jsonl",
    "calibration.min_per_label": 14,
    # the decision of the baseline below, accepted before #28 (it was config/baselines/precision.json until
    # 2026-12-06, when `accept` wrote the shipped one-member decision's there): these nights are compared with it
    "answer.signal": "rerank_top",
    "answer.adjacent": 0.14,
    "answer.strong_signal": None,
    "evals.baseline": "tests/data/baselines/promotable.json",
    # the answer-support model those nights were measured with (the SQuAD-trained one, its top 3): the shipped
    # in-domain model reads 5 passages, and gates nothing here
    "answerability.answer_model_path": None,
    "answerability.answer_passages": 3,
}


def sample(rows: list[dict], answer_every: int, decline_every: int) -> list[dict]:
    """Every `answer_every`-th should-answer and every `decline_every`-th should-decline question, in file order."""
    by_label = {label: [r for r in rows if r["label"] == label] for label in ("answer", "decline")}
    keep = {r["id"] for r in by_label["answer"][::answer_every]} | {
        r["id"] for r in by_label["decline"][::decline_every]
    }
    return [r for r in rows if r["id"] in keep]


def promotable_config(overrides: Mapping[str, Any] | None = None) -> config.PipelineConfig:
    """The shipped config with PROMOTABLE and `overrides` (dotted keys), through the loader."""
    return config.load(ROOT / "config" / "pipeline.yaml", {**PROMOTABLE, **(overrides or {})})


def promotable_args() -> list[str]:
    """The same as `--set` arguments of the CLI."""
    return [a for key, value in PROMOTABLE.items() for a in ("--set", f"{key}={'null' if value is None else value}")]


def promotable_sections() -> dict:
    """The same as nested config sections (merged into a config file's YAML body)."""
    out: dict = {}
    for dotted, value in PROMOTABLE.items():
        *parents, leaf = dotted.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out
