"""`sourcegate init` on a corpus of one's own: a config with nothing learned elsewhere and the gating signal chosen
by rule, eval sets pre-filled from the reviewed off-topic pool (fit and check halves), borrowing candidates kept
apart for review, and a first night that stops before scoring while the sets cannot judge it (exit 2, what to write)."""

import json

import yaml

from sourcegate.evals.evalset import load_evalset
from sourcegate.pipelines import config
from sourcegate.pipelines.app.cli import main
from sourcegate.pipelines.app.scaffold import POOL


def test_init_scaffolds_a_corpus_and_its_first_night_says_what_to_write(small_corpus, tmp_path, capsys):
    out = tmp_path / "mine"
    assert main(["init", str(small_corpus), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'pipeline.yaml'}" in printed and "sourcegate --config" in printed
    assert "against your corpus's domain" in printed  # a pool question a domain reaches is near_topic, not gated

    cfg = config.load(out / "pipeline.yaml")
    assert cfg.answer.signal == "auto" and cfg.answerability.answer_model_path is None
    assert cfg.answerability.combiner is None and cfg.evals.baseline is None
    assert cfg.corpus.path == str(small_corpus.resolve()) and cfg.artifacts == str(out / "artifacts")

    fit, check, pool = load_evalset(out / "evals" / "fit.jsonl"), load_evalset(out / "evals" / "check.jsonl"), None
    pool = load_evalset(POOL)
    assert {q["id"] for q in fit} | {q["id"] for q in check} == {q["id"] for q in pool}
    assert not {q["id"] for q in fit} & {q["id"] for q in check}  # the check set's never chose anything
    candidates = load_evalset(out / "evals" / "candidates.jsonl")
    assert candidates and all(q["label"] == "decline" and q["kind"] == "borrowing" for q in candidates)
    sections = (out / "sections.tsv").read_text(encoding="utf-8").splitlines()
    documents = {p.stem for p in small_corpus.glob("*.md")}
    assert {line.split("\t")[0].split("#")[0] for line in sections[1:]} == documents

    # the first night, before any should-answer question is written: stopped after chunking, nothing scored
    code = main(["--config", str(out / "pipeline.yaml"), "run", "--no-promote", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "nothing was scored" in err
    assert f"0 should-answer question(s), {cfg.calibration.min_per_label} needed" in err
    runs = list((out / "artifacts" / "runs").iterdir())
    assert len(runs) == 1 and not (runs[0] / "chunks.parquet").exists()  # stopped before embedding
    assert not (out / "artifacts" / "LIVE").exists()


def test_init_never_overwrites_a_config(small_corpus, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "pipeline.yaml").write_text(yaml.safe_dump({"corpus": {"path": "x"}}))
    assert main(["init", str(small_corpus), "--out", str(out)]) == 2
    assert "never overwrites" in capsys.readouterr().err
    assert json.dumps(yaml.safe_load((out / "pipeline.yaml").read_text())) == '{"corpus": {"path": "x"}}'


def test_init_sets_aside_what_a_night_would_and_says_so(small_corpus, tmp_path, capsys):
    corpus = tmp_path / "with-bad-files"
    corpus.mkdir()
    for p in small_corpus.glob("*.md"):
        (corpus / p.name).write_bytes(p.read_bytes())
    (corpus / "empty.md").write_text("")
    (corpus / "huge-title.md").write_text("# " + "Very long title " * 200 + "\n\nA body.\n")  # degenerate at chunking
    out = tmp_path / "mine"
    assert main(["init", str(corpus), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "quarantined 2 document(s) a night would set aside too (1 degenerate document, 1 empty body)" in printed
    rows = [json.loads(line) for line in (out / "artifacts" / "init" / "quarantine.jsonl").read_text().splitlines()]
    assert {(r["source"], r["stage"]) for r in rows} == {("empty.md", "ingest"), ("huge-title.md", "chunk")}
    sections = (out / "sections.tsv").read_text(encoding="utf-8")
    assert "huge-title" not in sections and "empty" not in sections
