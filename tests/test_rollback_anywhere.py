"""A verdict judges content, not locations: a version is promoted or rolled back from wherever it was built.

`run --corpus <folder>`, a DAG (every path absolute, connection ids set: sourcegate/dags/common.py) and the CLI from the
project root (paths relative to it) are one judged config. A real difference is refused naming each key with the
judged value and today's (sourcegate/pipelines/release/verdict.py).
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from sourcegate.artifact_io import read_json
from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines import config
from sourcegate.pipelines.app import steps
from sourcegate.pipelines.app.cli import main
from sourcegate.pipelines.app.factories import open_store
from sourcegate.pipelines.release import verdict
from tests.promotable import promotable_args
from tests.test_embedded_backend import synthetic_chunks
from tests.test_verdicts import INPUTS, pass_gate

ROOT = Path(__file__).resolve().parents[1]


def dag_path_keys() -> tuple[str, ...]:
    """sourcegate/dags/common.py's PATH_KEYS, read from the file (importing it needs Airflow)."""
    tree = ast.parse((ROOT / "sourcegate" / "dags" / "common.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PATH_KEYS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("sourcegate/dags/common.py defines no PATH_KEYS")


def dag_style(cfg: config.PipelineConfig) -> config.PipelineConfig:
    """What sourcegate.dags.common.load_config makes of the same file: every path absolute, both connection ids set."""
    paths = {}
    for key in dag_path_keys():
        value = config.get(cfg, key)
        if value is not None and not Path(value).is_absolute():
            paths[key] = str(ROOT / value)
    conns = {"backend.opensearch.airflow_conn_id": "opensearch_default", "artifacts_airflow_conn_id": "aws_default"}
    return config.replace(cfg, {**paths, **conns})


@pytest.fixture
def build(make_cfg, tmp_path):
    """build(cfg, version): a loaded version with a passed verdict bound under `cfg` (as evaluate + gate bind it)."""
    synthetic_chunks(tmp_path / "c.parquet", n=9)

    def make(cfg: config.PipelineConfig, version: str) -> dict:
        open_store(cfg).load(version, str(tmp_path / "c.parquet"), inputs=INPUTS)
        return pass_gate(cfg, version)

    return make


def test_the_judged_config_leaves_out_exactly_the_dags_locations_and_connection_ids():
    """Every key the DAGs rewrite is a location whose content is bound on its own; nothing else is left out."""
    conns = {"artifacts_airflow_conn_id", "backend.opensearch.airflow_conn_id"}
    assert set(verdict.LOCATION_KEYS) == set(dag_path_keys()) | conns
    judged = verdict.judged_config(config.load(ROOT / "config" / "pipeline.yaml"))
    assert "retrieval.rrf_k" in judged and "answer.adjacent" in judged and "corpus.format" in judged
    assert not set(judged) & set(verdict.LOCATION_KEYS)
    assert not set(judged) & set(verdict.NOT_JUDGED)  # retraining's trigger: no night's score depends on it


def test_a_dag_built_version_is_promoted_from_the_cli_and_the_other_way_round(make_cfg, build):
    cli = make_cfg()  # the project's config, its paths relative to the project root
    dag = dag_style(cli)
    assert dag.evals.calibration_set.startswith("/") and dag.artifacts_airflow_conn_id == "aws_default"
    assert verdict.config_hash(dag) == verdict.config_hash(cli)
    build(dag, "20260101-020000")
    assert (
        steps.promote_step(RunFolder(cli.artifacts, "20260101-020000"), cli) == "20260101-020000"
    )  # a DAG's night, promoted by hand
    build(cli, "20260102-020000")
    assert (
        steps.promote_step(RunFolder(dag.artifacts, "20260102-020000"), dag) == "20260102-020000"
    )  # a CLI night, promoted by a DAG
    assert (
        steps.rollback_step(Path(cli.artifacts), cli)["version"] == "20260101-020000"
    )  # and rolled back from the project root


def test_a_night_built_with_another_corpus_folder_rolls_back_from_the_project_config(make_cfg, build, tmp_path):
    """`run --corpus <folder>` three nights, then `rollback` (no --corpus): the corpus is in each version's manifest."""
    elsewhere = make_cfg(**{"corpus.path": str(tmp_path / "my-corpus")})
    for version in ("20260101-020000", "20260102-020000", "20260103-020000"):
        build(elsewhere, version)
        steps.promote_step(RunFolder(elsewhere.artifacts, version), elsewhere)
    project = make_cfg()
    assert project.corpus.path != elsewhere.corpus.path
    assert steps.rollback_step(Path(project.artifacts), project)["version"] == "20260102-020000"
    # the command line, with or without --corpus (accepted by rollback and promote as by run)
    cli = [*promotable_args(), "rollback", "--artifacts", project.artifacts, "--backend", "embedded"]
    assert main([*cli, "20260101-020000", "--corpus", str(tmp_path / "my-corpus")]) == 0
    assert open_store(project).live() == "20260101-020000"
    assert main([*cli, "20260103-020000"]) == 0
    assert open_store(project).live() == "20260103-020000"


def test_a_real_config_difference_is_refused_naming_each_key_with_both_values(make_cfg, build, capsys):
    cfg = make_cfg()
    build(cfg, "20260101-020000")
    changed = config.replace(cfg, {"retrieval.rrf_k": 60, "calibration.pair": ["margin", "bm25_top"]})
    with pytest.raises(verdict.VerdictMismatch) as refused:
        steps.promote_step(RunFolder(changed.artifacts, "20260101-020000"), changed)
    message = str(refused.value)
    assert "retrieval.rrf_k: 5 (judged) vs 60 (now)" in message
    assert 'calibration.pair: ["bm25_z", "term_coverage"] (judged) vs ["margin", "bm25_top"] (now)' in message
    assert "corpus.path" not in message and "artifacts" not in message
    # the same from the command line: exit 2, the key and both values on stderr
    cli = [
        *promotable_args(),
        "--set",
        "retrieval.rrf_k=60",
        "promote",
        "20260101-020000",
        "--artifacts",
        cfg.artifacts,
    ]
    assert main([*cli, "--backend", "embedded"]) == 2
    assert "retrieval.rrf_k: 5 (judged) vs 60 (now)" in capsys.readouterr().err
    assert open_store(cfg).live() is None


def test_how_the_product_operates_is_not_judged_so_a_longer_lock_wait_still_promotes(make_cfg, build):
    """`run --no-promote --lock-timeout 600`, then `promote`; a retention changed between a night and its rollback.
    A verdict recorded while these keys were judged holds them, and they are not compared either."""
    cfg = make_cfg()
    build(cfg, "20260101-020000")
    operating = {
        "lock.timeout_s": 600,
        "backend.retention": 9,
        "backend.keep_failed_days": 1,
        "answer.calibrated_by": "x",
    }
    assert set(operating) <= set(verdict.OPERATING) and not set(verdict.judged_config(cfg)) & set(verdict.OPERATING)
    waits = config.replace(cfg, {"lock.timeout_s": 600})
    assert steps.promote_step(RunFolder(cfg.artifacts, "20260101-020000"), waits) == "20260101-020000"
    build(cfg, "20260102-020000")
    cli = [*promotable_args(), "promote", "20260102-020000", "--artifacts", cfg.artifacts, "--backend", "embedded"]
    assert main([*cli, "--lock-timeout", "600"]) == 0
    recorded = {**verdict.judged_config(cfg), "lock.timeout_s": 30, "backend.retention": 3}  # as judged before
    assert verdict.config_differences(recorded, verdict.judged_config(config.replace(cfg, operating))) == []
    assert verdict.config_differences(recorded, verdict.judged_config(config.replace(cfg, {"retrieval.rrf_k": 60})))


def test_each_left_out_location_is_still_bound_by_its_content(make_cfg, build, tmp_path):
    """Moving a file is no change; pointing the key at other content is refused (eval set, baseline, combiner,
    answer model)."""
    cfg = make_cfg()
    build(cfg, "20260101-020000")
    moved = tmp_path / "moved"
    moved.mkdir()
    copies = {}
    for key in ("evals.calibration_set", "evals.baseline", "answerability.combiner"):
        copies[key] = str(shutil.copy(config.get(cfg, key), moved / f"{key}.copy"))
    assert verdict.mismatches(*bound_and_now(cfg, config.replace(cfg, copies), "20260101-020000")) == []
    others = {
        "evals.calibration_set": (cfg.evals.precision_set, "eval set calibration"),
        "evals.baseline": (str(shutil.copy(ROOT / "config/baselines/precision.json", moved / "b.json")), None),
        "answerability.answer_model_path": ("models/answer_in_domain", "answer_model_fingerprint"),
    }
    (moved / "b.json").write_text("{}")
    others["evals.baseline"] = (str(moved / "b.json"), "the baseline")
    for key, (value, message) in others.items():
        problems = verdict.mismatches(*bound_and_now(cfg, config.replace(cfg, {key: value}), "20260101-020000"))
        assert any(message in p for p in problems), (key, problems)


def bound_and_now(judged_cfg: config.PipelineConfig, now_cfg: config.PipelineConfig, version: str) -> tuple:
    gate = read_json(RunFolder(judged_cfg.artifacts, version).path / "gate.json")
    manifest = open_store(judged_cfg).manifest(version)
    return gate["evaluated"], verdict.current_binding(now_cfg, manifest, gate["evaluated"], now_cfg.artifacts)


@pytest.mark.models
def test_three_real_nights_with_run_corpus_then_rollback_from_the_project_config(tmp_path, capsys):
    """`sourcegate run --corpus <folder>` three nights, then `sourcegate rollback` with no --corpus: exit 0."""
    corpus = shutil.copytree(ROOT / "corpus" / "demo", tmp_path / "my-corpus")
    artifacts = str(tmp_path / "artifacts")
    nights = ("20261101-020000", "20261102-020000", "20261103-020000")
    for run_id in nights:
        args = ["run", "--corpus", str(corpus), "--artifacts", artifacts, "--run-id", run_id, "--quiet"]
        assert main([*promotable_args(), *args]) == 0, capsys.readouterr()
    assert main([*promotable_args(), "rollback", "--artifacts", artifacts]) == 0, capsys.readouterr().err
    assert f"{nights[2]} -> {nights[1]}" in capsys.readouterr().out


def test_a_verdict_recorded_before_the_judged_values_still_binds_by_its_hash(make_cfg, build):
    """gate.json written before this change: config_sha256 over every key but `artifacts` and its connection id,
    eval sets by path. An unchanged config promotes it; a changed one is refused."""
    from sourcegate.artifact_io import write_json

    cfg = make_cfg()
    gate = build(cfg, "20260101-020000")
    old = {k: v for k, v in gate["evaluated"].items() if k not in ("config", "eval_set_sha256", "reused")}
    old["config_sha256"] = verdict.legacy_config_hash(cfg)
    write_json({**gate, "evaluated": old}, RunFolder(cfg.artifacts, "20260101-020000").path / "gate.json")
    with pytest.raises(verdict.VerdictMismatch, match="before it recorded its values"):
        steps.promote_step(
            RunFolder(config.replace(cfg, {"retrieval.rrf_k": 60}).artifacts, "20260101-020000"),
            config.replace(cfg, {"retrieval.rrf_k": 60}),
        )
    assert steps.promote_step(RunFolder(cfg.artifacts, "20260101-020000"), cfg) == "20260101-020000"
