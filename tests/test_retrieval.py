import pytest

from sourcegate.evals.answer_modes import mode_bands
from sourcegate.pipelines.config import Answer
from sourcegate.pipelines.retrieval.answer import decide
from sourcegate.pipelines.retrieval.rerank import load_scorer
from sourcegate.pipelines.retrieval.retriever import (
    Candidate,
    Retrieval,
    Retriever,
    blend,
    effective_query,
    margin,
    rrf,
    term_coverage,
)
from sourcegate.pipelines.search.base import Hit


def test_rrf_sums_reciprocal_ranks_over_the_union():
    fused = dict(rrf([[Hit("a", 9), Hit("b", 8)], [Hit("b", 0.9), Hit("c", 0.8)]], k=60))
    assert fused == pytest.approx({"b": 1 / 62 + 1 / 61, "a": 1 / 61, "c": 1 / 62})
    assert [cid for cid, _ in rrf([[Hit("a", 9), Hit("b", 8)], [Hit("b", 0.9), Hit("c", 0.8)]])] == ["b", "a", "c"]


def test_blend_weighs_cross_encoder_against_fusion():
    logits = [0.0, 2.0, 1.9]  # the cross-encoder slightly prefers 1 over 2
    fused = [0.05, 0.01, 0.04]  # fusion strongly prefers 2 over 1 (and 0 over both)
    assert blend(logits, fused, 1.0) == [1, 2, 0]
    assert blend(logits, fused, 0.0) == [0, 2, 1]
    assert blend(logits, fused, 0.6) == [2, 1, 0]  # 0.6*0.95 + 0.4*0.75 = 0.87 beats 0.6*1 + 0.4*0 = 0.6
    assert blend([1.0, 1.0], [0.5, 0.5], 0.5) == [0, 1]  # ties keep the fused rank
    assert blend([], [], 0.6) == []


def test_multi_turn_prepends_prior_turns():
    assert (
        effective_query("does that apply on Sundays?", ["Is the night bus free?"])
        == "Is the night bus free? does that apply on Sundays?"
    )


def test_a_long_history_keeps_its_newest_words_and_never_pushes_the_question_out():
    """The models read a query's first 256 tokens and the turns come first: a whole transcript sent as context would
    leave the question unread. Its newest CONTEXT_WORDS words are kept; a history within that is as it always was."""
    from sourcegate.pipelines.retrieval.retriever import CONTEXT_WORDS

    transcript = [f"turn {i}: " + "we talked about the airport line and its fares " * 4 for i in range(20)]
    query = effective_query("and on Sundays?", transcript)
    assert query.endswith(" and on Sundays?") and len(query.split()) == CONTEXT_WORDS + 3
    assert query.split()[:CONTEXT_WORDS] == " ".join(transcript).split()[-CONTEXT_WORDS:]
    short = ["Is the  night bus\nfree?", "  ", "From the airport?"]  # spacing within the bound is kept as sent
    assert effective_query("And Sundays?", short) == "Is the  night bus\nfree? From the airport? And Sundays?"


def test_term_coverage_and_margin():
    assert term_coverage("How much is the bus fare?", "Bus fare: $2") == pytest.approx(2 / 3)  # much, bus, fare
    assert margin([0.8, 0.2]) == pytest.approx(0.75) and margin([0.5]) == 1.0 and margin([]) == 0.0


def cand(i, p):
    return Candidate(f"c{i}", "d", "t", "s", "s", "x", fused_rank=i, fused_score=1 / (60 + i), rerank_probability=p)


@pytest.mark.parametrize(
    "value, mode", [(0.9, "sourced"), (0.5, "sourced"), (0.3, "adjacent"), (0.05, "decline"), (None, "decline")]
)
def test_answer_modes_from_thresholds(value, mode):
    r = Retrieval(
        "q", [], [cand(i, p) for i, p in enumerate([0.9, 0.6, 0.2, 0.1, 0.01], 1)], True, {"rerank_top": value}
    )
    a = decide(r, Answer(signal="rerank_top", strong=0.5, adjacent=0.1, below="decline"))
    assert a.mode == mode
    if mode == "decline":
        assert [c.chunk_id for c in a.passages] == ["c1", "c2", "c3"]  # the three closest, to check a refusal
    elif mode == "sourced":  # half of 0.5: 0.2, 0.1 and 0.01 are noise
        assert [c.chunk_id for c in a.passages] == ["c1", "c2"] and a.dropped_as_noise == 3


def test_open_mode_is_configurable():
    r = Retrieval("q", [], [cand(1, 0.01)], True, {"rerank_top": 0.01})
    assert decide(r, Answer(signal="rerank_top", strong=0.5, adjacent=0.1, below="open")).mode == "open"


TWO_SIGNALS = Answer(signal="cosine_top", adjacent=0.4, strong_signal="rerank_top", strong=0.5)


@pytest.mark.parametrize(
    "cosine, rerank, mode, decided_by",
    [
        (0.7, 0.9, "sourced", "rerank_top"),  # kept by the bi-encoder, sure by the cross-encoder
        (0.4, 0.5, "sourced", "rerank_top"),  # both thresholds are inclusive
        (0.7, 0.01, "adjacent", "cosine_top"),  # kept, but the cross-encoder is unsure: closest sources, flagged
        (0.39, 0.99, "decline", "cosine_top"),  # decline rests on the gating signal alone
        (None, 0.99, "decline", "cosine_top"),  # a missing gating signal is no source
        (0.7, None, "adjacent", "cosine_top"),  # no cross-encoder: never sourced
    ],
)
def test_each_answer_mode_rests_on_its_own_signal(cosine, rerank, mode, decided_by):
    r = Retrieval("q", [], [cand(1, 0.9)], True, {"cosine_top": cosine, "rerank_top": rerank})
    a = decide(r, TWO_SIGNALS)
    assert (a.mode, a.signal) == (mode, decided_by)
    assert a.value == {"cosine_top": cosine, "rerank_top": rerank}[decided_by]


def test_thresholds_on_two_scales_need_not_be_ordered():
    Answer(signal="cosine_top", adjacent=0.6, strong_signal="rerank_top", strong=0.1)  # different scales: fine
    with pytest.raises(ValueError, match="adjacent must be <= answer.strong"):
        Answer(signal="rerank_top", adjacent=0.6, strong=0.1)


def test_mode_bands_count_each_kind_per_mode():
    rows = [
        {"label": "answer", "kind": "single", "signals": {"cosine_top": 0.7, "rerank_top": 0.9}},
        {"label": "answer", "kind": "single", "signals": {"cosine_top": 0.5, "rerank_top": 0.1}},
        {"label": "decline", "kind": "off_topic", "signals": {"cosine_top": 0.2, "rerank_top": 0.9}},
        {"label": "decline", "kind": "off_topic", "signals": {"cosine_top": 0.45, "rerank_top": 0.0}},
    ]
    none = {"sourced": 0, "adjacent": 0, "decline": 0, "open": 0}
    assert mode_bands(rows, TWO_SIGNALS.model_dump()) == {
        "answer/single": {**none, "sourced": 1, "adjacent": 1},
        "decline/off_topic": {**none, "adjacent": 1, "decline": 1},
    }
    assert mode_bands(rows, TWO_SIGNALS) == mode_bands(rows, TWO_SIGNALS.model_dump())  # config or its artifact


@pytest.mark.models
def test_labelled_article_is_in_the_rerank_shortlist(demo_index, embedder, cross_encoder):
    """The labelled article is among the reranker's 12 candidates for >= 90% of should-answer questions."""
    from sourcegate.evals.evalset import load_evalset

    cfg, _, searcher = demo_index
    retriever = Retriever.from_config(searcher, embedder, cross_encoder, cfg)
    items = [it for it in load_evalset(cfg.evals.calibration_set) if it["label"] == "answer"]
    hits, missed = 0, []
    for it in items:
        r = retriever.retrieve(it["question"], it["context"])
        assert r.reranked
        head = r.fused[:12]
        reranked_head = r.ranked[:12]
        assert sorted(c.chunk_id for c in reranked_head) == sorted(c.chunk_id for c in head)  # no drop, no dup
        docs = {e.split("#")[0] for e in it["expected"]}
        if any(c.doc_id in docs for c in head):
            hits += 1
        else:
            missed.append(it["id"])
    recall = hits / len(items)
    print(f"shortlist recall@12: {recall:.3f} over {len(items)} questions; missed {missed}")
    assert recall >= 0.9


@pytest.mark.models
def test_bogus_reranker_path_keeps_fused_order_without_error(demo_index, embedder, caplog):
    cfg, _, searcher = demo_index
    bogus = load_scorer("onnx", "/definitely/not/a/model")
    assert bogus is None and "could not load" in caplog.text
    plain = Retriever.from_config(searcher, embedder, None, cfg)
    failing = Retriever.from_config(searcher, embedder, bogus, cfg)
    for q in ["How much is a monthly pass?", "Can I bring my bike on the train?"]:
        a, b = plain.retrieve(q), failing.retrieve(q)
        assert not b.reranked
        assert [c.chunk_id for c in b.ranked] == [c.chunk_id for c in b.fused] == [c.chunk_id for c in a.fused]
        # reranker-based signals are missing, never replaced by fused scores (the combiner reads
        # rerank_top, so its score is missing too); the others are unchanged
        reranker_based = ("rerank_top", "margin", "answerability")
        assert a.signals["answer_support"] is None  # no answer model given: missing, never invented
        assert all(b.signals[k] is None for k in reranker_based)
        assert {k: v for k, v in b.signals.items() if k not in reranker_based} == {
            k: v for k, v in a.signals.items() if k not in reranker_based
        }


@pytest.mark.models
def test_rerank_weight_zero_keeps_fused_order_and_signals(demo_index, embedder, cross_encoder):
    """The weight moves only the order; the cross-encoder's signals are the same at any weight."""
    cfg, _, searcher = demo_index
    full = Retriever.from_config(searcher, embedder, cross_encoder, cfg)
    none = Retriever.from_config(searcher, embedder, cross_encoder, cfg, rerank_weight=0.0)
    moved = 0
    for q in ["How much is a monthly pass?", "Can I bring my bike on the train?", "lost property office hours"]:
        a, b = full.retrieve(q), none.retrieve(q)
        assert a.reranked and b.reranked
        assert [c.chunk_id for c in b.ranked] == [c.chunk_id for c in b.fused]
        assert a.signals["rerank_top"] == b.signals["rerank_top"] and a.signals["margin"] == b.signals["margin"]
        moved += [c.chunk_id for c in a.ranked] != [c.chunk_id for c in a.fused]
    assert moved  # at weight 1 the cross-encoder does reorder


CORE_SIGNALS = ("cosine_top", "rerank_top", "bm25_top", "bm25_z", "term_coverage", "margin")


@pytest.mark.models
def test_every_signal_is_identical_at_any_rerank_weight(demo_index, embedder, cross_encoder, answer_model):
    """G7: rerank_weight moves the final order, never a signal."""
    cfg, _, searcher = demo_index
    retrievers = [
        Retriever.from_config(searcher, embedder, cross_encoder, cfg, answer_model, rerank_weight=w)
        for w in (0.0, 0.6, 1.0)
    ]
    orders = set()
    for q in ["How much is a monthly pass?", "Can I bring my bike on the train?", "What is the capital of France?"]:
        runs = [r.retrieve(q) for r in retrievers]
        assert all(run.reranked for run in runs)
        # every signal, the answerability ones included (they read the fused top, not the final order)
        assert set(CORE_SIGNALS) <= set(runs[0].signals)
        assert 0.0 < runs[0].signals["answerability"] < 1.0  # the accepted combiner's probability
        assert 0.0 < runs[0].signals["answer_support"] < 1.0  # the answer model over the fused top 3
        assert runs[0].signals == runs[1].signals == runs[2].signals
        orders |= {tuple(c.chunk_id for c in run.ranked) for run in runs}
    assert len(orders) > 3  # the weights did change some final order, so the test can fail
