"""`sourcegate init` on a corpus of one's own: a config with nothing learned elsewhere and the gating signal chosen
by rule, eval sets pre-filled from the reviewed off-topic pool (fit and check halves), borrowing candidates kept
apart for review, and a first night that stops before scoring while the sets cannot judge it (exit 2, what to write)."""

import json
from pathlib import Path

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


def test_init_writes_one_config_wherever_it_runs_and_holds_only_off_topic_to_the_gap(
    small_corpus, tmp_path, monkeypatch, capsys
):
    """Run in the repository (where the demo's config/pipeline.yaml is) or in a folder of one's own, init starts from
    the same defaults. Run elsewhere it once gated near-topic questions too, against what it tells the user."""
    repo = Path(__file__).resolve().parents[1]
    written = {}
    for where in (repo, tmp_path):
        monkeypatch.chdir(where)
        out = tmp_path / f"from-{where.name}"
        assert main(["init", str(small_corpus), "--out", str(out)]) == 0
        written[where] = (out / "pipeline.yaml").read_text(encoding="utf-8").replace(str(out), "OUT")
    capsys.readouterr()
    assert written[repo] == written[tmp_path]
    cfg = config.load(tmp_path / f"from-{tmp_path.name}" / "pipeline.yaml")
    assert cfg.calibration.gate_decline_kinds == ["off_topic"]  # near_topic and borrowing: scored and reported
    assert cfg.answer.strong_signal == "rerank_top"  # `sourced`: the cross-encoder's probability, on any corpus


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


def test_init_on_a_beir_dataset_writes_its_judged_queries_as_should_answer_questions(tmp_path, capsys):
    data = tmp_path / "dataset"
    (data / "qrels").mkdir(parents=True)
    docs = [
        {"_id": f"d{i}", "title": f"Study {i}", "text": f"Finding number {i} about aspirin and sleep."}
        for i in range(6)
    ]
    (data / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs) + '{"_id": "bad", "text": ""}\n')
    queries = {f"q{i}": f"claim {i}" for i in range(6)}
    (data / "queries.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in queries.items()))
    judgements = [("q0", "d0", 1), ("q1", "d1", 2), ("q1", "d2", 0), ("q2", "bad", 1), ("q3", "d3", 1), ("q4", "d4", 1)]
    judgements += [("q4", "gone", 1), ("q5", "d5", 1)]
    (data / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in judgements)
    )
    out = tmp_path / "mine"
    assert main(["init", str(data), "--format", "beir", "--judged", "test", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "hold 3 and 2 of the 'test' split's judged queries" in printed and "1 left out" in printed
    assert "write at least 17 more should-answer questions" in printed  # calibration.min_per_label 20, 3 there
    fit, check = (load_evalset(out / "evals" / f"{name}.jsonl") for name in ("fit", "check"))
    answers = [(q["id"], q["expected"]) for q in fit + check if q["label"] == "answer"]
    # qrels order, alternating; a relevance-0 judgement is no label; q2's only document is quarantined (empty text)
    assert answers == [
        ("test-q0", ["d0"]),
        ("test-q3", ["d3"]),
        ("test-q5", ["d5"]),
        ("test-q1", ["d1"]),
        ("test-q4", ["d4"]),
    ]
    assert all(
        q["kind"] == "judged" and q["question"] == queries[q["id"][5:]] for q in fit + check if q["label"] == "answer"
    )

    sampled = []
    for name in ("few", "few-again"):  # at most --judged-max, a seeded sample in the file's order: the same each time
        assert (
            main(
                [
                    "init",
                    str(data),
                    "--format",
                    "beir",
                    "--judged",
                    "test",
                    "--judged-max",
                    "4",
                    "--out",
                    str(tmp_path / name),
                ]
            )
            == 0
        )
        printed = capsys.readouterr().out
        assert (
            "hold 2 and 2 of the 'test' split's judged queries" in printed and "a sample of 4 of 5, seed 13" in printed
        )
        rows = [load_evalset(tmp_path / name / "evals" / f"{s}.jsonl") for s in ("fit", "check")]
        sampled.append([q["id"] for r in rows for q in r if q["label"] == "answer"])
    assert sampled[0] == sampled[1] and len(set(sampled[0]) & {i for i, _ in answers}) == 4

    assert main(["init", str(data), "--format", "beir", "--out", str(tmp_path / "unjudged")]) == 0
    assert "this dataset has judged queries (qrels: test): init with `--judged test`" in capsys.readouterr().out
    assert not [q for q in load_evalset(tmp_path / "unjudged" / "evals" / "fit.jsonl") if q["label"] == "answer"]

    assert main(["init", str(data), "--judged", "test", "--out", str(tmp_path / "markdown")]) == 2
    assert "judged queries come from a BEIR dataset's qrels (--format beir)" in capsys.readouterr().err


def test_init_writes_the_pool_topics_a_corpus_covers_as_near_topic(small_corpus, tmp_path, capsys):
    out = tmp_path / "mine"
    assert main(["init", str(small_corpus), "--out", str(out), "--near-topic", "health, cooking"]) == 0
    printed = capsys.readouterr().out
    both = load_evalset(out / "evals" / "fit.jsonl") + load_evalset(out / "evals" / "check.jsonl")
    near = {q["id"] for q in both if q["kind"] == "near_topic"}
    pool = load_evalset(POOL)
    assert near == {q["id"] for q in pool if {"health", "cooking"} & set(q["topics"])} and len(near) == 15
    assert {q["id"] for q in both if q["kind"] == "off_topic"} == {q["id"] for q in pool} - near
    gated_fit = sum(q["kind"] == "off_topic" for q in load_evalset(out / "evals" / "fit.jsonl"))
    assert (
        f"{gated_fit} off-topic questions from the pool" in printed and "written near_topic: health, cooking" in printed
    )

    assert main(["init", str(small_corpus), "--out", str(tmp_path / "other"), "--near-topic", "medicine"]) == 2
    assert "--near-topic medicine: the pool's topics are coding, cooking" in capsys.readouterr().err
