"""`sourcegate train-in-domain` with the real cross-encoder: a model trained on a corpus's labelled questions
ships like the answer-support model, records what it saw, and a night judged on a question it saw fails."""

import json
import math
from pathlib import Path

import pytest

from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.evals.evalset import load_evalset, question_key
from sourcegate.pipelines.versions.manifest import sha256_file
from tests.promotable import promotable_config

ROOT = Path(__file__).resolve().parents[1]

RIDERS = "config/evals/riders.jsonl"


def lines(items: list[dict]) -> str:
    return "".join(json.dumps(q) + "\n" for q in items)


def first_of_riders(n: int) -> list[dict]:
    """The first `n` should-answer and first `n` off-topic questions of riders.jsonl: a tiny training set."""
    riders = load_evalset(RIDERS)
    return [q for q in riders if q["label"] == "answer"][:n] + [q for q in riders if q["kind"] == "off_topic"][:n]


@pytest.mark.models
def test_a_model_trained_in_domain_loads_records_its_questions_and_fails_a_night_judged_on_one(demo_index, tmp_path):
    from sourcegate.evals.harness import evaluate, gate_for_dir
    from sourcegate.pipelines.app.factories import answer_scorer_for, judging, retriever_for
    from sourcegate.pipelines.retrieval.answer_support import AnswerSupportModel
    from sourcegate.pipelines.training.in_domain import export, fused_tops, train_in_domain

    cfg, run_id, searcher = demo_index
    riders = load_evalset(RIDERS)
    train = first_of_riders(3)
    train_path = tmp_path / "train.jsonl"
    left_out = {[q for q in riders if q["label"] == "answer"][3]["id"]: "~ a fit question (0.90)"}
    train_path.write_text(lines(train + [q for q in riders if q["id"] in left_out]))
    index = RunFolder(cfg.artifacts, run_id).path
    retriever, _ = retriever_for(cfg, searcher)
    out = tmp_path / "model"
    recipe = train_in_domain(
        retriever, str(index), [str(train_path)], out, tmp_path / "work", epochs=1, left_out=left_out
    )

    assert recipe["trained_on"] == sorted(question_key(q) for q in train) and recipe["left_out"] == left_out
    assert recipe["hyperparameters"]["seed"] == 13 and recipe["command"].endswith("--seed 13")
    assert recipe["data"] == [{"path": str(train_path), "sha256": sha256_file(train_path)}]
    assert recipe["pairs"]["negative"] == 9 and 1 <= recipe["pairs"]["positive"] <= 6  # 3 passages per decline
    assert recipe["answer_passages"] == retriever.answer_passages == cfg.answerability.answer_passages == 3
    assert recipe["onnx_sha256"] == sha256_file(out / "model.onnx")
    model = answer_scorer_for(str(out))  # the shipped loader joins the shared embedding table back
    assert model is not None and model.trained_on == frozenset(recipe["trained_on"])
    assert model.fingerprint != answer_scorer_for(None).fingerprint
    assert recipe["export"]["bytes"] <= 30 * 2**20 and "per_channel=True" in recipe["export"]["quantization"]
    # the whole fp32 export of the same checkpoint loads too, reading no shared table
    whole = export(tmp_path / "work" / "hf", tmp_path / "fp32", tmp_path / "work", "fp32")
    assert whole["format"] == "fp32 ONNX" and whole["bytes"] > 100 * 2**20
    passages = [text for _, text in fused_tops(retriever, train[:1], 3)[0]["passages"]]
    for m in (model, AnswerSupportModel(tmp_path / "fp32")):
        assert len(scores := m.score(train[0]["question"], passages)) == 3 and all(math.isfinite(s) for _, s in scores)

    # a fit set holding one training question, re-worded only in case and id, and another asked in other words
    # (cosine 0.93 to "best tacos near foundry district station??"), fails the gate naming both
    assert train[3]["question"] == "best tacos near foundry district station??"
    assert recipe["trained_on_questions"][0] == "best tacos near foundry district station??"  # sorted texts
    seen = {**train[4], "id": "fit-o-1", "question": train[4]["question"].upper()}
    asked = {**train[3], "id": "fit-o-2", "question": "where can i get good tacos close to foundry district station?"}
    fit = tmp_path / "fit.jsonl"
    fit.write_text(lines([seen, asked, *[q for q in riders if q["label"] == "answer"][10:13]]))
    night = (
        promotable_config(  # gating on the model: its in-sample scores would decide (not gating, they decide nothing)
            {"artifacts": cfg.artifacts, "answerability.answer_model_path": str(out), "answer.signal": "answer_support"}
            | {"answer.adjacent": 0.5, "answer.strong_signal": "rerank_top"}
        )
    )
    judged, _ = retriever_for(night, searcher)
    fit_only = {"calibration_set": str(fit), "precision_set": str(fit)}
    evaluate(judged, index / "chunks.parquet", judging(night), tmp_path, **fit_only)
    trained_on = json.loads((tmp_path / "calibration.json").read_text())["answer_model_trained_on"]
    assert trained_on == {"fit": ["fit-o-1", "fit-o-2"], "check": []}
    gate = gate_for_dir(judging(night), tmp_path, {}, tmp_path / "check_scorings.jsonl")
    unseen = next(c for c in gate["checks"] if c["name"] == "answer_model_unseen")
    assert not unseen["passed"] and "2 of the fit set (fit-o-1, fit-o-2)" in unseen["detail"] and not gate["passed"]


@pytest.mark.models
def test_several_seeds_train_one_model_each_read_as_their_mean(demo_index, tmp_path):
    from sourcegate.pipelines.app.factories import retriever_for
    from sourcegate.pipelines.retrieval.answer_support import AnswerEnsemble, answer_support, load_answer_model
    from sourcegate.pipelines.training.in_domain import train_seeds

    cfg, run_id, searcher = demo_index
    train = first_of_riders(2)
    train_path = tmp_path / "train.jsonl"
    train_path.write_text(lines(train))
    retriever, _ = retriever_for(cfg, searcher)
    out = tmp_path / "model"
    index = str(RunFolder(cfg.artifacts, run_id).path)
    recipes = train_seeds(retriever, index, [str(train_path)], out, tmp_path / "work", [13, 14], epochs=1)

    assert [r["hyperparameters"]["seed"] for r in recipes] == [13, 14]
    assert [r["command"].split("--out ")[1].split()[0] for r in recipes] == [str(out / "seed-13"), str(out / "seed-14")]
    assert json.loads((out / "ensemble.json").read_text())["members"] == ["seed-13", "seed-14"]
    assert recipes[0]["onnx_sha256"] != recipes[1]["onnx_sha256"]  # two draws, not one model twice
    ensemble = load_answer_model(out)
    assert isinstance(ensemble, AnswerEnsemble) and [m.folder.name for m in ensemble.members] == ["seed-13", "seed-14"]
    passages = ["Staff may not ask for medical documents for the animal.", "Buses run hourly."]
    logits = [
        math.log(p / (1 - p)) for p in (answer_support(m, train[0]["question"], passages) for m in ensemble.members)
    ]
    mean = answer_support(ensemble, train[0]["question"], passages)
    assert math.log(mean / (1 - mean)) == pytest.approx(sum(logits) / 2, abs=1e-9)


@pytest.mark.models
def test_a_student_learns_its_teachers_logits_in_fewer_layers_and_inherits_what_it_trained_on(demo_index, tmp_path):
    """One small model where several ran: the student learns the teacher's (here an ensemble's) logits on the
    passages a night reads, starts from evenly spaced layers of the base model, and is in-sample wherever its
    teacher was."""
    from sourcegate.pipelines.app.factories import retriever_for
    from sourcegate.pipelines.retrieval.answer_support import load_answer_model
    from sourcegate.pipelines.training.base_model import kept_layers
    from sourcegate.pipelines.training.in_domain import distillation_pairs, fused_tops, train_in_domain, train_seeds

    cfg, run_id, searcher = demo_index
    assert kept_layers(6, 12) == [1, 3, 5, 7, 9, 11] and kept_layers(4, 12) == [2, 5, 8, 11]
    retriever, _ = retriever_for(cfg, searcher)
    index = str(RunFolder(cfg.artifacts, run_id).path)
    teacher_set, student_set = tmp_path / "teacher.jsonl", tmp_path / "student.jsonl"
    own = [first_of_riders(3)[i] for i in (2, 5)]  # a should-answer and an off-topic question the teacher never saw
    teacher_set.write_text(lines(first_of_riders(2)))
    student_set.write_text(lines(own))
    train_seeds(retriever, index, [str(teacher_set)], tmp_path / "teacher", tmp_path / "tw", [13, 14], epochs=1)
    teacher = load_answer_model(tmp_path / "teacher")

    rows = fused_tops(retriever, own, 10)
    pairs = distillation_pairs(rows, teacher, retriever.answer_passages)
    assert len({(q, p) for q, p, _ in pairs}) == len(pairs) >= 2 * retriever.answer_passages  # each pair once
    q, p, target = pairs[0]
    assert target == pytest.approx(sum(m.logit(q, p) for m in teacher.members) / 2, abs=1e-12)

    out = tmp_path / "student"
    recipe = train_in_domain(
        retriever, index, [str(student_set)], out, tmp_path / "sw", epochs=1, teacher=tmp_path / "teacher", layers=2
    )
    assert recipe["layers"] == {"kept": [5, 11], "of": 12} and recipe["pairs"] == {"distilled": len(pairs), "epochs": 1}
    assert recipe["hyperparameters"]["loss"].startswith("MSELoss")
    assert recipe["distilled_from"]["fingerprint"] == teacher.fingerprint
    assert "--distil-from" in recipe["command"] and "--layers 2" in recipe["command"]
    assert set(recipe["trained_on"]) == set(teacher.trained_on) | {question_key(q) for q in own}
    student = load_answer_model(out, required=True)
    assert student is not None and student.session.get_inputs()  # loads as any answer model
    assert math.isfinite(student.logit(q, p)) and recipe["export"]["bytes"] < 0.5 * sha_size(tmp_path / "teacher")


def sha_size(ensemble: Path) -> int:
    """The bytes of an ensemble's first member's model file."""
    return (ensemble / "seed-13" / "model.onnx").stat().st_size


def test_seeds_must_be_distinct_before_anything_trains(tmp_path):
    from sourcegate.pipelines.training.in_domain import train_seeds

    with pytest.raises(ValueError, match="one or more distinct seeds"):
        train_seeds(None, "index", ["train.jsonl"], tmp_path / "out", tmp_path / "work", [13, 13])
    assert not (tmp_path / "out").exists()


def test_train_in_domain_refuses_the_fit_or_check_set_before_loading_a_model(tmp_path, capsys):
    from sourcegate.pipelines.app.cli import main

    fit = load_evalset("config/evals/calibration.jsonl")[:2]
    reworded = {**fit[1], "question": "Can I get a 31-day pass as a paper ticket please?"}  # a word away
    train = tmp_path / "train.jsonl"
    train.write_text(lines([{**q, "id": f"t-{i}"} for i, q in enumerate([fit[0], reworded])]))
    argv = ["--set", "evals.check_set=tests/data/evals/check-pre28.jsonl"]  # tests never open the live check set
    argv += ["train-in-domain", "--index", str(tmp_path / "no-such-run"), "--train", str(train), "--out", str(tmp_path)]
    assert main(argv) == 2  # before the (missing) index is opened or a model loads
    err = capsys.readouterr().err
    assert (
        "2 questions of the fit set config/evals/calibration.jsonl or near copies (t-0 ~ a-001 (1.00), t-1 ~ a-002"
        in err
    )
    assert "in-sample" in err
    assert not (tmp_path / "model.onnx").exists() and not Path(tmp_path / "no-such-run").exists()


def test_near_duplicates_are_copies_or_a_word_or_two_away_and_nothing_else():
    from sourcegate.evals.evalset import near_duplicates

    shift = "I finish my shift at the hospital downtown after midnight."
    others = [
        {"id": "o-1", "question": "Are dogs allowed on the bus?"},
        {"id": "o-2", "question": "How late does the Night Owl run?", "context": [shift]},
    ]
    items = [
        {"id": "copy", "question": "  ARE dogs allowed on the   bus?"},  # case and spacing aside, the same
        {"id": "near", "question": "Are dogs allowed on the buses?"},
        {"id": "turns", "question": "How late does the Night Owl run?", "context": [shift]},
        {"id": "alone", "question": "How late does the Night Owl run?"},  # without its conversation: another
        {"id": "other", "question": "Can I bring my bike on the train?"},
    ]
    found = near_duplicates(items, others)
    assert [(a, b) for a, b, _ in found] == [("copy", "o-1"), ("near", "o-1"), ("turns", "o-2")]
    assert found[0][2] == 1.0 and 0.8 <= found[1][2] < 1.0


def test_near_duplicates_find_what_difflib_pair_by_pair_finds():
    """The numpy bounds let through every pair difflib's own bounds let through, so the finds are the same: the
    fit set and the training sets of the shipped model, each reworded a little, plus empty and one-letter texts."""
    import difflib
    import random

    from sourcegate.evals.evalset import NEAR, load_evalset, near_duplicates, question_text

    def pair_by_pair(items, others):
        found = []
        for item in items:
            for other in others:
                score = difflib.SequenceMatcher(None, question_text(other), question_text(item), autojunk=False)
                if score.real_quick_ratio() >= NEAR and score.quick_ratio() >= NEAR and score.ratio() >= NEAR:
                    found.append((item["id"], other["id"], round(score.ratio(), 3)))
                    break
        return found

    rng = random.Random(13)
    others = [
        q for name in ("riders.jsonl", "riders-train.jsonl") for q in load_evalset(ROOT / "config" / "evals" / name)
    ]
    fit = load_evalset(ROOT / "config" / "evals" / "calibration.jsonl")
    reworded = [{**q, "id": f"r-{q['id']}", "question": q["question"].replace(" the ", " a ", 1)} for q in others]
    odd = [{"id": "empty", "question": ""}, {"id": "one", "question": "a"}, {"id": "é", "question": "Übergang?"}]
    items = fit + rng.sample(reworded, 150) + odd
    found = near_duplicates(items, others + odd[:2])
    assert found == pair_by_pair(items, others + odd[:2])
    assert len(found) > 150 and ("empty", "empty", 1.0) in found


def test_paraphrases_are_the_nearest_other_at_or_over_the_bar_and_read_the_conversation():
    from sourcegate.evals.evalset import paraphrases

    # a unit test of the rule alone: each text's vector is given, unnormalised (the function normalises)
    table = {"a": [1, 0, 0], "b": [0, 3, 0], "c": [0.9, 0.1, 0], "d": [0, 0, 1], "ctx a": [0, 0, 2]}
    others = [{"id": "o-1", "question": "A"}, {"id": "o-2", "question": "B"}]
    items = [
        {"id": "close", "question": "c"},  # cosine 0.994 with o-1
        {"id": "far", "question": "d"},
        {"id": "turns", "question": "a", "context": ["ctx"]},  # read with its conversation: another text
    ]
    found = paraphrases(items, others, lambda texts: [table[t] for t in texts])
    assert found == [("close", "o-1", 0.994)]
    assert paraphrases(items, others, lambda texts: [table[t] for t in texts], cosine=0.995) == []
    assert paraphrases([], others, None) == [] and paraphrases(items, [], None) == []


@pytest.mark.models
def test_the_bi_encoder_finds_a_fit_question_asked_in_other_words_and_drop_judged_records_it(embedder, tmp_path):
    from sourcegate.pipelines.training.in_domain import leave_out_judged, refuse_judged

    fit = tmp_path / "fit.jsonl"
    asked = {"id": "u-a-020", "question": "Can a bus driver sell me a single-ride ticket?", "label": "answer"}
    fit.write_text(lines([{**asked, "expected": ["buying-tickets"], "context": [], "kind": "single"}]))
    items = [
        {"id": "same-ask", "question": "Do bus operators sell single-ride tickets?"},  # difflib ratio 0.5
        {"id": "other-ask", "question": "Can I bring a folding bike on the bus?"},
    ]
    vectors = embedder.encode
    with pytest.raises(ValueError, match=r"1 questions of the fit set .* or near copies \(same-ask ~ u-a-020 \(0\.8"):
        refuse_judged(items, {"fit set": str(fit), "check set": None}, vectors)
    refuse_judged(items, {"fit set": str(fit)})  # without the bi-encoder, words alone: no copy
    left_out = leave_out_judged(items, {"fit set": str(fit)}, vectors, drop=True)
    assert list(left_out) == ["same-ask"] and left_out["same-ask"].startswith(f"~ u-a-020 of the fit set {fit} (0.8")


@pytest.mark.models
def test_a_model_trained_on_questions_made_from_the_corpus_alone_records_how_they_were_made(
    demo_index, tmp_path, recwarn, caplog
):
    import pyarrow.parquet as pq

    from sourcegate.pipelines.app.factories import answer_scorer_for, retriever_for
    from sourcegate.pipelines.training.export import BENIGN, PREPROCESS_HINT
    from sourcegate.pipelines.training.in_domain import leave_out_judged, train_in_domain
    from sourcegate.pipelines.training.synthetic_pairs import pseudo_queries

    cfg, run_id, searcher = demo_index
    index = RunFolder(cfg.artifacts, run_id).path
    retriever, _ = retriever_for(cfg, searcher)
    chunks = pq.read_table(index / "chunks.parquet").to_pylist()
    fit = tmp_path / "fit.jsonl"  # a judged set holding one of the sentences the pair maker would ask
    asked = pseudo_queries(chunks, 4, seed=13)[1]
    fit.write_text(lines([{"id": "fit-1", "question": asked["question"], "label": "decline"}]))
    synthetic = {
        "n": 4,
        "chunks": chunks,
        "leave_out": lambda made: leave_out_judged(made, {"fit": str(fit)}, drop=True),
    }
    out = tmp_path / "model"
    recipe = train_in_domain(
        retriever, str(index), [], out, tmp_path / "work", epochs=1, synthetic=synthetic, time_budget_s=60
    )

    made = recipe["synthetic"]
    assert made["seed"] == 13 and made["pseudo_queries_asked"] == 4 and made["window"] == 3
    assert made["left_out"] == {asked["id"]: f"~ fit-1 of the fit {fit} (1.00)"}  # never trained on a judged one
    assert made["pseudo_queries"] == 3 and made["borrowing"] == 1 and made["negatives_per_query"] == 2
    assert recipe["pairs"] == {"positive": 3, "negative": 3 * 2 + 1 * 3, "epochs": 1}
    assert recipe["data"] == [] and "--train" not in recipe["command"]
    assert "--synthetic 4 " in recipe["command"] and recipe["command"].endswith("--seed 13 --time-budget 60")
    assert len(recipe["trained_on"]) == 4 and asked["question"].lower() not in recipe["trained_on_questions"]
    model = answer_scorer_for(str(out))
    assert model.trained_on == frozenset(recipe["trained_on"]) and recipe["steps"] == 1
    # the exporters' notes that do not apply to this model are not shown to the user (they once looked like faults)
    assert not [w for w in recwarn if str(w.message).startswith(BENIGN)]
    assert PREPROCESS_HINT not in caplog.text


def test_train_in_domain_wants_labelled_sets_or_synthetic_questions(tmp_path, capsys):
    from sourcegate.pipelines.app.cli import main

    assert main(["train-in-domain", "--index", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 2
    assert "give --train sets, --synthetic N" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_training_set_is_found_by_its_content_wherever_it_was_committed(tmp_path):
    from sourcegate.pipelines.training.retrain import NotReproducible, find_by_hash

    committed = Path("config/evals/riders.jsonl")
    recorded = {"path": "/work/exp/gone/riders-copy.jsonl", "sha256": sha256_file(committed)}
    assert find_by_hash(recorded) == committed  # same bytes, another name: the same set
    with pytest.raises(NotReproducible, match="is in no committed file"):
        find_by_hash({"path": "/work/exp/gone/x.jsonl", "sha256": "0" * 64})


@pytest.mark.models
def test_retrain_rebuilds_a_model_from_its_recipe_and_the_recipe_round_trips(demo_index, tmp_path, capsys):
    from sourcegate.pipelines.app.cli import main
    from sourcegate.pipelines.training import retrain

    cfg, run_id, _ = demo_index
    index = RunFolder(cfg.artifacts, run_id).path
    train = tmp_path / "train.jsonl"
    train.write_text(lines(first_of_riders(3)))
    settings = ["--set", "evals.check_set=tests/data/evals/check-pre28.jsonl"]  # tests never open the live check set
    first = tmp_path / "first"
    args = ["train-in-domain", "--index", str(index), "--train", str(train), "--out", str(first), "--epochs", "1"]
    assert main([*settings, *args]) == 0
    assert (first / "learned_corpus.json").is_file()  # what it learned, for the nights and for a retrain

    again = tmp_path / "again"
    assert main([*settings, "retrain", str(first), "--out", str(again)]) == 0
    printed = capsys.readouterr().out
    assert f"{index} holds exactly what {first} learned" in printed
    old, new = retrain.recipes(first)[0], retrain.recipes(again)[0]
    for key in ("data", "pairs", "hyperparameters", "trained_on", "answer_passages", "base_model"):
        assert old[key] == new[key], key
    assert retrain.command_args(new)[retrain.command_args(new).index("--out") + 1] == str(again)
    assert "seed 13: same data, pairs, hyperparameters, trained_on; differs nothing" in printed

    # the version it paired against, changed by one section: refused, naming what differs
    learned = json.loads((first / "learned_corpus.json").read_text())
    key = next(iter(learned["sections"]))
    learned["sections"][key] = "0" * 16
    (first / "learned_corpus.json").write_text(json.dumps(learned))
    assert main([*settings, "retrain", str(first), "--out", str(tmp_path / "third")]) == 2
    assert "is not the one" in capsys.readouterr().err and not (tmp_path / "third").exists()


def test_a_training_a_time_budget_cut_records_its_steps_so_a_retrain_trains_as_many():
    """The cut depends on that machine's speed: a retrain elsewhere would train another count (and schedule)."""
    from sourcegate.pipelines.training.in_domain import command_line, steps_to_record

    whole = {"steps": 400, "step_decision": {"epoch_steps": 400}}
    cut = {"steps": 223, "step_decision": {"epoch_steps": 748}}
    assert (steps_to_record(whole, None), steps_to_record(cut, None), steps_to_record(whole, 50)) == (None, 223, 50)
    line = command_line("runs/r", ["t.jsonl"], None, None, None, "out", 2, "int8", 13, 2400, steps_to_record(cut, None))
    assert line.endswith("--seed 13 --time-budget 2400 --max-steps 223")
    from sourcegate.pipelines.training.export import versions

    assert versions()["cpu_bf16_kernel"]  # the kernel its bf16 autocast ran on, beside the packages
