"""Batched retrieval (`Retriever.retrieve_many`) and the signals' text-vector cache: the same
signals as the one-question-at-a-time path, in any order or batch, and across nights."""

import logging
import math
import time
from collections import Counter

import numpy as np
import pytest

from sourcegate.evals.evalset import load_evalset
from sourcegate.evals.evaluate import run_questions
from sourcegate.pipelines.config import Retrieval
from sourcegate.pipelines.retrieval import combiner as combiner_mod
from sourcegate.pipelines.retrieval.answer_support import answer_support
from sourcegate.pipelines.retrieval.answerability import TOP_PASSAGES, TextVectors, answerability_signals, content_terms
from sourcegate.pipelines.retrieval.retriever import Retriever, effective_query
from sourcegate.pipelines.search.analyzer import STOPWORDS
from tests.promotable import ROOT, WHOLE_FIT
from tests.test_answerability import POOL, BagOfWords, bag_of_words_index

TEN = Retrieval(bm25_top_n=10, knn_top_n=10)  # ten-deep lists over the small bag-of-words index
QUESTIONS = [
    ("Do seniors ride free in a taxi?", []),
    ("Can seniors use the reduced fare card on the night bus?", []),
    ("Are pets allowed?", []),
    ("and bikes?", ["Can I take my dog on the light rail?"]),
    ("What is it?", []),
    ("Where do I hang my bicycle on the train?", []),
]


def one_at_a_time(retriever: Retriever, question: str, context=()) -> tuple[dict, list[str]]:
    """The reference: retrieval as it was before batching, one question, nothing memoised
    (the query through encode_query, words and sentences straight through the embedder)."""
    query = effective_query(question, context)
    encode = retriever.embedder.encode
    vector = retriever.embedder.encode_query(query)
    fused, found = retriever.fuse(query, vector, content_terms(query, STOPWORDS))
    result, ranked = retriever.rerank(query, fused)
    signals = Retriever.signals(query, fused, found, result)
    top = [c.text for c in fused[:TOP_PASSAGES]]
    n, df = found.distribution.total, found.document_frequencies
    signals.update(answerability_signals(query, vector, top, n, df, STOPWORDS, encode, encode))
    signals["answer_support"] = answer_support(retriever.answer_scorer, query, top)
    signals[combiner_mod.SIGNAL] = combiner_mod.score(retriever.combiner, signals) if retriever.combiner else None
    return signals, [c.chunk_id for c in ranked]


def assert_same_signals(a: dict, b: dict, tol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], float) and isinstance(b[k], float):
            assert math.isclose(a[k], b[k], rel_tol=0, abs_tol=tol), (k, a[k], b[k])
        else:
            assert a[k] == b[k], (k, a[k], b[k])


@pytest.fixture
def bag_index(tmp_path):
    rng = np.random.default_rng(3)
    filler = ["bus", "train", "fare", "pass", "bike", "night", "airport", "refund", "seniors", "ride", "dog", "rail"]
    texts = POOL + [" ".join(rng.choice(filler, size=8)) + ". Ride the rail often." for _ in range(30)]
    return bag_of_words_index(tmp_path, texts)


def test_batched_signals_equal_one_question_at_a_time(bag_index):
    searcher, encoder = bag_index
    retriever = Retriever(searcher, encoder, None, TEN)
    batched = retriever.retrieve_many(QUESTIONS)
    for (question, context), got in zip(QUESTIONS, batched):
        signals, ranked = one_at_a_time(Retriever(searcher, encoder, None, TEN), question, context)
        assert_same_signals(got.signals, signals, tol=0.0)
        assert [c.chunk_id for c in got.ranked] == ranked
    assert any(0 < r.signals["concept_coverage"] < 1 for r in batched)  # the signals are not trivial here


@pytest.mark.parametrize("wanted", [{"cosine_top"}, {"answer_support", "rerank_top"}, {"sentence_cosine"}])
def test_a_retriever_asked_for_some_signals_computes_those_as_with_every_signal(bag_index, wanted):
    """Serving asks for the decision's signals: each is what a night computes, and the texts of the top passages
    are encoded only for a signal that reads them."""
    searcher, encoder = bag_index
    every = Retriever(searcher, encoder, None, TEN, answer_scorer=ReadPassages()).retrieve_many(QUESTIONS)
    some = Retriever(searcher, encoder, None, TEN, answer_scorer=ReadPassages(), wanted=frozenset(wanted))
    for full, got in zip(every, some.retrieve_many(QUESTIONS)):
        assert wanted <= set(got.signals) and got.signals == {k: full.signals[k] for k in got.signals}
        assert [c.chunk_id for c in got.ranked] == [c.chunk_id for c in full.ranked]
    encodes = "sentence_cosine" in wanted  # otherwise the questions' own vectors alone
    assert (some.text_vectors.computed > len(QUESTIONS)) == encodes
    assert ("answer_support" in got.signals) == ("answer_support" in wanted)


class ReadPassages:
    """Records the passages an answer scorer is given; scores each by its length (a unit test of the wiring:
    the real model's scores are tested in test_answer_support.py)."""

    def __init__(self):
        self.read: list[list[str]] = []

    def score(self, query: str, passages: list[str]) -> list[tuple[int, float]]:
        self.read.append(passages)
        return [(i, len(p) / 100) for i, p in enumerate(passages)]


@pytest.mark.parametrize("window", [1, 3, 7])
def test_answer_support_reads_the_configured_window_of_the_fused_top(bag_index, window):
    searcher, encoder = bag_index
    scorer = ReadPassages()
    retriever = Retriever(searcher, encoder, None, TEN, answer_scorer=scorer, answer_passages=window)
    (got,) = retriever.retrieve_many(QUESTIONS[:1])
    assert scorer.read == [[c.text for c in got.fused[:window]]]
    assert got.signals["answer_support"] == max(answer_support(scorer, "", [t]) for t in scorer.read[0])


class SlowScorer(ReadPassages):
    """An answer scorer that takes at least PAUSE seconds a call: its time must be booked to the answer stage."""

    PAUSE = 0.05

    def score(self, query: str, passages: list[str]) -> list[tuple[int, float]]:
        time.sleep(self.PAUSE)
        return super().score(query, passages)


def test_the_answer_models_seconds_are_a_stage_of_their_own_and_a_night_adds_them_up(bag_index):
    searcher, encoder = bag_index
    retriever = Retriever(searcher, encoder, None, TEN, answer_scorer=SlowScorer(), answer_passages=3)
    items = [{"id": f"q{i}", "question": q, "context": c, "label": "answer"} for i, (q, c) in enumerate(QUESTIONS)]
    stages = Counter()
    records = run_questions(retriever, items, stages=stages)
    assert len(records) == len(QUESTIONS)
    assert set(stages) == {"embed", "search", "rerank", "signals", "answer"}
    assert min(stages.values()) >= 0
    # a lower bound only (sleep never returns early): the scorer's pauses are in `answer`, none is lost
    assert stages["answer"] >= SlowScorer.PAUSE * len(QUESTIONS)


def signals_by_question(retriever: Retriever, questions, batch: int) -> dict:
    out = {}
    for start in range(0, len(questions), batch):
        part = questions[start : start + batch]
        out.update({q: r.signals for (q, _), r in zip(part, retriever.retrieve_many(part))})
    return out


def check_order_and_batch_free(make_retriever, questions) -> None:
    reference = signals_by_question(make_retriever(), questions, len(questions))
    shared = make_retriever()  # one memo across the orders below: vectors come from other batches
    for order, batch in [(questions[::-1], len(questions)), (questions, 1), (questions[1::2] + questions[::2], 3)]:
        for retriever in (make_retriever(), shared):
            assert signals_by_question(retriever, order, batch) == reference


def test_signals_do_not_depend_on_question_order_or_batch(bag_index):
    searcher, encoder = bag_index
    check_order_and_batch_free(lambda: Retriever(searcher, encoder, None, TEN), QUESTIONS)


class FingerprintedBag(BagOfWords):
    dimension = BagOfWords.dim

    def __init__(self, fingerprint="sha256:bag"):
        self.fingerprint, self.calls = fingerprint, 0

    def encode(self, texts):
        self.calls += len(texts)
        return super().encode(texts)


def test_text_vectors_are_kept_across_nights_under_their_fingerprint(tmp_path, caplog):
    texts = ["bicycle", "Seniors ride free on weekdays.", "Can I bring my bike?"]
    first = TextVectors(FingerprintedBag())
    fresh = first(texts)
    assert first.save_kept(tmp_path / "tv.parquet") == 3

    again = FingerprintedBag()
    second = TextVectors(again)
    assert second.load_kept(tmp_path / "tv.parquet") == 3
    assert np.array_equal(second(texts), fresh) and again.calls == 0  # nothing encoded the next night
    second(["a new sentence here"])
    assert again.calls == 1 and second.computed == 1

    other = TextVectors(FingerprintedBag("sha256:other-model"))
    assert other.load_kept(tmp_path / "tv.parquet") == 0  # another model's vectors are never reused

    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with caplog.at_level(logging.WARNING):
        assert TextVectors(FingerprintedBag()).load_kept(tmp_path / "bad.parquet") == 0
    assert "unreadable" in caplog.text
    assert TextVectors(FingerprintedBag()).load_kept(tmp_path / "missing.parquet") == 0


def test_another_models_kept_rows_are_skipped_whatever_their_width_and_a_wrong_width_is_logged(tmp_path, caplog):
    from sourcegate.pipelines.retrieval import kept

    path = tmp_path / "pairs.parquet"
    kept.save(path, "sha256:one-model", {"k": np.array([0.5])}, 1, np.float64)
    with caplog.at_level(logging.WARNING):
        assert kept.load(path, "sha256:an-ensemble", 3, np.float64) == {}  # not its rows: nothing to say
        assert not caplog.text
        assert kept.load(path, "sha256:one-model", 3, np.float64) == {}  # its rows, another width: said
    assert "holds rows of 1 values, not 3" in caplog.text
    assert kept.load(path, "sha256:one-model", 1, np.float64)["k"].tolist() == [0.5]


def demo_questions(every: int = 5) -> list[tuple[str, list[str]]]:
    """Every `every`-th question of the passing fixture's whole fit set (both labels, the multi-turn ones too;
    the night fixtures read a sample of it): fixed inputs."""
    items = load_evalset(ROOT / WHOLE_FIT)
    return [(it["question"], it.get("context", [])) for it in items[::every]]


@pytest.mark.models
def test_batched_signals_equal_one_at_a_time_on_the_demo_with_the_real_models(demo_index, embedder, cross_encoder):
    """The shipped models (bf16 bi-encoder, INT8 cross-encoder) on the demo: the batched, memoised
    evaluation gives every question the signals and order of the old per-question path."""
    cfg, _, searcher = demo_index
    questions = demo_questions()
    assert any(context for _, context in questions)
    retriever = Retriever.from_config(searcher, embedder, cross_encoder, cfg)
    batched = retriever.retrieve_many(questions)
    for (question, context), got in zip(questions, batched):
        signals, ranked = one_at_a_time(retriever, question, context)
        assert_same_signals(got.signals, signals)
        assert [c.chunk_id for c in got.ranked] == ranked
    check_order_and_batch_free(lambda: Retriever.from_config(searcher, embedder, cross_encoder, cfg), questions[:12])


@pytest.mark.models
def test_rerank_logits_are_kept_across_nights_exactly(tmp_path):
    """The INT8 cross-encoder scores one pair per run, so a kept logit is the fresh one, bit for bit."""
    from sourcegate.pipelines.retrieval.rerank import OnnxCrossEncoder

    passages = POOL[:3]
    tonight = OnnxCrossEncoder()
    fresh = tonight.score("Do seniors ride free?", passages)
    assert tonight.computed == 3 and tonight.save_kept(tmp_path / "pairs.parquet") == 3

    next_night = OnnxCrossEncoder()
    assert next_night.load_kept(tmp_path / "pairs.parquet") == 3
    assert next_night.score("Do seniors ride free?", passages) == fresh and next_night.computed == 0
    assert next_night.score("Are pets allowed?", passages[:1]) and next_night.computed == 1

    other = OnnxCrossEncoder()
    other.folder = tmp_path  # another model's files: another fingerprint
    (tmp_path / "model.onnx").write_bytes(b"other weights")
    assert other.load_kept(tmp_path / "pairs.parquet") == 0
