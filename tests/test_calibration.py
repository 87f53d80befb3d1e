"""sourcegate.evals.calibration: hand-computed cases, what a gap promises, 2-D sweep, shipped check."""

import itertools
import json

import numpy as np
import pytest

from sourcegate.evals.calibration import calibrate, calibrate_pair, calibrate_signal, check_shipped

A, D = "answer", "decline"


def labelled(answer, decline):
    return list(answer) + list(decline), [A] * len(answer) + [D] * len(decline)


# --------------------------------------------------------------------------- one signal


def test_separating_signal_hand_computed():
    scores, labels = labelled([0.6, 0.7, 0.9], [0.1, 0.3, 0.5])
    r = calibrate_signal("s", scores, labels, min_per_label=3)
    assert r["answer_band"] == [0.6, 0.9] and r["decline_band"] == [0.1, 0.5]
    assert r["gap"] == pytest.approx(0.1) and r["has_gap"] is True
    assert r["auc"] == 1.0
    assert r["recommended_threshold"] == 0.6 and r["position_in_gap"] == 0.0
    assert r["decline_recall_at_recommended"] == 1.0
    # one question per side sets the gap: without them it is 0.7 - 0.3 = 0.4 > 2 x 0.1
    assert r["discriminates"] is True and r["verdict"] == "separates: gap 0.1 — decided by one question (#0, #5)"
    assert r["warnings"] == []

    mid = calibrate_signal("s", scores, labels, placement="midpoint", min_per_label=3)
    assert mid["recommended_threshold"] == pytest.approx(0.55)
    assert mid["position_in_gap"] == pytest.approx(0.5)
    assert mid["decline_recall_at_recommended"] == 1.0


def test_overlapping_signal_with_ties_hand_computed():
    scores, labels = labelled([0.2, 0.5, 0.8], [0.1, 0.5, 0.6])
    r = calibrate_signal("s", scores, labels, min_per_label=3)
    assert r["gap"] == pytest.approx(-0.4) and r["has_gap"] is False
    assert r["position_in_gap"] is None
    # pairs won: 0.2 beats 1; 0.5 beats 1 and ties 1 (0.5); 0.8 beats 3 -> 5.5 / 9
    assert r["auc"] == pytest.approx(5.5 / 9)
    assert r["recommended_threshold"] == 0.2
    assert r["decline_recall_at_recommended"] == pytest.approx(1 / 3)
    assert r["verdict"].startswith("overlaps: AUC 0.61, no gap")
    mid = calibrate_signal("s", scores, labels, placement="midpoint", min_per_label=3)
    assert mid["recommended_threshold"] == 0.2
    assert any("fell back" in w for w in mid["warnings"])


def test_inverted_signal_is_called_inverted():
    scores, labels = labelled([0.1, 0.2, 0.3, 0.75], [0.7, 0.8, 0.9])
    r = calibrate_signal("bm25_z", scores, labels)
    assert r["auc"] == pytest.approx(1 / 12)
    assert r["discriminates"] is False
    assert r["verdict"] == "inverted: AUC 0.08 — higher scores for should-decline"


def test_chance_signal_does_not_discriminate():
    rng = np.random.default_rng(3)
    scores, labels = labelled(rng.uniform(size=400), rng.uniform(size=400))
    r = calibrate_signal("margin", scores, labels)
    assert r["discriminates"] is False and r["has_gap"] is False
    assert r["verdict"].startswith("does not discriminate: AUC 0.")


def test_small_labels_warn():
    scores, labels = labelled([0.6, 0.7], [0.1] * 25)
    r = calibrate_signal("s", scores, labels, min_per_label=20)
    assert [w for w in r["warnings"] if "should-answer" in w and "< 20" in w]
    assert not [w for w in r["warnings"] if "should-decline" in w]


def test_empty_label_cannot_calibrate():
    r = calibrate_signal("s", [0.1, 0.2], [A, A])
    assert r["discriminates"] is False and r["gap"] is None
    assert r["verdict"] == "cannot calibrate: no should-decline questions"


def test_bad_labels_rejected():
    with pytest.raises(ValueError):
        calibrate_signal("s", [0.1, 0.2], [A, "maybe"])


# --------------------------------------------------------------------------- what a gap promises


def test_promise_is_n_over_n_plus_one():
    scores, labels = labelled([0.6, 0.7, 0.9], [0.1, 0.3, 0.5, 0.55])
    r = calibrate_signal("s", scores, labels, min_per_label=3)
    assert r["promise"]["keep_new_answer"] == pytest.approx(3 / 4)
    assert r["promise"]["decline_new_decline"] == pytest.approx(4 / 5)
    assert r["promise"]["n_needed"] == 368 and r["promise"]["n_answer"] == 3
    assert "gap_ci" not in r and "bootstrap" not in r


def test_gap_without_extremes_and_deciding_questions_hand_computed():
    scores = [0.6, 0.7, 0.9, 0.95, 0.1, 0.3, 0.5]
    labels = [A, A, A, A, D, D, D]
    ids = ["a1", "a2", "a3", "a4", "d1", "d2", "d3"]
    f = calibrate_signal("s", scores, labels, ids=ids, min_per_label=3)["fragility"]
    # k=1: 0.7 - 0.3; k=2: 0.9 - 0.1; k=3: the decline side has only 3
    assert f["gap"] == pytest.approx(0.1)
    assert f["gap_without"]["1"] == pytest.approx(0.4) and f["gap_without"]["2"] == pytest.approx(0.8)
    assert f["gap_without"]["3"] is None
    assert f["deciding"] == {"answer": ["a1"], "decline": ["d3"]}
    assert f["to_open"] == 0 and f["to_close"] == 1
    # one question per side takes more than half: 0.4 > 2 x 0.1
    assert f["one_question"] is True


def test_gap_not_resting_on_one_question():
    scores, labels = labelled([0.6, 0.65, 0.9], [0.1, 0.3, 0.35])
    r = calibrate_signal("s", scores, labels, min_per_label=3)
    # gap 0.25; without the extremes 0.65 - 0.3 = 0.35 < 2 x 0.25
    assert r["fragility"]["one_question"] is False and "one question" not in r["verdict"]


def test_overlap_opened_by_removing_one_question_is_flagged():
    # One should-decline question (d-odd at 0.8) sits among the should-answer scores.
    scores = [0.5, 0.7, 0.9, 0.1, 0.2, 0.8]
    ids = ["a1", "a2", "a3", "d1", "d2", "d-odd"]
    r = calibrate_signal("s", scores, [A, A, A, D, D, D], ids=ids, min_per_label=3)
    f = r["fragility"]
    assert r["has_gap"] is False and f["to_open"] == 1 and f["opening"] == ["d-odd"]
    assert f["one_question"] is True and f["gap_without"]["1"] == pytest.approx(0.7 - 0.2)
    assert r["verdict"].endswith("decided by one question (d-odd)")


def test_overlap_needing_several_removals():
    scores, labels = labelled([0.2, 0.5, 0.8], [0.1, 0.5, 0.6])
    f = calibrate_signal("s", scores, labels, min_per_label=3)["fragility"]
    # cut 0.2 removes the should-decline 0.5 and 0.6; cut 0.8 the should-answer 0.2 and 0.5: 2 either way
    assert f["to_open"] == 2 and f["one_question"] is False


def test_artifact_sweep_is_downsampled_but_numbers_exact():
    rng = np.random.default_rng(5)
    scores, labels = labelled(rng.uniform(0.3, 1, 2000), rng.uniform(0, 0.6, 2000))
    r = calibrate_signal("s", scores, labels)
    assert len(r["sweep"]["thresholds"]) <= 200 and r["sweep"]["n_thresholds"] == 4000
    assert r["recommended_threshold"] in r["sweep"]["thresholds"]
    assert r["recommended_threshold"] == min(scores[:2000])


# --------------------------------------------------------------------------- 2-D


def brute_force_pair(x, y, is_answer):
    """Best decline recall over all threshold pairs that keep every answer."""
    best = -1.0
    for a, b in itertools.product(np.unique(x), np.unique(y)):
        kept = (x >= a) & (y >= b)
        if kept[is_answer].all():
            best = max(best, float((~kept[~is_answer]).mean()))
    return best


@pytest.mark.parametrize("seed", range(5))
def test_pair_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = 40
    is_answer = rng.random(n) < 0.5
    x = np.round(rng.normal(is_answer * 0.8, 1), 2)  # rounded: ties on purpose
    y = np.round(rng.normal(is_answer * 0.5, 1), 2)
    labels = np.where(is_answer, A, D).tolist()
    r = calibrate_pair("x", x.tolist(), "y", y.tolist(), labels)
    a, b = r["recommended"]["x"], r["recommended"]["y"]
    kept = (x >= a) & (y >= b)
    assert kept[is_answer].all()
    assert r["decline_recall_at_recommended"] == pytest.approx(float((~kept[~is_answer]).mean()))
    assert r["decline_recall_at_recommended"] == pytest.approx(brute_force_pair(x, y, is_answer))
    assert r["separates"] == (r["decline_recall_at_recommended"] == 1.0)
    hm = r["heatmap"]
    for i, j in [(0, 0), (3, 7), (len(hm["x_thresholds"]) - 1, len(hm["y_thresholds"]) - 1)]:
        grid_kept = (x >= hm["x_thresholds"][i]) & (y >= hm["y_thresholds"][j])
        assert hm["coverage"][i][j] == pytest.approx(grid_kept[is_answer].mean())
        assert hm["decline_recall"][i][j] == pytest.approx((~grid_kept[~is_answer]).mean())


def test_pair_separating_perfectly():
    labels = [A, A, D, D]
    r = calibrate_pair("x", [0.9, 0.5, 0.9, 0.1], "y", [0.5, 0.9, 0.1, 0.9], labels)
    assert r["recommended"] == {"x": 0.5, "y": 0.5}
    assert r["separates"] is True and r["decline_recall_at_recommended"] == 1.0
    assert r["single_signal_recall"] == {"x": 0.5, "y": 0.5}


# --------------------------------------------------------------------------- shipped and artifact


def records(answer_scores, decline_scores, signal="rerank_top"):
    out = [
        {"id": f"a-{i:03d}", "question": f"answerable {i}", "label": A, "kind": "fact", "signals": {signal: s}}
        for i, s in enumerate(answer_scores)
    ]
    out += [
        {"id": f"d-{i:03d}", "question": f"unanswerable {i}", "label": D, "kind": "offtopic", "signals": {signal: s}}
        for i, s in enumerate(decline_scores)
    ]
    return out


def test_check_shipped_lists_exactly_the_wrongly_declined():
    recs = records([0.3, 0.45, 0.5, 0.9], [0.1, 0.55, 0.2])
    r = check_shipped(recs, "rerank_top", 0.5)
    assert [q["id"] for q in r["wrongly_declined"]] == ["a-000", "a-001"]
    assert r["wrongly_declined"][0] == {
        "id": "a-000",
        "question": "answerable 0",
        "kind": "fact",
        "score": 0.3,
        "fix": "threshold <= 0.3",
    }
    assert [q["id"] for q in r["wrongly_answered"]] == ["d-001"]
    assert r["coverage"] == 0.5 and r["decline_recall"] == pytest.approx(2 / 3)
    assert r["max_threshold_for_full_coverage"] == 0.3


def test_check_shipped_counts_unscored_answers_as_not_kept():
    recs = records([0.6, None], [0.1])
    r = check_shipped(recs, "rerank_top", 0.5)
    assert r["coverage"] == 0.5 and r["unscored"] == ["a-001"] and r["wrongly_declined"] == []


def test_unscored_questions_are_declined_in_every_check():
    from sourcegate.evals.calibration import decline_recall_by_kind

    recs = records([0.6, None], [0.1, None, 0.7])
    shipped = check_shipped(recs, "rerank_top", 0.5)
    by_kind = decline_recall_by_kind(recs, "rerank_top", 0.5)
    # d-001 has no score: declined, as at runtime; d-002 (0.7) is answered
    assert shipped["decline_recall"] == pytest.approx(2 / 3) == by_kind["offtopic"]["recall"]
    assert [q["id"] for q in shipped["wrongly_answered"]] == ["d-002"]
    assert shipped["unscored"] == ["a-001", "d-001"] and shipped["unscored_by_label"] == {"answer": 1, "decline": 1}


def test_a_nan_or_infinite_score_is_no_score_in_every_check_and_at_runtime():
    """A model's NaN logit (sigmoid(nan) is nan): the sweep counted it declined, the runtime answered it."""
    from sourcegate.evals.answer_modes import mode_for
    from sourcegate.evals.calibration import decline_recall_by_kind

    recs = records([0.6], [float("nan"), float("inf"), 0.1])
    shipped = check_shipped(recs, "rerank_top", 0.5)
    by_kind = decline_recall_by_kind(recs, "rerank_top", 0.5)
    assert shipped["decline_recall"] == 1.0 == by_kind["offtopic"]["recall"]
    answer = {"signal": "rerank_top", "adjacent": 0.5, "strong": 0.7, "below": "decline"}
    for value in (float("nan"), float("inf"), float("-inf"), None):
        assert mode_for({"rerank_top": value}, answer)[0] == "decline", value
    assert mode_for({"rerank_top": 0.9}, answer)[0] == "sourced"


CONFIG = {
    "signals": ["cosine_top", "rerank_top", "bm25_z", "term_coverage"],
    "pair": ["bm25_z", "term_coverage"],
    "placement": "tightest",
    "min_per_label": 20,
    "gating": {"signal": "cosine_top", "adjacent": 0.4, "strong": 0.6},
}


def synthetic_records(n, seed=0, rerank=True):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        answer = i % 2 == 0
        out.append(
            {
                "id": f"q-{i}",
                "question": f"q {i}",
                "label": A if answer else D,
                "kind": "k",
                "signals": {
                    "cosine_top": float(rng.uniform(0.45, 0.9) if answer else rng.uniform(0.1, 0.4)),
                    "rerank_top": float(rng.uniform()) if rerank else None,
                    "bm25_z": float(rng.normal(2 if answer else 4, 1)),
                    "bm25_top": float(rng.normal()),
                    "margin": float(rng.uniform()),
                    "term_coverage": float(rng.uniform(0.3, 1) if answer else rng.uniform(0, 0.7)),
                },
            }
        )
    return out


def test_calibrate_artifact_is_json_and_deterministic():
    recs = synthetic_records(200)
    recs[3]["signals"]["term_coverage"] = float("nan")
    out = calibrate(recs, CONFIG)
    again = calibrate(recs, CONFIG)
    text = json.dumps(out, allow_nan=False)
    assert text == json.dumps(again, allow_nan=False)
    assert out["n"] == {"answer": 100, "decline": 100}
    assert out["signals"]["cosine_top"]["has_gap"] is True
    assert out["signals"]["bm25_z"]["verdict"].startswith("inverted")
    assert any("1 questions have no term_coverage" in w for w in out["signals"]["term_coverage"]["warnings"])
    assert out["pair"]["n"] == {"answer": 100, "decline": 99}
    assert out["shipped"]["coverage"] == 1.0 and out["shipped"]["strong_threshold"] == 0.6
    assert out["questions"][3]["signals"]["term_coverage"] is None
    assert len(out["questions"]) == 200


def test_each_signal_is_also_read_on_the_decline_kinds_the_gap_holds():
    recs = records([0.5, 0.7, 0.9], [0.1, 0.2], signal="cosine_top")
    recs += [{"id": "n-000", "question": "near", "label": D, "kind": "near_topic", "signals": {"cosine_top": 0.95}}]
    config = dict(CONFIG, signals=["cosine_top"], pair=None, gating=None, min_per_label=1)
    everything = calibrate(recs, config)["signals"]["cosine_top"]
    assert everything["has_gap"] is False and "gated" not in everything  # no kinds named: every decline is gated
    read = calibrate(recs, dict(config, gate_decline_kinds=["offtopic"]))["signals"]["cosine_top"]
    assert read["gap"] == pytest.approx(0.5 - 0.95) and read["has_gap"] is False  # the column weighing every kind
    assert read["gated"] == {
        "n": {"answer": 3, "decline": 2},
        "gap": pytest.approx(0.5 - 0.2),
        "has_gap": True,
        "auc": 1.0,
        "declined_at_full_coverage": 1.0,
    }


def test_reranker_off_skips_signal_with_note():
    out = calibrate(synthetic_records(60, rerank=False), CONFIG)
    skipped = out["signals"]["rerank_top"]
    assert skipped["skipped"] is True and "reranker off" in skipped["note"]
    json.dumps(out, allow_nan=False)


def test_ten_thousand_questions_complete():
    config = dict(
        CONFIG,
        signals=["cosine_top", "rerank_top", "bm25_z", "bm25_top", "term_coverage", "margin"],
    )
    out = calibrate(synthetic_records(10_000, seed=1), config)
    assert out["n"] == {"answer": 5000, "decline": 5000}
    assert all(len(s["sweep"]["thresholds"]) <= 200 for s in out["signals"].values())
