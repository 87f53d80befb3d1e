"""The answer-support model and its signal (sourcegate/pipelines/retrieval/answer_support.py, sourcegate/pipelines/training/)."""

import json
import math
import shutil

import pyarrow.parquet as pq
import pytest

from sourcegate.pipelines.retrieval.answer_support import SHIPPED, answer_support
from sourcegate.pipelines.training import base_model, squad
from sourcegate.pipelines.versions.manifest import sha256_file

ROOT = SHIPPED.parents[1]

RECIPE = json.loads((SHIPPED / "recipe.json").read_text(encoding="utf-8"))


class Logits:
    """A stand-in scorer (the reranker's interface): fixed logits per passage, and what it was asked."""

    def __init__(self, logits):
        self.logits, self.asked = logits, []

    def score(self, query, passages):
        self.asked.append((query, list(passages)))
        return [(i, self.logits[p]) for i, p in enumerate(passages)]


def test_the_shipped_files_are_the_ones_the_recipe_recorded():
    assert sha256_file(SHIPPED / "model.onnx") == RECIPE["onnx_sha256"]
    assert sha256_file(SHIPPED / "tokenizer.json") == RECIPE["tokenizer_sha256"]
    assert (SHIPPED / "model.onnx").stat().st_size <= 30 * 2**20  # committed: at most 30 MB
    assert RECIPE["data"]["json_sha256"] == squad.SQUAD_DEV_JSON_SHA256


def test_answer_support_is_the_highest_probability_over_the_passages():
    scorer = Logits({"a": -2.0, "b": 1.0, "c": 0.0})
    assert answer_support(scorer, "q", ["a", "b", "c"]) == pytest.approx(1 / (1 + math.exp(-1.0)))
    assert scorer.asked == [("q", ["a", "b", "c"])]
    assert answer_support(Logits({"a": -2.0}), "q", ["a"]) == pytest.approx(0.11920292202)


def test_answer_support_is_missing_not_invented_without_a_model_or_passages():
    assert answer_support(None, "q", ["a"]) is None
    assert answer_support(Logits({}), "q", []) is None


def test_an_ensemble_scores_the_mean_of_its_members_best_logits():
    class Ensemble:
        members = [Logits({"a": -2.0, "b": 1.0}), Logits({"a": 3.0, "b": -5.0})]

    # member bests 1.0 (b) and 3.0 (a): mean 2.0, not the best of the passages' mean logits (0.5, for a)
    assert answer_support(Ensemble(), "q", ["a", "b"]) == pytest.approx(1 / (1 + math.exp(-2.0)))


def test_the_same_passages_in_any_order_give_the_same_value():
    scorer = Logits({"a": -2.0, "b": 1.0, "c": 0.0})
    assert answer_support(scorer, "q", ["c", "b", "a"]) == answer_support(scorer, "q", ["a", "b", "c"])


SQUAD = {
    "data": [
        {
            "title": f"T{i:02d}",
            "paragraphs": [
                {
                    "context": f"paragraph {i}.{j}",
                    "qas": [
                        {"question": f"q{i}.{j}", "is_impossible": False},
                        {"question": f"u{i}.{j}", "is_impossible": True},
                    ],
                }
                for j in range(2)
            ],
        }
        for i in range(35)
    ]
}


def test_the_split_is_by_article_and_the_pairs_of_each_kind_are_made_as_the_recipe_says():
    train, held = squad.split_articles(SQUAD)
    assert len(train) == 25 and len(held) == 10 and not set(train) & set(held)
    assert squad.split_articles(SQUAD) == (train, held)  # seeded
    pairs = squad.make_pairs_typed(squad.articles_by_title(SQUAD, held), 13)
    assert {p[0] for p in pairs} <= {f"{k}{t[1:].lstrip('0') or '0'}.{j}" for t in held for k in "qu" for j in (0, 1)}
    kinds = [p[3] for p in pairs]
    assert kinds.count("answerable_own") == kinds.count("near_topic") == kinds.count("unanswerable_own") == 20
    for q, passage, label, kind in pairs:
        own = passage == f"paragraph {q[1:]}"
        assert (label, own) == {"answerable_own": (1, True), "unanswerable_own": (0, True), "near_topic": (0, False)}[
            kind
        ]


@pytest.mark.models
def test_the_shipped_model_tells_an_answering_passage_from_a_related_one_exactly_and_in_any_order():
    from sourcegate.pipelines.retrieval.answer_support import load_answer_model

    model = load_answer_model()
    question = "Can I bring my bike on the light rail?"
    answers = "Bikes are allowed on light rail at all hours. Hang your bike on one of the four hooks."
    related = "Light rail trains run every 10 minutes between Central Station and Eastgate."
    one = answer_support(model, question, [answers, related])
    assert one > answer_support(model, question, [related])
    assert answer_support(model, question, [related, answers]) == one  # one pair per run: order-free, exact
    assert model.fingerprint.startswith("sha256:")


@pytest.mark.models
def test_the_trainable_base_reproduces_the_packaged_cross_encoder(tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from sourcegate.pipelines.retrieval.rerank import OnnxCrossEncoder

    folder = base_model.packaged_base(tmp_path / "base")
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    onnx = OnnxCrossEncoder()
    pairs = [
        ("bike on train??", "Bikes are allowed on all trains except during rush hour on weekdays."),
        ("what is the capital of france", "Bikes are allowed on all trains except during rush hour on weekdays."),
    ]
    with torch.no_grad():
        for q, p in pairs:
            torch_logit = float(model(**tokenizer(q, p, return_tensors="pt")).logits[0, 0])
            assert torch_logit == pytest.approx(onnx.logit(q, p), abs=0.2)  # INT8 activations vs float


IN_DOMAIN = SHIPPED.parent / "answer_in_domain"


def test_the_in_domain_ensemble_members_are_the_files_their_recipes_recorded():
    spec = json.loads((IN_DOMAIN / "ensemble.json").read_text(encoding="utf-8"))
    assert spec["members"] == ["seed-13"]  # one member of the three trained (docs/decisions/0009)
    for name, seed in zip(spec["members"], (13,)):
        recipe = json.loads((IN_DOMAIN / name / "recipe.json").read_text(encoding="utf-8"))
        assert sha256_file(IN_DOMAIN / name / "model.onnx") == recipe["onnx_sha256"]
        assert recipe["hyperparameters"]["seed"] == seed and recipe["command"].endswith(f"--seed {seed}")


@pytest.mark.models
def test_an_ensemble_is_its_members_mean_and_keeps_its_logits_across_nights(tmp_path):
    """Two different answer models (the shipped in-domain member and the SQuAD-trained one) read as one."""
    from sourcegate.pipelines.retrieval.answer_support import (
        AnswerEnsemble,
        AnswerSupportModel,
        load_answer_model,
        write_ensemble,
    )

    folder = tmp_path / "ensemble"
    shutil.copytree(IN_DOMAIN / "seed-13", folder / "in-domain")
    shutil.copytree(SHIPPED, folder / "squad")
    write_ensemble(folder, ["in-domain", "squad"])
    ensemble = load_answer_model(folder)
    assert isinstance(ensemble, AnswerEnsemble) and len(ensemble.members) == 2
    assert ensemble.model_id.startswith("mean of 2: answer support cross-encoder trained on this corpus")
    assert str(folder / "squad") in ensemble.model_id
    members = [AnswerSupportModel(folder / name) for name in ("in-domain", "squad")]
    assert ensemble.trained_on == frozenset().union(*(m.trained_on for m in members)) and ensemble.trained_on
    assert ensemble.fingerprint != members[0].fingerprint
    question = "Can the driver ask for my service dog's papers?"
    passages = ["Staff may not ask for medical documents or identification for the animal.", "Buses run hourly."]
    got = answer_support(ensemble, question, passages)
    logits = [math.log(p / (1 - p)) for p in (answer_support(m, question, passages) for m in members)]
    assert logits[0] != pytest.approx(logits[1], abs=1e-3)  # two models, two opinions: the mean is not either
    assert math.log(got / (1 - got)) == pytest.approx(sum(logits) / 2, abs=1e-9)
    assert ensemble.save_kept(tmp_path / "answer_pairs.parquet") == 2  # both pairs, a logit per member
    again = load_answer_model(folder)
    assert again.load_kept(tmp_path / "answer_pairs.parquet") == 2
    assert answer_support(again, question, passages) == got and again.computed == 0  # read, not run again


def test_the_in_domain_ensemble_records_the_demo_corpus_it_learned(tmp_path):
    from sourcegate.pipelines.build.ingest import ingest
    from sourcegate.pipelines.retrieval import learned_corpus

    learned = learned_corpus.read(IN_DOMAIN)
    docs = pq.read_table(ingest(ROOT / "corpus" / "demo", tmp_path).documents, columns=["doc_id"])["doc_id"]
    assert {key.split("#", 1)[0] for key in learned["sections"]} == set(docs.to_pylist())
    assert len(learned["chunks"]) == len(learned["sections"]) and "written after training" in learned["note"]
