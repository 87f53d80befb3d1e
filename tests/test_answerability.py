"""Answerability signals on small hand-made passages (pipelines/answerability.py)."""

import numpy as np
import pytest

from pipelines.answerability import (
    answerability_signals,
    concept_coverage,
    content_terms,
    rarity_weights,
    split_sentences,
    term_similarity,
    uncovered,
)
from pipelines.search.analyzer import STOPWORDS

SENIORS = (
    "Riders aged 65 and older ride free on local buses and light rail on weekdays between 9:30 a.m. and "
    "2:30 p.m. Tap your Reduced Fare RiverCard as usual. Seniors without a card can show a photo ID."
)
BIKES = "Bikes are allowed on light rail at all hours. Hang your bike on one of the four hooks."
POOL = [SENIORS, BIKES, "Pets in carriers ride free.", "Seniors pay the reduced fare of $1.10."]


def one_hot(vocab):
    """A stand-in encoder for the unit tier: each word its own axis, two given synonyms share one."""
    axes = {w: i for i, w in enumerate(sorted(set(vocab)))}

    def encode(words):
        out = np.zeros((len(words), len(axes)), np.float32)
        for i, w in enumerate(words):
            out[i, axes[{"bicycle": "bike"}.get(w, w)]] = 1.0
        return out

    return encode


def test_content_terms_drop_function_words_and_numbers():
    assert content_terms("Does RRT give seniors taxi vouchers in 2026?", STOPWORDS) == [
        "rrt",
        "give",
        "seniors",
        "taxi",
        "vouchers",
    ]
    assert content_terms("What is it?", STOPWORDS) == []


def test_a_term_no_candidate_holds_weighs_most():
    w = rarity_weights(["taxi", "hooks", "seniors"], POOL)
    assert w["taxi"] > w["hooks"] > w["seniors"] > 0  # in none, one and two of the four candidates


def test_uncovered_rare_term_lowers_coverage_and_is_named():
    terms = content_terms("Do seniors ride free in a taxi?", STOPWORDS)
    weights = rarity_weights(terms, POOL)
    words = sorted(set(SENIORS.lower().replace(".", " ").split()))
    sim = term_similarity(terms, words, one_hot(words + terms))
    assert sim["seniors"] == sim["free"] == 1.0 and sim["taxi"] == 0.0
    cov = concept_coverage(weights, sim)
    assert cov == pytest.approx(1 - weights["taxi"] / sum(weights.values()))
    assert cov < 0.6 < concept_coverage({t: 1.0 for t in terms}, sim)  # rarity weighting is what bites
    assert uncovered(weights, sim) == ["taxi"]


def test_covered_paraphrase_counts_through_word_vectors():
    terms = content_terms("Can I hang a bicycle on light rail?", STOPWORDS)
    words = sorted(set(BIKES.lower().replace(".", " ").split()))
    sim = term_similarity(terms, words, one_hot(words + terms))
    assert sim["bicycle"] == 1.0  # not in the text, covered by "bike"
    assert concept_coverage(rarity_weights(terms, POOL), sim) == pytest.approx(1.0)


def test_question_without_content_terms_is_fully_covered():
    assert concept_coverage({}, {}) == 1.0
    assert term_similarity([], ["bike"], one_hot(["bike"])) == {}
    assert term_similarity(["taxi"], [], one_hot(["taxi"])) == {"taxi": 0.0}


def test_sentences_and_list_items_are_split():
    text = "Bikes are allowed. On the Valley Line, bikes ride in the last car.\n- Seniors aged 65 and older\n- Youth"
    assert split_sentences(text) == [
        "Bikes are allowed.",
        "On the Valley Line, bikes ride in the last car.",
        "Seniors aged 65 and older",
    ]
    assert split_sentences("") == []


@pytest.mark.models
def test_signals_with_the_real_bi_encoder(embedder):
    """Real MiniLM word vectors: a paraphrase is covered, an unseen concept is not."""
    kwargs = dict(stopwords=STOPWORDS, word_vectors=embedder.encode, sentence_vectors=embedder.encode)
    para = "Can I bring my bicycle on the light rail?"
    covered = answerability_signals(para, embedder.encode_query(para), [BIKES], POOL, **kwargs)
    taxi = "Does RRT give seniors taxi vouchers?"
    missing = answerability_signals(taxi, embedder.encode_query(taxi), [SENIORS], POOL, **kwargs)
    assert "bicycle" not in covered["uncovered_terms"]
    # "vouchers" is nowhere near the passage; single-word cosines are generous ("taxi" ~ "buses"
    # passes 0.5), which is why the signal weighs soft matches by degree, not by a cut-off
    assert "vouchers" in missing["uncovered_terms"] and "seniors" not in missing["uncovered_terms"]
    assert covered["concept_coverage"] > missing["concept_coverage"]
    assert 0 < missing["sentence_cosine"] < covered["sentence_cosine"] <= 1
    empty = answerability_signals("What is it?", embedder.encode_query("What is it?"), [BIKES], POOL, **kwargs)
    assert empty["concept_coverage"] == 1.0 and empty["uncovered_terms"] == []
