"""A verdict bound to what it judged (G3), the promotions log and rollback (G4).

Fast tier: hand-made embedded versions (fixed vectors) and hand-written passed verdicts bound the way
the evaluate and gate steps bind them; no model, no node.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from sourcegate.artifact_io import write_json
from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines import config
from sourcegate.pipelines.app import steps
from sourcegate.pipelines.app.cli import main
from sourcegate.pipelines.app.factories import open_store
from sourcegate.pipelines.release import decision, verdict
from sourcegate.pipelines.versions import manifest as mf
from sourcegate.pipelines.versions import promotions
from tests.test_embedded_backend import synthetic_chunks

INPUTS = {"corpus_hash": "c1", "config_hash": "k1", "model_fingerprint": "sha256:m1", "code_version": "v1"}


def pass_gate(cfg: config.PipelineConfig, version: str, passed: bool = True) -> dict:
    """gate.json for a loaded `version`, bound to it as evaluate_step + gate_step bind a verdict."""
    facts = verdict.evaluated(cfg, open_store(cfg).manifest(version), verdict.eval_sets(cfg))
    bound = verdict.binding(facts, cfg.evals.baseline)
    gate = {"passed": passed, "reasons": [], "evaluated": bound, "decision": decision.proven(cfg, None, bound)}
    write_json(gate, RunFolder(cfg.artifacts, version).path / "gate.json")
    return gate


@pytest.fixture
def night(make_cfg, tmp_path):
    """make(version, passed=True): a loaded version with a verdict bound as evaluate_step + gate_step bind it."""
    evals = tmp_path / "evals"
    evals.mkdir()
    for name in ("calibration.jsonl", "precision.jsonl"):
        shutil.copy(f"config/evals/{name}", evals / name)
    baseline = tmp_path / "baseline.json"
    shutil.copy("config/baselines/precision.json", baseline)
    combiner = tmp_path / "answerability_combiner.json"
    shutil.copy("config/baselines/answerability_combiner.json", combiner)
    cfg = make_cfg(
        **{
            "evals.calibration_set": str(evals / "calibration.jsonl"),
            "evals.precision_set": str(evals / "precision.jsonl"),
            "evals.baseline": str(baseline),
            "answerability.combiner": str(combiner),
        }
    )
    synthetic_chunks(tmp_path / "c.parquet", n=9)
    store = open_store(cfg)

    def make(version: str, passed: bool = True) -> dict:
        store.load(version, str(tmp_path / "c.parquet"), inputs=INPUTS)
        return pass_gate(cfg, version, passed)

    make.cfg, make.store, make.evals, make.baseline, make.chunks = cfg, store, evals, baseline, tmp_path / "c.parquet"
    make.combiner = combiner
    return make


def test_a_bound_verdict_promotes_and_the_promotion_is_logged(night):
    night("20260101-020000")
    assert steps.promote_step(RunFolder(night.cfg.artifacts, "20260101-020000"), night.cfg) == "20260101-020000"
    night("20260102-020000")
    steps.promote_step(RunFolder(night.cfg.artifacts, "20260102-020000"), night.cfg, actor="dag:scheduled__x")
    log = night.store.promotions()
    assert [(r["version"], r["previous"], r["actor"]) for r in log] == [
        ("20260101-020000", None, "cli"),
        ("20260102-020000", "20260101-020000", "dag:scheduled__x"),
    ]
    gate = RunFolder(night.cfg.artifacts, "20260102-020000").path / "gate.json"
    assert log[-1]["verdict_sha256"] == mf.sha256_file(gate) and log[-1]["time"]
    assert log[-1]["manifest_sha256"] == mf.manifest_hash(night.store.manifest("20260102-020000"))
    lines = night.store.promotions_log.read_text().splitlines()
    assert [json.loads(line) for line in lines] == log  # one JSON line per promotion, appended
    steps.promote_step(RunFolder(night.cfg.artifacts, "20260102-020000"), night.cfg)  # already live: nothing to log
    assert len(night.store.promotions()) == 2


def test_a_run_folder_copied_under_another_run_id_is_never_promoted(night):
    night("20260101-020000")
    runs = Path(night.cfg.artifacts) / "runs"
    shutil.copytree(runs / "20260101-020000", runs / "20260102-020000")
    with pytest.raises(verdict.VerdictMismatch, match="its folder holds version '20260101-020000', built under"):
        steps.promote_step(RunFolder(night.cfg.artifacts, "20260102-020000"), night.cfg)
    assert night.store.live() is None


def test_a_verdict_on_a_rebuilt_version_is_refused(night):
    """Clearing load + promote in Airflow after the version was rebuilt: the old "passed" must not carry over."""
    night("v1")
    night.store.promote("v1")  # something else is live
    night("v2")
    shutil.rmtree(night.store.folder("v2"))  # a maintainer deleted it; the load task is cleared and re-run ...
    night.store.load("v2", str(night.chunks), inputs=INPUTS)  # ... rebuilt: same inputs, a new manifest
    with pytest.raises(verdict.VerdictMismatch, match="rebuilt or changed since it was evaluated"):
        steps.promote_step(RunFolder(night.cfg.artifacts, "v2"), night.cfg)
    assert night.store.live() == "v1" and len(night.store.promotions()) == 0


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda n: (n.evals / "precision.jsonl").write_text((n.evals / "calibration.jsonl").read_text()), "eval set"),
        (lambda n: n.baseline.write_text("{}"), "baseline"),
        (lambda n: setattr(n, "cfg", config.replace(n.cfg, {"answer.adjacent": 0.01})), "config"),
        (lambda n: n.combiner.write_text(n.combiner.read_text().replace('"l2"', '"l2" ')), "answerability combiner"),
    ],
    ids=["eval-set-edited", "baseline-replaced", "config-changed", "combiner-re-accepted"],
)
def test_a_verdict_is_refused_when_what_it_judged_changed(night, change, message):
    night("v1")
    change(night)
    with pytest.raises(verdict.VerdictMismatch, match=message):
        steps.promote_step(RunFolder(night.cfg.artifacts, "v1"), night.cfg)
    assert night.store.live() is None


def test_the_verdict_does_not_depend_on_where_the_artifacts_live(night, tmp_path):
    """`artifacts` is a location: a night staged into one scratch folder is promoted from another."""
    night("v1")
    moved = config.replace(night.cfg, {"artifacts": str(tmp_path / "elsewhere")})
    shutil.copytree(night.cfg.artifacts, moved.artifacts)
    assert verdict.config_hash(moved) == verdict.config_hash(night.cfg)
    assert steps.promote_step(RunFolder(moved.artifacts, "v1"), moved) == "v1"
    changed = config.replace(moved, {"answer.adjacent": 0.01})
    assert verdict.config_hash(changed) != verdict.config_hash(moved)  # content still counts


def test_failed_unbound_or_missing_verdicts_are_refused(night):
    night("v1", passed=False)
    gate_path = RunFolder(night.cfg.artifacts, "v1").path / "gate.json"
    write_json({**json.loads(gate_path.read_text()), "reasons": ["coverage 0.98 < 1.0"]}, gate_path)
    with pytest.raises(verdict.VerdictMismatch, match="gate failed: coverage 0.98 < 1.0"):  # says why
        steps.promote_step(RunFolder(night.cfg.artifacts, "v1"), night.cfg)
    with pytest.raises(verdict.VerdictMismatch, match="no such run in"):  # a typo in the run id or artifacts
        steps.promote_step(RunFolder(night.cfg.artifacts, "v9"), night.cfg)
    gate_path.write_text("{")
    with pytest.raises(verdict.VerdictMismatch, match="gate.json is unreadable"):
        steps.promote_step(RunFolder(night.cfg.artifacts, "v1"), night.cfg)
    gate = night("v2")
    del gate["evaluated"]
    write_json(gate, RunFolder(night.cfg.artifacts, "v2").path / "gate.json")
    with pytest.raises(verdict.VerdictMismatch, match="records nothing about what it evaluated"):
        steps.promote_step(RunFolder(night.cfg.artifacts, "v2"), night.cfg)
    night("v3")
    (RunFolder(night.cfg.artifacts, "v3").path / "gate.json").unlink()
    with pytest.raises(verdict.VerdictMismatch, match="no gate verdict"):
        steps.promote_step(RunFolder(night.cfg.artifacts, "v3"), night.cfg)
    gate = night("v4")
    write_json({**gate, "passed": "false"}, RunFolder(night.cfg.artifacts, "v4").path / "gate.json")  # a string
    with pytest.raises(verdict.VerdictMismatch, match="gate failed"):
        steps.promote_step(RunFolder(night.cfg.artifacts, "v4"), night.cfg)
    assert night.store.live() is None


def cli_config(night) -> str:
    """The night's config as a file: the CLI must run with the config the verdicts were bound to."""
    path = Path(night.cfg.artifacts).parent / "night.yaml"
    path.write_text(yaml.safe_dump(night.cfg.model_dump(mode="json")))
    return str(path)


def test_rollback_goes_back_to_the_previous_promoted_version_and_is_logged(night, capsys):
    artifacts = night.cfg.artifacts
    for v in ("20260101-020000", "20260102-020000", "20260103-020000"):
        night(v)
        steps.promote_step(RunFolder(night.cfg.artifacts, v), night.cfg)
    assert main(["--config", cli_config(night), "rollback", "--artifacts", artifacts, "--backend", "embedded"]) == 0
    assert "20260103-020000 -> 20260102-020000" in capsys.readouterr().out
    assert night.store.live() == "20260102-020000"
    record = night.store.promotions()[-1]
    assert (record["version"], record["previous"], record["actor"]) == (
        "20260102-020000",
        "20260103-020000",
        "rollback",
    )
    # the version the rollback left is promoted again only when forced (a script promoting "the newest passed run")
    with pytest.raises(verdict.VerdictMismatch, match="a rollback moved LIVE away from it .* by rollback"):
        steps.promote_step(RunFolder(artifacts, "20260103-020000"), night.cfg)
    assert night.store.live() == "20260102-020000"
    # a second rollback goes further back, never to the version the first one left
    assert steps.rollback_step(Path(night.cfg.artifacts), night.cfg)["version"] == "20260101-020000"
    with pytest.raises(ValueError, match="no earlier promoted version"):
        steps.rollback_step(Path(night.cfg.artifacts), night.cfg)
    # an explicit target goes anywhere logged; promoted again, a version left by a rollback is a target again
    assert steps.rollback_step(Path(night.cfg.artifacts), night.cfg, "20260103-020000")["version"] == "20260103-020000"
    args = [
        "--config",
        cli_config(night),
        "promote",
        "20260102-020000",
        "--artifacts",
        artifacts,
        "--backend",
        "embedded",
    ]
    assert main(args) == 2  # left by the rollback to 01 (and older than LIVE: that is a rollback anyway)
    night("20260104-020000")
    steps.promote_step(RunFolder(night.cfg.artifacts, "20260104-020000"), night.cfg)
    assert steps.rollback_step(Path(night.cfg.artifacts), night.cfg)["version"] == "20260103-020000"


def test_rollback_refuses_failed_corrupt_or_unknown_targets(night, capsys):
    artifacts = night.cfg.artifacts
    night("v1", passed=False)
    night("v2")
    steps.promote_step(RunFolder(night.cfg.artifacts, "v2"), night.cfg)
    night("v3")
    steps.promote_step(RunFolder(night.cfg.artifacts, "v3"), night.cfg)
    assert main(["rollback", "v1", "--artifacts", artifacts, "--backend", "embedded"]) == 2
    assert "never promoted" in capsys.readouterr().err
    assert main(["rollback", "v1", "--force", "--artifacts", artifacts, "--backend", "embedded"]) == 2
    assert "its gate failed" in capsys.readouterr().err
    npy = night.store.folder("v2") / "embeddings.npy"
    npy.write_bytes(npy.read_bytes()[:-8])
    assert main(["rollback", "--artifacts", artifacts, "--backend", "embedded"]) == 2  # the default target, v2
    err = capsys.readouterr().err
    assert "embeddings.npy" in err and "Traceback" not in err
    assert main(["rollback", "v3", "--artifacts", artifacts, "--backend", "embedded"]) == 2
    assert "already the live version" in capsys.readouterr().err
    assert night.store.live() == "v3" and [r["actor"] for r in night.store.promotions()] == ["cli", "cli"]


def test_verify_takes_the_run_folder_a_night_printed_and_says_what_to_do_when_it_fails(night, capsys):
    night("20260101-020000")
    printed = f"{night.cfg.artifacts}/runs/20260101-020000"  # `artifacts: …/runs/<id>`, as `run` prints it
    assert main(["verify", printed, "--artifacts", night.cfg.artifacts, "--backend", "embedded"]) == 0
    assert "20260101-020000: ok" in capsys.readouterr().out
    npy = night.store.folder("20260101-020000") / "embeddings.npy"
    npy.write_bytes(npy.read_bytes()[:-8])
    assert main(["verify", printed, "--artifacts", night.cfg.artifacts, "--backend", "embedded"]) == 2
    assert "restore the files, or move LIVE off it (sourcegate rollback)" in capsys.readouterr().err


def test_rollback_with_no_history_says_so(night, capsys):
    assert main(["rollback", "--artifacts", night.cfg.artifacts, "--backend", "embedded"]) == 2
    assert "no earlier promoted version" in capsys.readouterr().err


def test_a_torn_last_line_of_the_log_is_skipped(tmp_path):
    path = tmp_path / promotions.PROMOTIONS_LOG
    promotions.append_record({"version": "a"}, path)
    with open(path, "a") as fh:
        fh.write('{"version": "b"')  # a crash mid-append
    assert promotions.read_records(path) == [{"version": "a"}]
    promotions.append_record({"version": "c"}, path)  # the next record still gets a line of its own
    assert promotions.read_records(path) == [{"version": "a"}, {"version": "c"}]


def test_a_record_whose_text_holds_a_unicode_line_separator_reads_back_whole(tmp_path):
    path = tmp_path / promotions.PROMOTIONS_LOG
    for version, actor in (("a", "ops\u2028on call"), ("b", "cli\x85"), ("c", "cli")):
        promotions.append_record(promotions.promotion_record(version, None, None, actor), path)
    assert [(r["version"], r["actor"]) for r in promotions.read_records(path)] == [
        ("a", "ops\u2028on call"),
        ("b", "cli\x85"),
        ("c", "cli"),
    ]


def test_rollback_to_a_version_never_promoted_needs_force_and_is_logged_with_its_actor(night, capsys):
    night("20260101-020000")
    night("20260102-020000")
    steps.promote_step(RunFolder(night.cfg.artifacts, "20260102-020000"), night.cfg)
    with pytest.raises(verdict.VerdictMismatch, match="never promoted"):
        steps.rollback_step(Path(night.cfg.artifacts), night.cfg, "20260101-020000")
    record = steps.rollback_step(Path(night.cfg.artifacts), night.cfg, "20260101-020000", force=True, actor="ops:alice")
    assert night.store.live() == "20260101-020000"
    assert (record["actor"], record["forced"], record["kind"]) == ("ops:alice", True, "rollback")
    assert night.store.promotions()[-1] == record


def test_rollback_checks_the_full_binding_and_goes_past_what_judged_it_only_when_forced(night, capsys):
    """A baseline accepted since and a code upgrade change what judged the version, not what it serves: refused,
    naming them, unless --force, which logs them with the actor. Its altered content or a decision today's config
    could not serve are refused even then."""
    for v in ("20260101-020000", "20260102-020000"):
        night(v)
        steps.promote_step(RunFolder(night.cfg.artifacts, v), night.cfg)
    night.baseline.write_text(night.baseline.read_text() + " ")  # a new baseline since the verdict
    gate_path = RunFolder(night.cfg.artifacts, "20260101-020000").path / "gate.json"
    gate = json.loads(gate_path.read_text())
    gate["evaluated"]["code_version"] = "0.0.9+src.000000000000"  # judged by the code before an upgrade
    gate_path.write_text(json.dumps(gate))
    with pytest.raises(verdict.VerdictMismatch, match="baseline") as refused:
        steps.rollback_step(Path(night.cfg.artifacts), night.cfg, "20260101-020000")
    assert "code_version: the code changed" in str(refused.value) and "--force rolls back anyway" in str(refused.value)
    assert night.store.live() == "20260102-020000"

    args = ["--config", cli_config(night), "rollback", "20260101-020000", "--artifacts", night.cfg.artifacts]
    assert main([*args, "--backend", "embedded", "--force", "--actor", "ops:alice"]) == 0
    out = capsys.readouterr().out
    assert "20260102-020000 -> 20260101-020000" in out and "judged since its verdict (forced): the baseline" in out
    record = night.store.promotions()[-1]
    assert (record["version"], record["actor"], record["forced"]) == ("20260101-020000", "ops:alice", True)
    assert [c.split(" ")[:2] for c in record["judged_since"]] == [["the", "baseline"], ["code_version:", "the"]]
    assert night.store.live() == "20260101-020000"

    # forced or not: never a decision today's config could not serve, never a version whose content changed
    other = config.replace(night.cfg, {"answer.adjacent": 0.3})
    with pytest.raises(
        verdict.VerdictMismatch, match=r"could not be served: answer.adjacent: .* \(proven\) vs 0.3 \(config\)"
    ):
        steps.rollback_step(Path(night.cfg.artifacts), other, "20260102-020000", force=True)
    second = RunFolder(night.cfg.artifacts, "20260102-020000").path / "gate.json"
    altered = json.loads(second.read_text())
    altered["evaluated"]["manifest_sha256"] = "0" * 64
    second.write_text(json.dumps(altered))
    with pytest.raises(verdict.VerdictMismatch, match="rebuilt or changed"):
        steps.rollback_step(Path(night.cfg.artifacts), night.cfg, "20260102-020000", force=True)
    assert night.store.live() == "20260101-020000"


def test_the_verdict_names_a_changed_code_version_or_model(night):
    night("20260101-020000")
    gate_path = RunFolder(night.cfg.artifacts, "20260101-020000").path / "gate.json"
    gate = json.loads(gate_path.read_text())
    assert gate["evaluated"]["code_version"].startswith("0.1.0+src.")
    for field in ("code_version", "reranker_fingerprint", "embedder_fingerprint", "answer_model_fingerprint"):
        edited = {**gate, "evaluated": {**gate["evaluated"], field: "something else"}}
        gate_path.write_text(json.dumps(edited))
        with pytest.raises(verdict.VerdictMismatch, match=f"{field}: "):
            steps.promote_step(RunFolder(night.cfg.artifacts, "20260101-020000"), night.cfg)
    assert night.store.live() is None


@pytest.mark.parametrize("crash_at", ["promote:swapped", "promote:logged"])
def test_a_promotion_retried_after_a_crash_logs_once_and_repairs_run_json(night, monkeypatch, crash_at):
    """The crash is an exception at the named kill point (sourcegate/pipelines/faults.py), then the same promote again."""
    from sourcegate.pipelines import faults

    night("20260101-020000")
    steps.promote_step(RunFolder(night.cfg.artifacts, "20260101-020000"), night.cfg)
    night("20260102-020000")

    def crash(point):
        if point == crash_at:
            raise SystemExit(f"killed at {point}")

    monkeypatch.setattr(faults, "reached", crash)
    with pytest.raises(SystemExit):
        steps.promote_step(RunFolder(night.cfg.artifacts, "20260102-020000"), night.cfg)
    run_json = RunFolder(night.cfg.artifacts, "20260102-020000").path / "run.json"
    assert not run_json.exists() and night.store.live() == "20260102-020000"
    monkeypatch.undo()
    steps.promote_step(RunFolder(night.cfg.artifacts, "20260102-020000"), night.cfg)  # the retry
    log = night.store.promotions()
    assert [(r["version"], r["previous"]) for r in log] == [
        ("20260101-020000", None),
        ("20260102-020000", "20260101-020000"),
    ]
    info = json.loads(run_json.read_text())
    assert info["promoted"]["version"] == "20260102-020000"
    assert info["promoted"]["replaced"] == log[-1]["previous"]


def test_the_live_nights_verdict_stands_when_the_night_runs_again(night):
    """Re-running the live night (a promotion cut short, a cleared DAG run) never judges the served version again in
    its folder: a failed re-gate would leave LIVE on a verdict that refuses to serve it. Evaluate does nothing, the
    gate returns the verdict as it stands, and promote only finishes what was cut short."""
    night("20260101-020000")
    steps.promote_step(RunFolder(night.cfg.artifacts, "20260101-020000"), night.cfg)
    run = RunFolder(night.cfg.artifacts, "20260101-020000")
    before = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    assert steps.evaluate_step(run, night.cfg) == {}
    assert steps.gate_step(run, night.cfg) == json.loads(before["gate.json"])
    assert steps.promote_step(run, night.cfg) == "20260101-020000"
    assert {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == before
    assert [r["version"] for r in night.store.promotions()] == ["20260101-020000"]
    # a night that is not live is judged as ever: its gate writes its own verdict
    night("20260102-020000")
    assert steps.standing_verdict(RunFolder(night.cfg.artifacts, "20260102-020000"), night.cfg) is None


def test_a_decision_edited_in_gate_json_is_not_promoted_or_rolled_back_to(night):
    """The threshold gate.json records is what serve applies and promote publishes: edited by hand (0.5 for the
    0.14 its night placed), it is refused, naming the value and what the night's calibration.json makes of it."""
    for v in ("20260101-020000", "20260102-020000"):
        gate = night(v)
        folder = RunFolder(night.cfg.artifacts, v).path
        calibration = {"shipped": {"signal": "rerank_top", "threshold": 0.14, "strong_threshold": 0.5}}
        write_json(calibration, folder / "calibration.json")
        write_json(
            {**gate, "decision": decision.proven(night.cfg, calibration, gate["evaluated"])}, folder / "gate.json"
        )
    steps.promote_step(RunFolder(night.cfg.artifacts, "20260101-020000"), night.cfg)
    second = RunFolder(night.cfg.artifacts, "20260102-020000").path / "gate.json"
    gate = json.loads(second.read_text())
    write_json({**gate, "decision": {**gate["decision"], "adjacent": 0.5}}, second)
    with pytest.raises(
        verdict.VerdictMismatch, match="decision is not what its night computed .* adjacent: 0.5 recorded vs 0.14"
    ):
        steps.promote_step(RunFolder(night.cfg.artifacts, "20260102-020000"), night.cfg)
    write_json(gate, second)
    steps.promote_step(RunFolder(night.cfg.artifacts, "20260102-020000"), night.cfg)
    first = RunFolder(night.cfg.artifacts, "20260101-020000").path / "gate.json"
    edited = json.loads(first.read_text())
    write_json({**edited, "decision": {**edited["decision"], "signal": "cosine_top"}}, first)
    with pytest.raises(
        verdict.VerdictMismatch, match="refusing to roll back to 20260101-020000: its gate.json decision"
    ):
        steps.rollback_step(Path(night.cfg.artifacts), night.cfg)
    assert night.store.live() == "20260102-020000"
