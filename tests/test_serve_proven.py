"""What is served is what was proven (G11), and a model that cannot be used is no verdict (G10).

The decision a passed verdict proved (gate.json's `decision`, published beside LIVE at promote and rollback) is
what `sourcegate query` answers with: a config value or a model on disk that differs is refused with exit 2 naming
the field and both values, unless --unproven, which says so first. A configured answer model or reranker that
cannot be used stops the night with exit 2 before anything is scored; a precision eval without its reranker
writes no verdict.

The served nights are the fault suite's tiny night (tests/test_faults.py: three demo articles, tiny eval sets, the
shipped decision), whose gate passes: the smallest live version with a real verdict.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from sourcegate.artifact_io import write_json
from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.evals.harness import NotAVerdict
from sourcegate.pipelines import config
from sourcegate.pipelines.app import cli, steps
from sourcegate.pipelines.app.cli import main
from sourcegate.pipelines.app.factories import Serving, answer_scorer_for, scorer_for
from sourcegate.pipelines.release import decision
from sourcegate.pipelines.retrieval.answer import decide
from sourcegate.pipelines.retrieval.rerank import ModelUnavailable
from sourcegate.pipelines.retrieval.retriever import Retrieval
from sourcegate.pipelines.versions.manifest import sha256_file
from tests.test_faults import ARTICLES, DEMO, tiny_night

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = config.load(ROOT / "config" / "pipeline.yaml")
BIKE = "Can I bring my bike on the light rail at rush hour?"
FIRST, SECOND, FAILED = "20260301-020000", "20260302-020000", "20260303-020000"


def truncated_copy(source: Path, folder: Path) -> Path:
    """A copy of a shipped answer model whose model.onnx lost its second half."""
    shutil.copytree(source, folder)
    onnx = folder / "model.onnx"
    onnx.write_bytes(onnx.read_bytes()[: onnx.stat().st_size // 2])
    return onnx


# --- fast tier: the decision, the checks, the errors -------------------------------------------------------------


def test_the_decision_takes_signal_and_thresholds_from_calibration_and_the_config_only_where_it_is_silent():
    calibration = {
        "shipped": {"signal": "cosine_top", "threshold": 0.4, "strong_threshold": 0.7},
        "config": {"gating": {"below": "open", "strong_signal": None}},
    }
    chosen = decision.proven(SHIPPED, calibration)
    assert (chosen["signal"], chosen["adjacent"], chosen["strong"]) == ("cosine_top", 0.4, 0.7)
    assert chosen["below"] == "open" and chosen["strong_signal"] == "rerank_top"  # the config's, calibration silent
    fallback = decision.proven(SHIPPED, None)
    assert (fallback["signal"], fallback["adjacent"]) == ("answer_support", SHIPPED.answer.adjacent)
    assert fallback["answer_passages"] == 5 and fallback["answer_model"]["path"] == "models/answer_in_domain"
    assert fallback["answer_model"]["fingerprint"].startswith("sha256:")
    assert fallback["reranker"]["kind"] == "onnx" and fallback["reranker"]["fingerprint"].startswith("sha256:")
    assert fallback["combiner"]["sha256"] == sha256_file(SHIPPED.answerability.combiner)
    assert decision.mismatches(fallback, SHIPPED) == []


def test_a_config_value_or_a_model_on_disk_that_differs_is_named_with_both_values(tmp_path):
    proven = decision.proven(SHIPPED, None)
    other = config.replace(SHIPPED, {"answer.adjacent": 0.9999})
    assert decision.mismatches(proven, other) == ["answer.adjacent: 0.000866857 (proven) vs 0.9999 (config)"]

    model = tmp_path / "answer_model"
    shutil.copytree(ROOT / "models" / "answer_support", model)
    own = config.replace(SHIPPED, {"answerability.answer_model_path": str(model)})
    proven = decision.proven(own, None)
    was = proven["answer_model"]["fingerprint"]
    recipe = model / "recipe.json"
    recipe.write_text(recipe.read_text() + " ")  # the same model? a file it reads changed: not what was proven
    [problem] = decision.mismatches(proven, own)
    now = decision.on_disk(own)["answer_model_fingerprint"]
    assert problem == f"answer model fingerprint: {was} (proven) vs {now} (on disk)" and now != was
    shutil.rmtree(model)
    assert decision.mismatches(proven, own) == [f"answer model fingerprint: {was} (proven) vs missing (on disk)"]


def test_the_retrieval_settings_are_part_of_what_is_served():
    """They make the fused order the answer model reads and the order of the sources served: another rrf_k or depth
    is another answer. A verdict recorded before they were part of the decision binds the keys it lists."""
    proven = decision.proven(SHIPPED, None)
    assert proven["configured"]["retrieval.rrf_k"] == SHIPPED.retrieval.rrf_k
    other = config.replace(SHIPPED, {"retrieval.rrf_k": 60, "retrieval.rerank_depth": 3})
    assert decision.mismatches(proven, other) == [
        f"retrieval.rrf_k: {SHIPPED.retrieval.rrf_k} (proven) vs 60 (config)",
        f"retrieval.rerank_depth: {SHIPPED.retrieval.rerank_depth} (proven) vs 3 (config)",
    ]
    older = {**proven, "configured": {k: v for k, v in proven["configured"].items() if not k.startswith("retrieval.")}}
    assert decision.mismatches(older, other) == []


def test_a_model_whose_signal_an_answer_does_not_compute_is_not_part_of_what_is_served(tmp_path):
    """A version gating (and sourcing) on rerank_top answers the same whatever answer model or combiner the config
    names, since a query computes only the decision's signals: naming tomorrow's model for the next night does not
    stop today's version being served. With every signal computed (--all-signals), or a decision that reads them,
    they are compared as before."""
    on_rerank = config.replace(SHIPPED, {"answer.signal": "rerank_top", "answer.adjacent": 0.3})
    proven = decision.proven(on_rerank, None)
    model = tmp_path / "tomorrow"
    shutil.copytree(ROOT / "models" / "answer_support", model)
    tomorrow = config.replace(
        on_rerank,
        {
            "answerability.answer_model_path": str(model),
            "answerability.answer_passages": 3,
            "answerability.combiner": None,
        },
    )
    assert decision.mismatches(proven, tomorrow, frozenset({"rerank_top"})) == []
    every = decision.mismatches(proven, tomorrow)
    assert [m.split(":")[0] for m in every] == [
        "answerability.answer_passages",
        "answer model fingerprint",
        "answerability combiner sha256",
    ]
    assert [
        m.split(":")[0] for m in decision.mismatches(proven, tomorrow, frozenset({"rerank_top", "answer_support"}))
    ] == [
        "answerability.answer_passages",
        "answer model fingerprint",
    ]
    assert decision.mismatches(
        proven, config.replace(tomorrow, {"answer.adjacent": 0.4}), frozenset({"rerank_top"})
    ) == ["answer.adjacent: 0.3 (proven) vs 0.4 (config)"]


def test_a_verdict_that_failed_or_records_no_decision_proves_nothing_to_serve():
    with pytest.raises(decision.NotProven, match="no gate verdict at x"):
        decision.of_verdict(None, "x")
    with pytest.raises(decision.NotProven, match="did not pass"):
        decision.of_verdict({"passed": False, "decision": {"signal": "rerank_top"}}, "x")
    with pytest.raises(decision.NotProven, match="records no decision"):
        decision.of_verdict({"passed": True}, "x")


def test_a_truncated_answer_model_is_named_before_it_is_loaded(tmp_path, caplog):
    onnx = truncated_copy(ROOT / "models" / "answer_support", tmp_path / "model")
    with pytest.raises(ModelUnavailable) as caught:
        answer_scorer_for(str(tmp_path / "model"), required=True)
    message = str(caught.value)
    assert f"{onnx}: sha256 " in message and "onnx_sha256" in message and "truncated or replaced" in message
    assert f"({onnx.stat().st_size} bytes" in message
    assert answer_scorer_for(str(tmp_path / "model")) is None  # serving: logged, the signal is then missing


def test_a_missing_reranker_is_an_error_where_it_is_required_and_a_preference_where_not(tmp_path):
    missing = tmp_path / "no-such-reranker"
    assert scorer_for("onnx", str(missing)) is None
    with pytest.raises(ModelUnavailable, match=f"reranker \\(reranker.kind onnx\\) at {missing} could not load"):
        scorer_for("onnx", str(missing), required=True)


def test_a_precision_eval_without_its_reranker_writes_no_verdict_and_exits_2(make_cfg, capsys):
    cfg = make_cfg()
    folder = RunFolder(cfg.artifacts, "r1").path
    folder.mkdir(parents=True)
    write_json({"shipped": None}, folder / "calibration.json")
    write_json({"by_kind": {}, "reranker_used": False}, folder / "precision.json")
    write_json({"errors": []}, folder / "eval_errors.json")

    def gate(_args):
        return steps.gate_step(RunFolder(cfg.artifacts, "r1"), cfg)

    code = cli.run_command(argparse.Namespace(func=gate, command="gate", verbose=False))
    err = capsys.readouterr().err
    assert code == 2 and "not a verdict during gate: the precision eval ran without the reranker" in err
    assert not (folder / "gate.json").exists()
    with pytest.raises(NotAVerdict):
        steps.gate_step(RunFolder(cfg.artifacts, "r1"), cfg)
    # a fit or check question the reranker timed out on (a loaded worker): its rerank_top is missing, declined
    write_json({"by_kind": {}, "reranker_used": True}, folder / "precision.json")
    write_json({"shipped": None, "reranker_used": False}, folder / "calibration.json")
    with pytest.raises(NotAVerdict, match="the fit and check eval ran without the reranker on some question"):
        steps.gate_step(RunFolder(cfg.artifacts, "r1"), cfg)
    assert not (folder / "gate.json").exists()


def test_a_gating_signal_that_could_not_be_computed_is_said_first_and_exits_2():
    proven = decision.proven(SHIPPED, None)
    retrieval = Retrieval("q", [], [], reranked=False, signals={"answer_support": None, "rerank_top": 0.9})
    answer = decide(retrieval, proven)
    assert answer.mode == "decline" and not answer.applied  # declined, but nothing was measured
    notice = cli.query_notice(Serving(None, proven, "runs/r1/gate.json"), answer)
    assert notice.startswith("NOT APPLIED: the proven decision (runs/r1/gate.json) could not be applied: its gating")
    assert decide(Retrieval("q", [], [], False, {"answer_support": 0.5}), proven).applied


def test_unproven_answers_with_what_a_failed_night_chose_when_the_config_is_the_one_it_ran_with():
    """Under `answer.signal: auto` the config names no signal: the night chose one and placed its threshold, and a
    verdict that did not pass still records that choice. --unproven answers with it; with another config, with the
    config as it is, and an `auto` nothing chose is declined saying so (it once said "could not be computed")."""
    auto = config.replace(SHIPPED, {"answer.signal": "auto"})
    night = decision.proven(auto, {"shipped": {"signal": "cosine_top", "threshold": 0.4}})
    failed = {"passed": False, "decision": night}
    assert decision.unproven(failed, auto) == (night, "the decision its night chose")
    used, basis = decision.unproven(failed, config.replace(auto, {"answer.strong": 0.9}))
    assert basis == "the config as it is" and (used["signal"], used["strong"]) == ("auto", 0.9)
    answer = decide(Retrieval("q", [], [], False, {"rerank_top": 0.9, "cosine_top": 0.8}), used)
    assert answer.mode == "decline" and not answer.applied
    assert cli.query_notice(Serving(None, used, "g.json", ["it did not pass"], 0, basis), answer) == (
        "UNPROVEN: answered with the config as it is, not a proven decision: it did not pass | NOT APPLIED: the "
        "decision could not be applied: its gating signal is `auto`, which only a night chooses, and no verdict of "
        "this version records a choice, so the question is declined"
    )
    answer = decide(Retrieval("q", [], [], False, {"rerank_top": 0.9, "cosine_top": 0.8}), night)
    assert answer.applied and answer.mode == "sourced"  # the night's cosine_top at 0.4, sourced on rerank_top


# --- a live version with a real verdict -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict:
    """The tiny night (all three articles) with the answer model read from a copy this module may change,
    promoted: (config file, artifacts, the model copy)."""
    base = tmp_path_factory.mktemp("served")
    tiny = tiny_night(base)
    shutil.copy(DEMO / ARTICLES[2], tiny["corpus"] / ARTICLES[2])
    model = base / "answer_in_domain"
    shutil.copytree(ROOT / "models" / "answer_in_domain", model)
    body = json.loads(tiny["config"].read_text())
    body["answerability"]["answer_model_path"] = str(model)
    tiny["config"].write_text(json.dumps(body))
    artifacts = base / "artifacts"
    night = ["--config", str(tiny["config"]), "run", "--artifacts", str(artifacts), "--quiet"]
    assert main([*night, "--run-id", FIRST]) == 0
    return {"config": str(tiny["config"]), "artifacts": artifacts, "model": model, "night": night}


def query(served, *args, options=()):
    return main(["--config", served["config"], *options, "query", BIKE, "--artifacts", str(served["artifacts"]), *args])


@pytest.mark.models
def test_a_query_under_another_threshold_is_refused_naming_it(served, capsys):
    assert query(served, "--json") == 0
    answered = json.loads(capsys.readouterr().out)
    assert answered["mode"] in ("sourced", "adjacent") and answered["decision_applied"] and not answered["unproven"]
    assert answered["proven_by"] == str(served["artifacts"] / "runs" / FIRST / "gate.json")
    assert query(served, options=["--set", "answer.adjacent=0.9999"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "answer.adjacent: 0.000866857 (proven) vs 0.9999 (config)" in err
    assert err.startswith("sourcegate: not proven during query: refusing to answer") and err.count("\n") == 1


@pytest.mark.models
def test_unproven_answers_with_the_config_and_says_so_first(served, capsys):
    assert query(served, "--unproven", options=["--set", "answer.adjacent=0.9999"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("UNPROVEN: ") and "answer.adjacent: 0.000866857 (proven) vs 0.9999 (config)" in first
    assert query(served, "--unproven", "--json", options=["--set", "answer.adjacent=0.9999"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["unproven"] and payload["proven_by"] is None and payload["threshold"] == 0.9999
    assert payload["mode"] == "decline" and payload["overridden"] == [
        "answer.adjacent: 0.000866857 (proven) vs 0.9999 (config)"
    ]


@pytest.mark.models
def test_a_served_version_reads_the_text_vectors_its_verdict_bound_and_answers_exactly_as_without_them(
    served, tmp_path, caplog
):
    """A question encodes only its own texts: the passages' sentence and word vectors come from the night's
    text_vectors.parquet, which gate.json binds by SHA-256 and which is exact under the bi-encoder's binding, so the
    answer is the one computed afresh. The same file altered after the night is not read."""
    from sourcegate.pipelines.app.answering import ask
    from sourcegate.pipelines.app.factories import serving_for

    folder = served["artifacts"] / "runs" / FIRST
    bound = json.loads((folder / "gate.json").read_text())["evaluated"]["kept"]
    assert bound["text_vectors.parquet"]["sha256"] == sha256_file(folder / "text_vectors.parquet")
    cfg = config.load(served["config"], {"artifacts": str(served["artifacts"])})
    serving = serving_for(cfg, all_signals=True)  # the signals that encode the passages' sentences and words
    kept = serving.retriever.text_vectors
    assert serving.kept_vectors == len(kept.memo) > 0 and kept.computed == 0  # the night's, none encoded yet
    fresh = serving_for(cfg, all_signals=True)
    fresh.retriever.text_vectors.memo.clear()  # as without them: every text encoded by the serving process
    question = "Are folding bikes allowed on buses when it is crowded?"  # asked by no eval set of the tiny night
    assert ask(cfg, serving, question).payload == ask(cfg, fresh, question).payload
    assert 0 < kept.computed < fresh.retriever.text_vectors.computed

    copy = tmp_path / "artifacts"  # the same version with its kept vectors altered after its night
    shutil.copytree(served["artifacts"], copy)
    altered = copy / "runs" / FIRST / "text_vectors.parquet"
    altered.write_bytes(altered.read_bytes()[:-8] + b"\0" * 8)
    with caplog.at_level("WARNING"):
        untrusted = serving_for(config.load(served["config"], {"artifacts": str(copy)}), all_signals=True)
    assert untrusted.kept_vectors == 0 and untrusted.retriever.text_vectors.memo == {}
    assert "differs from the one its verdict bound" in caplog.text


@pytest.mark.models
def test_a_served_question_computes_the_signals_its_decision_reads_and_is_decided_as_with_every_signal(served):
    """By default a question computes the proven decision's gating and strong signals (and the cheap ones beside
    them), not those that encode the top passages' sentences and words: each signal is computed from the same
    inputs whichever others are, so the mode, value, threshold and passages are those of every signal computed."""
    from sourcegate.pipelines.app.answering import ask
    from sourcegate.pipelines.app.factories import serving_for
    from sourcegate.pipelines.retrieval.retriever import ENCODED_SIGNALS

    cfg = config.load(served["config"], {"artifacts": str(served["artifacts"])})
    lean, every = serving_for(cfg), serving_for(cfg, all_signals=True)
    proven = lean.decision
    assert lean.retriever.wanted == {proven["signal"], proven["strong_signal"]} and every.retriever.wanted is None
    assert lean.kept_vectors == 0 < every.kept_vectors  # nothing lent that no computed signal reads
    questions = (BIKE, "Who won the football world cup in 1998?")  # one answerable, one off-topic
    modes = set()
    for question in questions:
        a, b = ask(cfg, lean, question).payload, ask(cfg, every, question).payload
        assert {k: v for k, v in a.items() if k != "signals"} == {k: v for k, v in b.items() if k != "signals"}
        assert a["signals"] == {k: b["signals"][k] for k in a["signals"]}
        assert {proven["signal"], proven["strong_signal"]} <= set(a["signals"])
        assert set(b["signals"]) - set(a["signals"]) >= set(ENCODED_SIGNALS)
        modes.add(a["mode"])
    assert "decline" in modes and len(modes) == 2
    assert lean.retriever.text_vectors.computed == len(questions)  # the questions' own vectors, nothing else


@pytest.mark.models
def test_an_answer_model_changed_on_disk_is_refused(served, capsys):
    spec = served["model"] / "ensemble.json"
    intact = spec.read_bytes()
    proven = json.loads((served["artifacts"] / "runs" / FIRST / "gate.json").read_text())["decision"]
    try:
        spec.write_text(json.dumps({**json.loads(intact), "note": "edited"}))  # the spec changed, one key more
        assert query(served) == 2
        err = capsys.readouterr().err
        was = proven["answer_model"]["fingerprint"]
        assert f"answer model fingerprint: {was} (proven) vs sha256:" in err and "(on disk)" in err
    finally:
        spec.write_bytes(intact)
    assert query(served) == 0


@pytest.mark.models
def test_a_run_without_a_passed_verdict_is_served_only_unproven(served, capsys):
    strict = ["--set", "answer.adjacent=0.99"]
    assert main([*strict, *served["night"], "--run-id", FAILED, "--no-promote"]) == 1  # the gate failed
    capsys.readouterr()
    run = str(served["artifacts"] / "runs" / FAILED)
    assert query(served, "--index", run, options=strict) == 2
    assert f"the verdict at {run}/gate.json did not pass" in capsys.readouterr().err
    assert query(served, "--index", run, "--unproven", options=strict) == 0
    assert capsys.readouterr().out.startswith("UNPROVEN: answered with the decision its night chose, ")


@pytest.mark.models
def test_the_decision_is_published_beside_live_at_promote_and_at_rollback(served, capsys):
    artifacts = served["artifacts"]
    published = artifacts / decision.PUBLISHED

    def names(version: str) -> None:
        body = json.loads(published.read_text())
        gate_path = artifacts / "runs" / version / "gate.json"
        assert body["version"] == version and (artifacts / "LIVE").read_text().strip() == version
        assert body["verdict_sha256"] == sha256_file(gate_path)
        assert body["decision"] == json.loads(gate_path.read_text())["decision"]
        shipped = json.loads((artifacts / "runs" / version / "calibration.json").read_text())["shipped"]
        assert (body["decision"]["signal"], body["decision"]["adjacent"]) == (shipped["signal"], shipped["threshold"])

    names(FIRST)
    assert main([*served["night"], "--run-id", SECOND]) == 0
    names(SECOND)
    assert main(["--config", served["config"], "rollback", "--artifacts", str(artifacts)]) == 0
    names(FIRST)
    capsys.readouterr()


# --- a night whose configured model cannot be used -----------------------------------------------------------------


@pytest.fixture
def night_of(tmp_path):
    tiny = tiny_night(tmp_path)
    artifacts = tmp_path / "artifacts"

    def run(*overrides: str) -> int:
        sets = [a for o in overrides for a in ("--set", o)]
        return main([*sets, "--config", str(tiny["config"]), "run", "--artifacts", str(artifacts), "--run-id", FIRST])

    run.folder = artifacts / "runs" / FIRST
    return run


@pytest.mark.models
def test_a_truncated_answer_model_stops_the_night_with_exit_2_before_scoring(night_of, tmp_path, capsys):
    onnx = truncated_copy(ROOT / "models" / "answer_support", tmp_path / "truncated")
    assert night_of(f"answerability.answer_model_path={onnx.parent}") == 2
    err = capsys.readouterr().err
    assert "model unavailable during evaluate, before anything was scored" in err and f"{onnx}: sha256 " in err
    assert not (night_of.folder / "calibration.json").exists() and not (night_of.folder / "gate.json").exists()


@pytest.mark.models
def test_a_missing_reranker_stops_the_night_with_exit_2_not_a_failed_gate(night_of, tmp_path, capsys):
    missing = tmp_path / "no-such-reranker"
    assert night_of("reranker.kind=onnx", f"reranker.model_path={missing}") == 2
    err = capsys.readouterr().err
    assert f"reranker (reranker.kind onnx) at {missing} could not load" in err
    assert not (night_of.folder / "calibration.json").exists() and not (night_of.folder / "gate.json").exists()


def test_where_a_model_lives_is_not_what_was_proven():
    from sourcegate.pipelines import config
    from sourcegate.pipelines.release import decision

    cfg = config.load("config/pipeline.yaml")
    proven = decision.proven(cfg, None)
    moved = config.replace(
        cfg, {"answerability.answer_model_path": str(Path(cfg.answerability.answer_model_path).resolve())}
    )
    assert decision.mismatches(proven, moved) == []  # the same files by another path: what a DAG task names
