"""sourcegate.evals.metrics against ranx on random runs and qrels (seeded)."""

import math
import os

# ranx is only the oracle here: its numba kernels, run as plain Python, give the same numbers on
# inputs this small without the ~20 s JIT start-up (numba reads this when first imported).
os.environ.setdefault("NUMBA_DISABLE_JIT", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from ranx import Qrels, Run, evaluate  # noqa: E402

from sourcegate.evals.metrics import first_relevant_rank, mrr, ndcg_at, precision_at, recall_at

KS = (1, 3, 5, 10, 20)
pytestmark = pytest.mark.filterwarnings("ignore:unsafe cast")  # inside ranx's numba kernels


def random_case(seed: int, graded: bool):
    """Random qrels/run with short runs, unretrieved relevant docs, duplicates-free ranks."""
    rng = np.random.default_rng(seed)
    docs = [f"d{i}" for i in range(60)]
    qrels, run = {}, {}
    for q in range(40):
        qid = f"q{q}"
        judged = rng.choice(docs, size=rng.integers(1, 12), replace=False)
        rels = rng.integers(1, 4, size=len(judged)) if graded else np.ones(len(judged), int)
        rels[rng.random(len(judged)) < 0.2] = 0  # judged non-relevant
        rels[0] = max(rels[0], 1)  # ranx needs a relevant doc per query
        qrels[qid] = {str(d): int(r) for d, r in zip(judged, rels)}
        depth = int(rng.integers(1, 25))  # often shorter than k
        pool = docs if q % 4 else [d for d in docs if d not in qrels[qid]]  # some: nothing relevant retrieved
        run[qid] = [str(d) for d in rng.choice(pool, size=min(depth, len(pool)), replace=False)]
    return qrels, run


def ranx_scores(qrels, run, metrics):
    ranx_run = Run({q: {d: float(len(ds) - i) for i, d in enumerate(ds)} for q, ds in run.items()})
    evaluate(Qrels(qrels), ranx_run, metrics, make_comparable=True)
    return ranx_run.scores


@pytest.mark.parametrize("graded", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_ranx(seed, graded):
    qrels, run = random_case(seed, graded)
    names = [f"{m}@{k}" for m in ("precision", "recall", "ndcg") for k in KS] + ["mrr", "mrr@5"]
    expected = ranx_scores(qrels, run, names)
    ours = {f"precision@{k}": precision_at(run, qrels, k) for k in KS}
    ours |= {f"recall@{k}": recall_at(run, qrels, k) for k in KS}
    ours |= {f"ndcg@{k}": ndcg_at(run, qrels, k) for k in KS}
    ours |= {"mrr": mrr(run, qrels), "mrr@5": mrr(run, qrels, 5)}
    for name in names:
        for qid in qrels:
            assert ours[name]["per_query"][qid] == pytest.approx(expected[name][qid], abs=1e-9), (name, qid)
        mean = np.mean([expected[name][q] for q in qrels])
        assert ours[name]["mean"] == pytest.approx(mean, abs=1e-9), name


def test_query_missing_from_run_scores_zero():
    qrels = {"q1": {"a": 1}, "q2": {"b": 2}}
    run = {"q1": ["a"], "q3": ["b"]}  # q2 not run, q3 not judged
    assert precision_at(run, qrels, 1)["per_query"] == {"q1": 1.0, "q2": 0.0}
    assert mrr(run, qrels)["mean"] == 0.5
    expected = ranx_scores(qrels, {"q1": ["a"]}, ["precision@1", "mrr"])
    assert expected["precision@1"]["q2"] == 0.0 and expected["mrr"]["q2"] == 0.0


def test_hand_computed():
    qrels = {"q": {"a": 3, "b": 0, "c": 1}}
    run = {"q": ["x", "c", "b", "a"]}
    assert precision_at(run, qrels, 3)["mean"] == pytest.approx(1 / 3)
    assert precision_at(run, qrels, 10)["mean"] == pytest.approx(2 / 10)  # short run divides by k
    assert recall_at(run, qrels, 2)["mean"] == pytest.approx(1 / 2)
    assert mrr(run, qrels)["mean"] == pytest.approx(1 / 2)
    assert mrr(run, qrels, k=1)["mean"] == 0.0
    dcg = 1 / math.log2(3) + 3 / math.log2(5)
    ideal = 3 / math.log2(2) + 1 / math.log2(3)
    assert ndcg_at(run, qrels, 4)["mean"] == pytest.approx(dcg / ideal)
    assert first_relevant_rank(run["q"], qrels["q"]) == 2
    assert first_relevant_rank(["x", "b"], qrels["q"]) is None


def test_repeated_document_counts_once():
    qrels = {"q": {"a": 1}}
    assert precision_at({"q": ["a", "a"]}, qrels, 2)["mean"] == 0.5


# --------------------------------------------------------------------------- precision_eval

from sourcegate.evals.precision import precision_eval  # noqa: E402


def test_precision_eval_lists_losses_honestly():
    items = [
        {"id": "q1", "kind": "fact", "question": "won"},
        {"id": "q2", "kind": "fact", "question": "lost"},
        {"id": "q3", "kind": "howto"},
        {"id": "q4", "kind": "howto"},
        {"id": "q5", "kind": "howto"},
    ]
    qrels = {"q1": {"r": 1}, "q2": {"r": 2}, "q3": {"r": 1}, "q4": {"r": 0}, "q5": {"r": 1}}
    fused = {"q1": ["x", "r"], "q2": ["r", "x"], "q3": ["r"], "q4": ["r"], "q5": ["r", "x"]}
    reranked = {"q1": ["r", "x"], "q2": ["x", "r"], "q3": ["r"], "q4": ["r"], "q5": ["x"]}
    out = precision_eval(items, fused, reranked, qrels)
    assert out["skipped"] == ["q4"] and out["n"] == 4  # nothing relevant to find
    assert out["wins"] == 1 and out["ties"] == 1
    assert out["losses"] == [
        {
            "id": "q2",
            "kind": "fact",
            "question": "lost",
            "fused_rank_of_first_relevant": 1,
            "reranked_rank_of_first_relevant": 2,
        },
        {
            "id": "q5",
            "kind": "howto",
            "question": "",
            "fused_rank_of_first_relevant": 1,
            "reranked_rank_of_first_relevant": None,
        },
    ]
    overall = out["overall"]
    assert overall["fused"]["p@1"] == 0.75 and overall["reranked"]["p@1"] == 0.5
    assert overall["delta"]["p@1"] == -0.25
    assert overall["fused"]["mrr"] == pytest.approx((0.5 + 1 + 1 + 1) / 4)
    assert set(out["by_kind"]) == {"fact", "howto"}
    assert out["by_kind"]["howto"]["n"] == 2
    assert out["by_kind"]["howto"]["reranked"]["p@1"] == 0.5
    assert set(overall["fused"]) == {"p@1", "p@3", "p@5", "ndcg@10", "recall@5", "mrr"}
