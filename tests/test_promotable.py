"""The passing fixture's eval sets are the samples tests/promotable.py says they are."""

import json

from tests.promotable import PROMOTABLE, ROOT, WHOLE_FIT, sample


def read(path) -> list[dict]:
    return [json.loads(line) for line in (ROOT / path).read_text().splitlines()]


def test_the_fixture_sets_are_the_stated_samples_of_the_full_sets():
    fit, precision = read(PROMOTABLE["evals.calibration_set"]), read(PROMOTABLE["evals.precision_set"])
    assert fit == sample(read(WHOLE_FIT), answer_every=4, decline_every=1)
    assert precision == sample(read("config/evals/precision.jsonl"), answer_every=2, decline_every=1)
    labels = [q["label"] for q in fit]
    assert (len(fit), labels.count("answer"), len(precision)) == (63, 29, 30)
    assert labels.count("decline") == sum(q["kind"] == "off_topic" for q in fit) + 20  # every decline kept
    assert min(labels.count("answer"), labels.count("decline")) >= PROMOTABLE["calibration.min_per_label"]


def test_sample_keeps_file_order_and_every_nth_of_each_label():
    rows = [{"id": str(i), "label": "answer" if i % 3 else "decline"} for i in range(12)]
    assert [r["id"] for r in sample(rows, answer_every=2, decline_every=2)] == ["0", "1", "4", "6", "7", "10"]
