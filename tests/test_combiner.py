"""The answerability combiner (sourcegate/pipelines/retrieval/combiner.py): fitted deterministically, loaded strictly.

Fast tier: hand-made signal rows, no model, no index.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from sourcegate.pipelines.app.cli import accepted_combiner
from sourcegate.pipelines.retrieval import combiner

FEATURES = ["concept_coverage", "rerank_top"]


def questions(n_answer: int = 30, n_decline: int = 20, seed: int = 3, separable: bool = True) -> list[dict]:
    """Should-answer rows high on concept_coverage, should-decline rows low (with rerank_top as noise)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_answer + n_decline):
        answer = i < n_answer
        cover = rng.uniform(0.6, 1.0) if answer else rng.uniform(0.0, 0.55 if separable else 0.8)
        rows.append(
            {
                "id": f"q{i}",
                "label": "answer" if answer else "decline",
                "kind": "single" if answer else ("near_topic" if i % 2 else "off_topic"),
                "signals": {"concept_coverage": cover, "rerank_top": rng.uniform(0.0, 1.0), "cosine_top": 0.5},
            }
        )
    return rows


def test_the_fit_is_deterministic_and_hashes_its_training_rows():
    a, b = combiner.fit(questions(), FEATURES), combiner.fit(questions(), FEATURES)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    other = combiner.fit(questions(seed=4), FEATURES)
    assert other["training"]["sha256"] != a["training"]["sha256"] and other["coef"] != a["coef"]
    assert a["training"]["n"] == {"answer": 30, "decline": 20} and a["features"] == FEATURES


def test_a_fitted_model_separates_a_separable_set():
    rows = questions()
    model = combiner.fit(rows, FEATURES)
    score = {r["id"]: combiner.score(model, r["signals"]) for r in rows}
    lowest_answer = min(score[r["id"]] for r in rows if r["label"] == "answer")
    highest_decline = max(score[r["id"]] for r in rows if r["label"] == "decline")
    assert lowest_answer > highest_decline  # a gap: every should-answer above every should-decline
    assert model["coef"][0] > 0  # the separating signal carries the weight, in the "answerable" direction
    cv = model["cross_validated"]
    assert (
        cv["auc"] == 1.0
        and cv["answer_kept"] >= 0.9
        and set(cv["decline_recall_by_kind"])
        == {
            "near_topic",
            "off_topic",
        }
    )


def test_a_missing_feature_scores_none_and_rows_without_one_are_left_out():
    rows = questions()
    model = combiner.fit(rows, FEATURES)
    assert combiner.score(model, {"concept_coverage": 0.9, "rerank_top": None}) is None
    rows[0]["signals"]["rerank_top"] = None  # the reranker failed on one question
    assert combiner.fit(rows, FEATURES)["training"]["left_out"] == 1


def test_too_few_labelled_rows_or_its_own_score_as_a_feature_are_errors():
    with pytest.raises(combiner.CombinerError, match="need at least 2 of each"):
        combiner.fit([r for r in questions() if r["label"] == "answer"], FEATURES)
    with pytest.raises(combiner.CombinerError, match="its own score"):
        combiner.fit(questions(), ["answerability"])


def test_missing_or_mismatched_coefficient_files_are_clear_errors(tmp_path):
    path = tmp_path / "combiner.json"
    with pytest.raises(combiner.CombinerError, match="not found.*sourcegate calibrate"):
        combiner.load(path, FEATURES)
    path.write_text("{not json")
    with pytest.raises(combiner.CombinerError, match="not readable JSON"):
        combiner.load(path, FEATURES)
    model = combiner.fit(questions(), FEATURES)
    combiner.write(model, path)
    assert combiner.load(path, FEATURES) == json.loads(path.read_text())
    with pytest.raises(combiner.CombinerError, match=r"fitted on \['concept_coverage', 'rerank_top'\]"):
        combiner.load(path, ["rerank_top", "concept_coverage"])  # same signals, other order: other coefficients
    combiner.write({**model, "coef": model["coef"][:1]}, path)
    with pytest.raises(combiner.CombinerError, match="does not hold 2 means, scales and coefficients"):
        combiner.load(path, FEATURES)
    combiner.write({**model, "format": "something-else"}, path)
    with pytest.raises(combiner.CombinerError, match="is not a sourcegate-answerability-combiner/1 file"):
        combiner.load(path, FEATURES)


def test_the_shipped_combiner_loads_with_the_shipped_config(make_cfg):
    from sourcegate.pipelines.retrieval.retriever import combiner_for

    cfg = make_cfg()
    model = combiner_for(cfg)
    assert model["features"] == cfg.answerability.features and model["training"]["sha256"]
    assert combiner_for(make_cfg(**{"answerability.combiner": None})) is None


def test_a_combiner_fitted_for_other_features_is_refused_by_the_config(make_cfg):
    from sourcegate.pipelines.retrieval.retriever import combiner_for

    with pytest.raises(combiner.CombinerError, match="answerability.features lists \\['rerank_top'\\]"):
        combiner_for(make_cfg(**{"answerability.features": ["rerank_top"]}))


def test_accept_refits_what_calibrate_fitted(make_cfg, tmp_path):
    """accept fits from calibration.json's questions alone: the file calibrate wrote, bit for bit."""
    rows = questions(separable=False)
    calibrate_fit = combiner.fit(rows, FEATURES)
    cfg = make_cfg(**{"answerability.features": FEATURES, "answerability.combiner": str(tmp_path / "c.json")})
    calibration = json.loads(json.dumps({"questions": rows}))  # what calibration.json holds, through JSON
    assert accepted_combiner(cfg, calibration) == calibrate_fit
    assert accepted_combiner(make_cfg(**{"answerability.combiner": None}), calibration) is None


def _newton_reference(z: np.ndarray, y: np.ndarray, l2: float, steps: int = 50) -> np.ndarray:
    """The objective written out (summed log loss + l2/2 |coef|^2, intercept free), solved by plain Newton:
    the oracle scikit-learn's fit is checked against."""
    a = np.hstack([z, np.ones((len(z), 1))])
    penalty = np.r_[np.full(z.shape[1], l2), 0.0]
    w = np.zeros(a.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(a @ w)))
        w -= np.linalg.solve((a * (p * (1 - p))[:, None]).T @ a + np.diag(penalty), a.T @ (p - y) + penalty * w)
    return w


def test_the_logistic_regression_minimises_the_stated_objective():
    """scikit-learn's coefficients equal the objective's Newton solution within 1e-4, on overlapping classes."""
    rng = np.random.default_rng(3)
    z = rng.normal(size=(200, 6))
    y = (z @ np.array([1.5, -1.0, 0.5, 0.0, 2.0, -0.3]) + rng.normal(scale=1.5, size=200) > 0).astype(float)
    coef, intercept = combiner.fit_logistic(z, y, l2=1.0)
    reference = _newton_reference(z, y, 1.0)
    assert np.abs(np.r_[coef, intercept] - reference).max() < 1e-4
