"""Answerability signals on small hand-made passages (sourcegate/pipelines/retrieval/answerability.py)."""

import zlib

import numpy as np
import pyarrow.parquet as pq
import pytest

from sourcegate.pipelines.config import Retrieval
from sourcegate.pipelines.retrieval.answerability import (
    answerability_signals,
    concept_coverage,
    content_terms,
    rarity_weights,
    split_sentences,
    term_similarity,
    uncovered,
)
from sourcegate.pipelines.retrieval.retriever import Retriever
from sourcegate.pipelines.search.analyzer import STOPWORDS
from sourcegate.pipelines.search.bm25 import BM25Index, tokenize
from sourcegate.pipelines.search.embedded import EmbeddedStore
from tests.conftest import chunks_with_vectors

SENIORS = (
    "Riders aged 65 and older ride free on local buses and light rail on weekdays between 9:30 a.m. and "
    "2:30 p.m. Tap your Reduced Fare RiverCard as usual. Seniors without a card can show a photo ID."
)
BIKES = "Bikes are allowed on light rail at all hours. Hang your bike on one of the four hooks."
POOL = [SENIORS, BIKES, "Pets in carriers ride free.", "Seniors pay the reduced fare of $1.10."]
INDEX = BM25Index.from_texts(POOL)  # the embedded backend's BM25 over the four passages: a tiny whole index


def frequencies(terms):
    """(chunks, {term: df}) over INDEX, as `EmbeddedSearcher.document_frequencies` gives them."""
    return INDEX.size, {t: INDEX.document_frequency(t) for t in terms}


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


def test_a_term_the_index_does_not_hold_weighs_most():
    terms = ["taxi", "hooks", "seniors", "the"]
    n, df = frequencies(terms)
    assert (n, df) == (4, {"taxi": 0, "hooks": 1, "seniors": 2, "the": 0})  # BM25 analysis: hook, senior; none
    w = rarity_weights(terms, n, df)
    assert w["taxi"] > w["hooks"] > w["seniors"] > 0  # in none, one and two of the four passages
    assert w["the"] == w["taxi"] == rarity_weights(["taxi"], n, {})["taxi"]  # empty analysis or not asked: df 0


def test_document_frequency_counts_chunks_holding_every_term_of_the_word():
    assert [INDEX.document_frequency(w) for w in ["Bikes", "bike", "ride", "free", "fare"]] == [1, 1, 2, 2, 2]
    assert INDEX.document_frequency("reduced-fare") == 2 and INDEX.document_frequency("reduced-taxi") == 0


def test_uncovered_rare_term_lowers_coverage_and_is_named():
    terms = content_terms("Do seniors ride free in a taxi?", STOPWORDS)
    weights = rarity_weights(terms, *frequencies(terms))
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
    assert concept_coverage(rarity_weights(terms, *frequencies(terms)), sim) == pytest.approx(1.0)


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

    def signals(question, passage):
        n, df = frequencies(content_terms(question, STOPWORDS))
        return answerability_signals(question, embedder.encode_query(question), [passage], n, df, **kwargs)

    para = "Can I bring my bicycle on the light rail?"
    covered = signals(para, BIKES)
    taxi = "Does RRT give seniors taxi vouchers?"
    missing = signals(taxi, SENIORS)
    assert "bicycle" not in covered["uncovered_terms"]
    # "vouchers" is nowhere near the passage; single-word cosines are generous ("taxi" ~ "buses"
    # passes 0.5), which is why the signal weighs soft matches by degree, not by a cut-off
    assert "vouchers" in missing["uncovered_terms"] and "seniors" not in missing["uncovered_terms"]
    assert covered["concept_coverage"] > missing["concept_coverage"]
    assert 0 < missing["sentence_cosine"] < covered["sentence_cosine"] <= 1
    empty = signals("What is it?", BIKES)
    assert empty["concept_coverage"] == 1.0 and empty["uncovered_terms"] == []


class BagOfWords:
    """A model-free encoder for the fast tier: a text's vector is the unit sum of its words' hashed axes."""

    dim = 4096

    def encode(self, texts):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, text in enumerate(texts):
            for w in tokenize(text):
                out[i, zlib.crc32(w.encode()) % self.dim] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    def encode_query(self, text):
        return self.encode([text])[0]


def bag_of_words_index(folder, texts: list[str]):
    """An embedded version of one chunk per text, embedded by BagOfWords: (its searcher, the encoder)."""
    encoder = BagOfWords()
    rows = [
        {"chunk_id": f"c{i:03d}", "doc_id": f"d{i}", "title": "T", "section": "S", "section_id": "s", "body": t}
        | {"text": t, "text_hash": str(i), "ordinal": 0}
        for i, t in enumerate(texts)
    ]
    pq.write_table(chunks_with_vectors(rows, encoder.encode(texts), "bag-of-words"), folder / "c.parquet")
    store = EmbeddedStore(folder / "runs", folder / "LIVE")
    store.load("v1", str(folder / "c.parquet"))
    return store.open("v1"), encoder


def test_concept_coverage_is_the_same_at_any_list_depth(tmp_path):
    """G7: bm25_top_n / knn_top_n change the candidate pool, never the rarity weights (whole-index idf)."""
    rng = np.random.default_rng(14)
    filler = ["bus", "train", "fare", "pass", "bike", "night", "airport", "refund", "seniors", "ride", "card", "rail"]
    texts = POOL + [" ".join(rng.choice(filler, size=8)) for _ in range(40)]
    searcher, encoder = bag_of_words_index(tmp_path, texts)
    shallow, deep = (Retriever(searcher, encoder, None, Retrieval(bm25_top_n=n, knn_top_n=n)) for n in (3, 40))
    for question in ["Do seniors ride free in a taxi?", "Can seniors use the reduced fare card on the night bus?"]:
        a, b = shallow.retrieve(question), deep.retrieve(question)
        assert len(a.fused) <= 6 < len(b.fused)  # different pools: the old pool idf gave different weights
        assert {c.chunk_id for c in a.fused[:3]} == {c.chunk_id for c in b.fused[:3]}  # the covering passages
        assert 0 < a.signals["concept_coverage"] < 1  # weights matter: some term covered, some not
        assert a.signals["concept_coverage"] == b.signals["concept_coverage"]
        assert a.signals["uncovered_terms"] == b.signals["uncovered_terms"]
