"""The candidate decline signals' pure parts (benchmarks/signal_candidates.py), on fixed inputs worked by hand."""

import json

import numpy as np
import pytest

from benchmarks.background_transfer import judged_at
from benchmarks.signal_candidates import background_questions, judged, over_background, views_of


def test_views_are_the_question_its_sentences_and_its_content_words():
    assert views_of("My dad is blind. Does the bus announce stops?") == [
        "My dad is blind. Does the bus announce stops?",
        "My dad is blind.",
        "Does the bus announce stops?",
        "dad blind bus announce stops",  # stopwords of the query analyser dropped
    ]
    assert views_of("bike on train??") == ["bike on train??", "bike train"]  # one sentence: no sentence views


def test_a_signal_is_judged_at_its_own_full_coverage_and_at_the_fit_threshold():
    rows = [{"label": "answer", "kind": "single", "s": v} for v in (0.9, 0.5, 0.7)]
    rows += [{"label": "decline", "kind": "off_topic", "s": v} for v in (0.4, 0.6)]
    rows += [{"label": "decline", "kind": "near_topic", "s": 0.2}]
    out = judged(rows, "s", fit_threshold=0.55)
    assert out["kept_at_fit_threshold"] == "2/3"  # 0.5 falls under the fit set's threshold
    assert out["auc_off_topic"] == pytest.approx(5 / 6, abs=5e-4)  # 0.5 < 0.6: the one lost pair of six (3 places)
    assert out["auc_near_topic"] == 1.0
    assert out["off_topic_declined_at_own_100"] == "1/2"  # below this set's lowest should-answer 0.5: only 0.4
    assert out["off_topic_declined_at_fit_threshold"] == "1/2"
    assert out["near_topic_declined_at_own_100"] == out["near_topic_declined_at_fit_threshold"] == "1/1"


def test_over_background_is_the_corpus_best_minus_the_mean_of_the_five_best_background_cosines():
    background = [0.1, 0.9, 0.3, 0.8, 0.2, 0.7, 0.6]  # five best: 0.9 0.8 0.7 0.6 0.3, mean 0.66
    assert over_background(0.5, background) == pytest.approx(0.5 - 0.66)
    assert over_background(0.5, [0.2, 0.4]) == pytest.approx(0.5 - 0.3)  # fewer than five: all of them


def test_background_questions_are_distinct_and_sorted(tmp_path):
    squad = {
        "data": [
            {
                "title": "T",
                "paragraphs": [
                    {"context": "c", "qas": [{"question": "Who? "}, {"question": "What?"}, {"question": "Who?"}]}
                ],
            }
        ]
    }
    path = tmp_path / "bg.json"
    path.write_text(json.dumps(squad))
    assert background_questions(str(path)) == ["What?", "Who?"]


def test_a_transferred_threshold_is_judged_by_what_it_keeps_and_declines():
    out = judged_at([0.9, 0.5, 0.3, 0.6, 0.1], [True, True, True, False, False], threshold=0.4)
    assert out == {"threshold": 0.4, "kept": "2/3", "declined": "1/2", "auc": pytest.approx(4 / 6, abs=5e-4)}


def test_a_bi_encoders_signals_are_the_best_passage_cosine_and_its_lift_over_the_background():
    from benchmarks.bi_encoder_candidates import signals

    questions = np.array([[1.0, 0.0], [0.6, 0.8]])
    passages = np.array([[0.8, 0.6], [0.0, 1.0]])  # q1: 0.8, 0.0 -> 0.8; q2: 0.96, 0.8 -> 0.96
    background = np.array([[1.0, 0.0]])  # one background question: q1 1.0, q2 0.6
    out = signals(questions, passages, background)
    assert out["cosine_top"] == pytest.approx([0.8, 0.96])
    assert out["cosine_over_background"] == pytest.approx([0.8 - 1.0, 0.96 - 0.6])


def test_in_domain_pairs_are_labelled_passages_for_answers_and_the_fused_top_for_declines():
    from benchmarks.in_domain_answerability import training_pairs

    passages = [[f"doc#s{i}", f"text {i}"] for i in range(10)]
    rows = [
        {"query": "a?", "label": "answer", "expected": ["doc#s4", "doc#s0", "doc#s7", "doc#s9"], "passages": passages},
        {"query": "b?", "label": "answer", "expected": ["other#s1"], "passages": passages},  # not found: no pair
        {"query": "c?", "label": "decline", "expected": [], "passages": passages},
    ]
    assert training_pairs(rows) == [
        ("a?", "text 0", 1),  # at most two labelled passages, in fused order
        ("a?", "text 4", 1),
        ("c?", "text 0", 0),  # a decline: the three passages the score reads
        ("c?", "text 1", 0),
        ("c?", "text 2", 0),
    ]
    assert [p for p in training_pairs(rows, window=5) if p[2] == 0] == [("c?", f"text {i}", 0) for i in range(5)]


def test_a_supervised_probe_judges_each_set_by_the_others_tightest_threshold():
    from benchmarks.intent_probe import leave_one_set_out

    def q(i, label, kind):
        return {"id": i, "label": label, "kind": kind}

    # one dimension: in-domain questions near +1, off-topic near -1; set b's off-topic sits among the answers
    sets = {
        "a": [q("a1", "answer", "single"), q("a2", "answer", "single"), q("a3", "decline", "off_topic")],
        "b": [q("b1", "answer", "single"), q("b2", "decline", "off_topic")],
    }
    vectors = {"a": np.array([[1.0], [0.8], [-1.0]]), "b": np.array([[0.9], [0.85]])}
    out = leave_one_set_out(sets, vectors)
    assert out["b"]["kept_at_fit_threshold"] == "1/1"
    assert out["b"]["off_topic_not_declined"] == ["b2"]  # above a's lowest answer (0.8): not declined
    assert out["a"]["kept_at_fit_threshold"] == "1/2"  # trained on b alone, its answer 0.9 sets the bar


def test_in_domain_judgement_names_the_answers_lost_and_the_off_topic_let_through():
    from benchmarks.in_domain_answerability import judged_at

    rows = [
        {"id": "a1", "label": "answer", "kind": "single", "tuned": 2.0},
        {"id": "a2", "label": "answer", "kind": "single", "tuned": -1.0},
        {"id": "o1", "label": "decline", "kind": "off_topic", "tuned": 0.5},
        {"id": "o2", "label": "decline", "kind": "off_topic", "tuned": -3.0},
    ]
    out = judged_at(rows, 0.0)
    assert out["kept_at_fit_threshold"] == "1/2"
    assert out["answer_lost"] == [("a2", -1.0)]
    assert out["off_topic_through"] == [("o1", 0.5)]
