"""One verdict whatever the worker: the placement margin (sourcegate/evals/placement.py) and the decisive scores
held equal across two worker settings (docs/benchmarks/24-score-spread.md)."""

import json
import math
from pathlib import Path

import pytest

from sourcegate.evals.calibration import calibrate_signal
from sourcegate.evals.placement import below_by, cross_fitted, place
from sourcegate.pipelines import config

ROOT = Path(__file__).resolve().parents[1]
FIT_SET = ROOT / "config" / "evals" / "calibration.jsonl"
DECISIVE = ("u-a-053", "g-a-010", "g-a-029", "d-013", "g-o-006")  # the fit set's closest to the threshold
MARGIN = config.Calibration().margin_logit
# The spread a worker setting may move a decisive logit by: the measured largest, times the safety factor
# the margin was chosen with, is the margin; a score within this of another keeps its verdict.
TOLERANCE_LOGIT = MARGIN / 10


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


# --------------------------------------------------------------------------- the margin (pure)


def test_the_margin_moves_a_probability_threshold_down_on_the_logit_scale():
    answer, decline = [0.00092801446, 0.3], [0.0005203, 0.0002]
    assert place(answer, decline, "tightest") == 0.00092801446
    placed = place(answer, decline, "tightest", margin_logit=0.5)
    assert logit(placed) == pytest.approx(logit(0.00092801446) - 0.5)
    assert decline[0] < placed < answer[0]


def test_the_margin_moves_a_score_outside_0_1_on_its_own_scale():
    assert below_by(2.5, 0.25) == 2.25
    assert below_by(0.0, 0.25) == -0.25
    assert below_by(0.4, 0.0) == 0.4  # no margin: the score itself, to the last bit


def test_a_midpoint_inside_the_margin_is_pulled_down_to_it():
    answer, decline = [0.0011, 0.5], [0.001]
    mid = place(answer, decline, "logit_midpoint")
    assert logit(0.0011) - logit(mid) < 0.2  # the gap is narrow on the logit scale
    assert place(answer, decline, "logit_midpoint", margin_logit=0.2) == pytest.approx(below_by(0.0011, 0.2))
    wide = place([0.9], [0.001], "logit_midpoint", margin_logit=0.2)
    assert wide == place([0.9], [0.001], "logit_midpoint")  # a midpoint already further down stays


def test_a_negative_or_non_finite_margin_is_refused():
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="margin_logit"):
            place([0.5], [0.1], "tightest", margin_logit=bad)


def test_a_gap_narrower_than_the_margin_is_said_and_the_threshold_left_below_it():
    answer, decline = [0.00092801446] * 3, [0.00092] * 3
    result = calibrate_signal("answer_support", answer + decline, [True] * 3 + [False] * 3, margin_logit=0.5)
    assert result["has_gap"]
    assert result["recommended_threshold"] <= max(decline)  # the gate's threshold_in_gap then fails
    assert any("narrower than the margin" in w for w in result["warnings"])


def test_cross_fitted_folds_place_with_the_margin():
    scores = [0.01, 0.02, 0.03, 0.04, 0.05, 0.001, 0.002]
    labels = [True] * 5 + [False] * 2
    plain = cross_fitted(scores, labels, "tightest", k=5)
    kept = cross_fitted(scores, labels, "tightest", k=5, margin_logit=MARGIN)
    assert all(t < p for t, p in zip(kept["thresholds"], plain["thresholds"]))


def test_the_shipped_margin_is_positive_and_in_the_schema():
    assert MARGIN > 0
    assert "margin_logit" in config.json_schema()["$defs"]["Calibration"]["properties"]


# --------------------------------------------------------------------------- two worker settings


def _decisive_logits(retriever, answer_model, asks: dict[str, str], passages: int) -> dict[str, float]:
    """Each decisive question's answer-support logit (mean over members of each one's best) on its fused window."""
    from sourcegate.pipelines.retrieval.answerability import content_terms
    from sourcegate.pipelines.search.analyzer import STOPWORDS

    vectors = retriever.text_vectors([asks[q] for q in DECISIVE])
    out = {}
    for qid, vector in zip(DECISIVE, vectors):
        fused, _ = retriever.fuse(asks[qid], vector, content_terms(asks[qid], STOPWORDS))
        window = [c.text for c in fused[:passages]]
        bests = [max(logit for _, logit in m.score(asks[qid], window)) for m in answer_model.members]
        out[qid] = sum(bests) / len(bests)
    return out


def _with_threads(answer_model, threads: int) -> None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    for m in answer_model.members:
        m.session = ort.InferenceSession(m.model_of(m.folder), options, providers=["CPUExecutionProvider"])
        m._memo.clear()  # the memo would hand the first setting's logits to the second


@pytest.mark.models
def test_the_decisive_verdicts_are_the_same_with_one_thread_or_two(demo_index, embedder):
    """ORT intra-op threads 2 (shipped) and 1, torch threads as set and 1: each decisive question's
    answer-support logit moves by less than the tolerance and keeps its side of the shipped threshold
    and of the threshold the margin places."""
    import torch

    from sourcegate.pipelines.retrieval.answer_support import load_answer_model
    from sourcegate.pipelines.retrieval.retriever import Retriever

    cfg, _, searcher = demo_index
    shipped = config.load(ROOT / "config" / "pipeline.yaml")
    cfg = config.replace(cfg, {"answerability.answer_passages": shipped.answerability.answer_passages})
    answer_model = load_answer_model(ROOT / shipped.answerability.answer_model_path)
    asks = {r["id"]: r["question"] for r in map(json.loads, FIT_SET.read_text().splitlines()) if r["id"] in DECISIVE}
    assert sorted(asks) == sorted(DECISIVE)
    labels = {r["id"]: r["label"] for r in map(json.loads, FIT_SET.read_text().splitlines()) if r["id"] in DECISIVE}

    def scored(ort_threads: int, torch_threads: int) -> dict[str, float]:
        before = torch.get_num_threads()
        torch.set_num_threads(torch_threads)
        try:
            _with_threads(answer_model, ort_threads)
            retriever = Retriever.from_config(searcher, embedder, None, cfg, answer_scorer=answer_model)
            return _decisive_logits(retriever, answer_model, asks, cfg.answerability.answer_passages)
        finally:
            torch.set_num_threads(before)

    two, one = scored(2, 2), scored(1, 1)
    for qid in DECISIVE:
        assert abs(two[qid] - one[qid]) < TOLERANCE_LOGIT, (qid, two[qid], one[qid])

    answer = [two[q] for q in DECISIVE if labels[q] == "answer"]
    decline = [two[q] for q in DECISIVE if labels[q] != "answer"]
    placed = logit(place([1 / (1 + math.exp(-x)) for x in answer], [], "tightest", MARGIN))
    for threshold in (logit(shipped.answer.adjacent), placed):
        assert {q: two[q] >= threshold for q in DECISIVE} == {q: one[q] >= threshold for q in DECISIVE}
    assert all(x - placed >= MARGIN - 1e-9 for x in answer)  # every kept score is a margin clear of it
    assert max(decline) < placed  # on this index the margin still leaves the declines below
