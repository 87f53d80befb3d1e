"""The reranker is a preference, never a point of failure: one test per failure case."""

import logging
import math
import time

import pytest

from sourcegate.pipelines.retrieval.rerank import load_scorer, safe_rerank

PASSAGES = ["croup is a viral infection of the airway", "the French revolution began in 1789", "bus fares"]


class Fake:
    model_id = "fake"

    def __init__(self, result=None, error=None, delay=0.0):
        self.result, self.error, self.delay = result, error, delay

    def score(self, query, passages):
        time.sleep(self.delay)
        if self.error:
            raise self.error
        return self.result


@pytest.mark.parametrize(
    "scorer, why",
    [
        (None, "not configured"),
        (Fake(error=RuntimeError("boom")), "inference failed"),
        (Fake(delay=0.5, result=[(0, 1.0), (1, 0.0), (2, 0.0)]), "timed out"),
        (Fake(result=[(0, float("nan")), (1, 0.0), (2, 0.0)]), "non-finite score"),
        (Fake(result=[(0, float("inf")), (1, 0.0), (2, 0.0)]), "non-finite score"),
        (Fake(result=[(0, "high"), (1, 0.0), (2, 0.0)]), "non-numeric score"),
        (Fake(result=[(0, None), (1, 0.0), (2, 0.0)]), "non-numeric score"),
        (Fake(result=[(0, 1.0), (1, 0.0)]), "2 scores for 3 candidates"),
        (Fake(result=[(0, 1.0), (0, 0.0), (2, 0.0)]), "duplicate index 0"),
        (Fake(result=[(0, 1.0), (1, 0.0), (3, 0.0)]), "out-of-range index 3"),
        (Fake(result=[(0, 1.0), (1, 0.0), (-1, 0.0)]), "out-of-range index -1"),
        (Fake(result=42), "result is not a list"),
    ],
)
def test_every_failure_returns_none_with_a_log_line(scorer, why, caplog):
    caplog.set_level(logging.INFO)
    assert safe_rerank(scorer, "what causes croup", PASSAGES, timeout_s=0.1) is None
    assert why in caplog.text


@pytest.mark.parametrize(
    "kind, path, why",
    [
        ("none", None, "not configured"),
        ("onnx", "/nonexistent/model", "could not load"),
        ("sentence_transformers", None, "could not load"),
        ("sentence_transformers", "/nonexistent/model", "could not load"),
    ],
)
def test_missing_or_unloadable_model_gives_no_scorer(kind, path, why, caplog):
    caplog.set_level(logging.INFO)
    assert load_scorer(kind, path) is None
    assert why in caplog.text


def test_load_error_from_corrupt_model_file(tmp_path, caplog):
    (tmp_path / "model.onnx").write_bytes(b"not an onnx model")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert load_scorer("onnx", str(tmp_path)) is None
    assert "could not load" in caplog.text


def test_good_scores_order_by_probability_with_fused_rank_breaking_ties():
    r = safe_rerank(Fake(result=[(2, 0.0), (0, 0.0), (1, 3.0)]), "q", PASSAGES)
    assert r.order == [1, 0, 2] and r.probabilities[1] == pytest.approx(1 / (1 + math.exp(-3)))


@pytest.mark.models
def test_real_cross_encoder_scores_and_is_order_independent(cross_encoder):
    r = safe_rerank(cross_encoder, "what causes croup", PASSAGES)
    assert r.order[0] == 0 and r.probabilities[0] > 0.9 and r.probabilities[1] < 0.01
    reversed_scores = dict(cross_encoder.score("what causes croup", PASSAGES[::-1]))
    assert reversed_scores[2] == pytest.approx(dict(cross_encoder.score("what causes croup", PASSAGES))[0], abs=0)
    assert sorted(r.order) == [0, 1, 2]  # never drops or duplicates a candidate


@pytest.mark.models
def test_pairs_scored_side_by_side_equal_each_pair_alone():
    """`score` runs a call's pairs on several threads at once: each logit is the one the pair gets alone, in a
    fresh scorer, one pair per call, in any order, on one worker or two."""
    from sourcegate.pipelines.retrieval.rerank import OnnxCrossEncoder

    passages = [*PASSAGES, "croup causes a barking cough in young children", "the night bus runs every hour"]
    together = OnnxCrossEncoder()
    together.workers = 2
    side_by_side = dict(together.score("what causes croup", passages))
    alone = OnnxCrossEncoder()
    alone.workers = 1
    one_by_one = {i: alone.score("what causes croup", [p])[0][1] for i, p in reversed(list(enumerate(passages)))}
    assert side_by_side == one_by_one  # to the bit
    assert together.computed == len(passages) and alone.computed == len(passages)
