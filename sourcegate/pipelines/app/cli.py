"""`sourcegate` command line: run, promote, query, serve, calibrate, beir, accept, runs, verify, rollback, diff, config-schema."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import traceback
from pathlib import Path

import yaml

from sourcegate.artifact_io import run_folder as rf
from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines import config as config_mod
from sourcegate.pipelines.app.answering import query_notice  # noqa: F401 - where tests and callers have found it
from sourcegate.pipelines.config import PipelineConfig
from sourcegate.pipelines.retrieval import combiner
from sourcegate.pipelines.versions.object_store import is_remote

DEFAULT_CONFIG = "config/pipeline.yaml"
# promote and rollback take --corpus as `run` does; where the corpus lives is not what a verdict judged (the version's
# manifest binds its content), so a night run with --corpus is promoted or rolled back with or without it
CORPUS_HELP = "the corpus folder, as given to `run` (accepted, not needed: the version's manifest binds its content)"
ALL_SIGNALS_HELP = (
    "compute every signal a night measures (concept coverage, sentence cosine, uncovered terms, ...), not only the "
    "ones the proven decision reads: the same decision, slower"
)
OPENSEARCH_CLIENT_LOGGER = "opensearch"  # opensearch-py's per-request log (a warning with a traceback per failure)


def run_id_of(named: str) -> str:
    """A run as a user names it: its id, or the folder or URI a night printed (`<artifacts>/runs/<id>`)."""
    parent, _, last = named.rstrip("/").rpartition("/")
    return last if parent == rf.RUNS or parent.endswith("/" + rf.RUNS) else named


def config_file(args, default: str | None = DEFAULT_CONFIG) -> str | None:
    """The config file a command reads: `--config`, else `default` when it exists (the repository's), else none."""
    return args.config or (default if default and Path(default).exists() else None)


def load_config(args, default: str | None = DEFAULT_CONFIG) -> PipelineConfig:
    """The config of `config_file` (none: the defaults), with the command line's overrides."""
    overrides = {}
    for attr, key in (
        ("backend", "backend.kind"),
        ("artifacts", "artifacts"),
        ("corpus", "corpus.path"),
        ("format", "corpus.format"),
        ("reranker", "reranker.kind"),
    ):
        if getattr(args, attr, None):
            overrides[key] = getattr(args, attr)
    if getattr(args, "lock_timeout", None) is not None:
        overrides["lock.timeout_s"] = args.lock_timeout
    for item in getattr(args, "set", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise config_mod.ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. retrieval.rrf_k=10")
        overrides[key.strip()] = yaml.safe_load(value)  # typed as in the YAML file: 10, 0.6, null, [a, b]
    return config_mod.load(config_file(args, default), overrides)


def cmd_run(args) -> int:
    from sourcegate.pipelines.app.run import run_pipeline

    cfg = load_config(args)
    result = run_pipeline(cfg, run_id=args.run_id, progress=not args.quiet, promote=not args.no_promote)
    print(("" if args.quiet else "\n") + f"run {result['run_id']}: {result['summary']}")  # a line after the bars
    print(f"gate: {'PASSED' if result['passed'] else 'FAILED'}")
    print(f"  {result['signal']}")
    for reason in result["reasons"]:
        print(f"  - {reason}")
    print(f"artifacts: {result['run_dir']}")
    print(f"report:    {result['run_dir']}/report.html")
    print(f"live index: {result['live']}")
    return 0 if result["passed"] else 1


def cmd_query(args) -> int:
    """Answer under the decision the live version's (or `--index`'s) passed verdict proved; a config value or a
    model on disk that differs is refused (exit 2) unless --unproven, which says so on its first line. Exit 2
    too when the proven decision could not be applied (its gating signal could not be computed)."""
    from sourcegate.evals.evalset import section_label
    from sourcegate.pipelines.app.answering import ask
    from sourcegate.pipelines.app.factories import serving_for

    cfg = load_config(args)
    serving = serving_for(cfg, args.index, unproven=args.unproven, all_signals=args.all_signals)
    answered = ask(cfg, serving, args.question, args.context or [])
    retrieval, answer, payload = answered.retrieval, answered.answer, answered.payload
    notice = payload["notice"]
    code = 0 if answer.applied else 2
    if args.json:
        print(json.dumps(payload, indent=2, sort_keys=True))
        return code
    if notice:
        print(notice)
    print(f"mode: {answer.mode}   ({answer.signal} = {_fmt(answer.value)}, threshold {answer.threshold:g})")
    print(f"query: {retrieval.query}")
    if retrieval.signals.get("uncovered_terms"):  # question terms the top passages do not hold
        print(f"not covered by the top passages: {', '.join(retrieval.signals['uncovered_terms'])}")
    header = f"{'#':>2}  {'bm25':>4}  {'knn':>4}  {'fused':>7}  {'rerank':>7}  passage"
    print(header + "\n" + "-" * len(header))
    for i, c in enumerate(answer.passages, 1):
        print(
            f"{i:>2}  {_fmt(c.bm25_rank, 'd'):>4}  {_fmt(c.knn_rank, 'd'):>4}  {c.fused_score:7.4f}  "
            f"{_fmt(c.rerank_probability):>7}  {section_label(c.doc_id, c.section_id)}"
        )
    if answer.mode in ("decline", "open"):
        print("(declined: the closest candidates are shown so the refusal can be checked)")
    return code


def cmd_serve(args) -> int:
    """Answer over HTTP what `query` answers (sourcegate/pipelines/app/serve.py), until SIGINT or SIGTERM."""
    from sourcegate.pipelines.app.serve import serve

    return serve(load_config(args), args.host, args.port, unproven=args.unproven, all_signals=args.all_signals)


def _fmt(value, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def version_searcher(cfg: PipelineConfig, index: Path):
    """A searcher over the version a run folder names: the folder's own index (embedded, verified against its
    manifest) or, on a server, the index version named by the run id."""
    from sourcegate.pipelines.app.factories import open_store
    from sourcegate.pipelines.search.embedded import open_run_folder

    return open_run_folder(index) if cfg.backend.kind == "embedded" else open_store(cfg).open(index.name)


def cmd_calibrate(args) -> int:
    from sourcegate.evals import check_log
    from sourcegate.evals.gate import gating_signal_text
    from sourcegate.evals.harness import evaluate, gate_for_dir
    from sourcegate.pipelines.app.factories import judging, retriever_for
    from sourcegate.pipelines.app.steps import answer_model_corpus
    from sourcegate.pipelines.release import verdict

    cfg = load_config(args)
    index = Path(args.index)
    searcher = version_searcher(cfg, index)
    retriever, _ = retriever_for(cfg, searcher)
    kept_files, refused = verdict.bound_kept_files(index)
    for why_not in refused.values():
        print(f"not reusing kept values: {why_not}", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    evaluated = evaluate(
        retriever,
        index / rf.CHUNKS,
        judging(cfg),
        out,
        calibration_set=args.questions,
        precision_set=args.questions,
        progress=not args.quiet,
        before_sweep=combiner.before_sweep(retriever, cfg, out, refit=True),  # a candidate; `accept` adopts it
        kept_from=kept_files,  # the night's vectors and pair scores its verdict bound: reused, not recomputed
        answer_model_corpus=answer_model_corpus(cfg, index / rf.CHUNKS),
    )
    reused = ", ".join(f"{name} {part['reused']}" for name, part in evaluated["kept"].items())
    print(f"reused from {index}: {reused or 'nothing'}")
    print("seconds by stage: " + ", ".join(f"{stage} {s:.1f}" for stage, s in evaluated["stages_s"].items()))
    scorings = Path(cfg.artifacts) / check_log.LOG  # a calibration's look at the check set counts too: logged by
    check = [cfg.evals.check_set] if cfg.evals.check_set else []
    facts = verdict.evaluated(cfg, getattr(searcher, "manifest", None), check)  # the check set's content hash
    gate = gate_for_dir(judging(cfg), out, {"index": str(index), "questions": args.questions}, scorings, facts)
    print(f"gate: {'PASSED' if gate['passed'] else 'FAILED'}")
    print(f"  {gating_signal_text(gate)}")
    for reason in gate["reasons"]:
        print(f"  - {reason}")
    print(f"calibration: {out / rf.CALIBRATION}\nreport: {out / rf.REPORT}")
    if (out / rf.COMBINER).exists():
        print(f"answerability combiner (not in use until accepted): {out / rf.COMBINER}")
    return 0 if gate["passed"] else 1


def cmd_beir(args) -> int:
    from sourcegate.pipelines.app.beir import run_beir

    cfg = load_config(args)
    result = run_beir(
        cfg,
        Path(args.dataset),
        Path(args.out),
        decline=args.decline,
        rerank_depth=args.rerank_depth,
        progress=not args.quiet,
        split=args.split,
    )
    print(json.dumps(result["systems"], indent=2))
    print(f"results: {Path(args.out) / 'beir.json'}")
    return 0


def cmd_accept(args) -> int:
    """Accept a run's per-question precision and decline outcomes as the baseline (with `--artifacts s3://…`,
    RUN is a run id on the store, read under its lock object); a new decision retires the check set it saw and
    switches in the next-check set (sourcegate/pipelines/app/accepting.py)."""
    from sourcegate.artifact_io import read_json
    from sourcegate.pipelines.app import staging
    from sourcegate.pipelines.app.accepting import accept_run
    from sourcegate.pipelines.release.lock import writer_lock

    cfg = load_config(args)
    remote = is_remote(cfg.artifacts)
    if not remote and not args.artifacts and Path(args.run).resolve().parent.name == rf.RUNS:  # lock <artifacts>
        cfg = config_mod.replace(cfg, {"artifacts": str(Path(args.run).resolve().parent.parent)})
    config_path = Path(path) if (path := config_file(args)) else None
    named = run_id_of(args.run) if remote else args.run  # on a bucket, a run id
    reads = staging.reading((rf.PRECISION, rf.CALIBRATION, rf.GATE), named) if remote else staging.Reads()
    with staging.locked_staged(cfg, f"sourcegate accept {named}", None, reads) as local:
        run = RunFolder(local, named).path if remote else Path(named)
        source = named if remote else str(run)
        if not (args.out or cfg.evals.baseline):
            raise ValueError("evals.baseline is null (none accepted yet): say where to write it with --out PATH")
        out = Path(args.out or cfg.evals.baseline)
        fitted = accepted_combiner(cfg, read_json(run / rf.CALIBRATION))
        judged = read_json(run / rf.GATE) if (run / rf.GATE).is_file() and (run / rf.GATE).stat().st_size else {}
        with writer_lock(cfg, f"sourcegate accept {source}", root=local):
            accepted = accept_run(cfg, run, source, out, config_path, Path.cwd())
            if fitted is not None:
                combiner.write(fitted, cfg.answerability.combiner)
    print(f"baseline written: {out} (from {source})")
    if judged.get("passed") is not True:  # deliberate at times (a lower precision accepted), never unnoticed
        why = "; ".join(str(r) for r in (judged.get("reasons") or [])[:3]) or "no passed verdict"
        print(
            f"note: {source} did not pass its gate ({why}): its outcomes are the baseline all the same", file=sys.stderr
        )
    moved, fresh = accepted["moved"], accepted["next_check"]
    if moved and fresh:
        print(
            f"the check set {cfg.evals.check_set} is retired: {len(moved['moved'])} questions moved to the fit set "
            f"{cfg.evals.calibration_set} (the accepted decision {accepted['threshold']} has seen them), logged in "
            f"{cfg.evals.check_moves}; the next check is {fresh}"
        )
        if accepted["check_set_by_override"]:
            print(f"evals.check_set was given by --set: set it to {fresh} where you keep it")
    elif moved:  # no next-check set named beside it: the check set keeps only what this decision never saw
        print(
            f"check questions moved to the fit set {cfg.evals.calibration_set}: {len(moved['moved'])} "
            f"(the accepted threshold {accepted['threshold']} has seen them); {moved['remaining']} unseen check "
            f"questions remain in {cfg.evals.check_set}; logged in {cfg.evals.check_moves}"
        )
        if not moved["remaining"]:  # the next night refuses an empty check set (exit 2): say so now
            print(
                f"the check set is now empty: write new should-answer questions into {cfg.evals.check_set}, blind, "
                "before the next night (a night with no check set stops before scoring, exit 2)"
            )
    if accepted["config_written"]:
        print(f"{config_path}: {', '.join(accepted['config_written'])} switched")
    if fitted is not None:
        cv = fitted["cross_validated"]
        print(
            f"answerability combiner written: {cfg.answerability.combiner} (fitted on {fitted['training']['n']}, "
            f"training sha256 {fitted['training']['sha256'][:12]}; cross-validated: keeps {cv['answer_kept']:.1%} "
            f"of should-answer, declines {cv['decline_recall_by_kind']})"
        )
    return 0


def accepted_combiner(cfg: PipelineConfig, calibration: dict) -> dict | None:
    """The answerability combiner refitted on a run's calibration questions (None: none configured).

    The fit reads only the per-question signals calibration.json records, so accepting a
    `sourcegate calibrate` folder writes the very file that calibration fitted and swept.
    """
    if not cfg.answerability.combiner:
        return None
    return combiner.fit(calibration.get("questions") or [], cfg.answerability.features)


def cmd_runs(args) -> int:
    from sourcegate.pipelines.app import staging
    from sourcegate.pipelines.app.factories import open_store
    from sourcegate.pipelines.app.run_table import format_table, list_runs

    cfg = load_config(args)
    if not is_remote(cfg.artifacts) and not Path(cfg.artifacts).is_dir():  # a typo would list nothing, and pass
        raise FileNotFoundError(f"no artifacts folder at {cfg.artifacts} (no night has run there)")
    with staging.staged(cfg, reads=staging.Reads(), publish_after=False) as local:  # records only
        store = open_store(cfg, local)
        promoted = {r["version"] for r in store.promotions()}  # the log, not run.json (it can lag)
        rows = list_runs(local, promoted, store.live())
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0


def cmd_verify(args) -> int:
    """Check one index version against its manifest: 0 when intact, 2 naming each bad file. Under the writer lock
    (it may repair run.json, and no writer is mid-way through the version it reads); on s3:// artifacts, on the
    version's files staged from the store, a repaired run.json published back."""
    from sourcegate.pipelines.app import staging
    from sourcegate.pipelines.app.factories import open_store
    from sourcegate.pipelines.app.steps import repair_promoted
    from sourcegate.pipelines.release.lock import writer_lock
    from sourcegate.pipelines.versions.manifest import IntegrityError, manifest_hash

    cfg = load_config(args)
    version = run_id_of(args.version)  # an id, or the folder a night printed
    command = f"sourcegate verify {version}"
    reads = staging.reading((staging.INDEX_FILES,), version)
    with staging.locked_staged(cfg, command, None, reads) as local, writer_lock(cfg, command, root=local):
        store = open_store(cfg, local)
        try:
            manifest = store.verify(version)
        except IntegrityError as exc:
            print(f"sourcegate: verify: index version {version} FAILED", file=sys.stderr)
            for problem in exc.problems:
                print(f"  - {problem}", file=sys.stderr)
            print("  restore the files, or move LIVE off it (sourcegate rollback) if it is live", file=sys.stderr)
            return 2
        if repair_promoted(store, RunFolder(local, version)):
            print(f"{version}: run.json's missing `promoted` written from the promotions log")
    checked = f"{len(manifest['files'])} files" if manifest.get("files") else "chunk count, ids and every document"
    print(
        f"{version}: ok ({manifest['rows']} chunks, dimension {manifest['dimension']}, {checked} verified; "
        f"manifest sha256 {manifest_hash(manifest)})"
    )
    return 0


def cmd_promote(args) -> int:
    """Make a run's version live if its passed verdict is bound to exactly what is there now (exit 2 naming
    the field that differs); a retry after a crash finishes the promotion without a second log record."""
    from sourcegate.pipelines.app import staging
    from sourcegate.pipelines.app.steps import promote_step

    cfg = load_config(args)
    reads, run_id = staging.STEP_READS["promote"], run_id_of(args.run)
    with staging.locked_staged(cfg, f"sourcegate promote {run_id}", run_id, reads) as local:
        version = promote_step(RunFolder(local, run_id), cfg, actor=args.actor, force=args.force)
    print(f"live index: {version}")
    return 0


def lock_timeout_option(p: argparse.ArgumentParser) -> None:
    """--lock-timeout of the commands that write (not judged: a longer wait needs no new verdict)."""
    p.add_argument("--lock-timeout", type=float, metavar="S", help="wait this long for another writer (lock.timeout_s)")


def cmd_rollback(args) -> int:
    """Re-point the live index to an earlier promoted version whose verdict still binds; logged."""
    from sourcegate.pipelines.app import staging
    from sourcegate.pipelines.app.steps import rollback_step

    cfg = load_config(args)
    version, reads = args.version, staging.Reads()
    if is_remote(cfg.artifacts):  # stage the target's index files (it is verified before it goes live)
        version = version or default_rollback_target(cfg)
        reads = staging.reading(("index/", rf.CALIBRATION), version) if version else reads
    with staging.locked_staged(cfg, f"sourcegate rollback {version or ''}".strip(), None, reads) as local:
        record = rollback_step(local, cfg, version, force=args.force, actor=args.actor)
    print(f"rolled back: live index {record['previous']} -> {record['version']} (logged as a rollback)")
    for change in record.get("judged_since", []):
        print(f"  judged since its verdict (forced): {change}")
    return 0


def default_rollback_target(cfg: PipelineConfig) -> str | None:
    """The newest promoted version other than the live one, read from the store (rollback_step's default)."""
    from sourcegate.pipelines.app.factories import open_store
    from sourcegate.pipelines.versions import promotions

    store = open_store(cfg)
    return promotions.rollback_target(store.promotions(), store.live(), set(store.versions()))


def cmd_diff(args) -> int:
    """Per question: gating score, answer mode and labelled rank, run A against run B (with `--artifacts
    s3://…`, two run ids on the store)."""
    from sourcegate.evals.diff import diff_runs, format_diff
    from sourcegate.pipelines.app import staging

    cfg = load_config(args) if args.artifacts else None
    if cfg is None or not is_remote(cfg.artifacts):
        folders = [
            RunFolder(cfg.artifacts, run_id_of(named)).path if cfg and not Path(named).is_dir() else named
            for named in (args.run_a, args.run_b)
        ]  # with a local --artifacts, run ids name its run folders
        diff = diff_runs(*folders)
    else:
        run_a, run_b = run_id_of(args.run_a), run_id_of(args.run_b)
        reads = staging.reading((rf.QUESTIONS,), run_a, run_b)
        with staging.staged(cfg, reads=reads, publish_after=False) as local:
            a, b = RunFolder(local, run_a), RunFolder(local, run_b)
            diff = diff_runs(a.path, b.path)
            diff |= {"a": a.published(), "b": b.published()}
    print(json.dumps(diff, indent=2, sort_keys=True) if args.json else format_diff(diff))
    return 0


def cmd_config_schema(args) -> int:
    """The JSON schema of config/pipeline.yaml (keys, types, allowed values, defaults), for editors; with
    --markdown the configuration reference (docs/configuration.md)."""
    print(config_mod.reference() if args.markdown else json.dumps(config_mod.json_schema(), indent=2) + "\n", end="")
    return 0


def cmd_train_answerability(args) -> int:
    """Train, export and evaluate the answer-support model; prints the held-out result.

    docs/benchmarks/23-answer-model-squad.md measured it."""
    from sourcegate.pipelines.training.answerability import train_answerability

    result = train_answerability(
        args.data, Path(args.out), Path(args.work) if args.work else None, args.steps, lr=args.lr
    )
    print(json.dumps({"heldout": result["int8"], "determinism": result["determinism"]}, indent=2))
    return 0


def cmd_train_in_domain(args) -> int:
    """Train an answer-support model on this corpus's labelled questions over one version (docs/calibration.md)."""
    return train_in_domain(load_config(args), args)


def train_in_domain(cfg: PipelineConfig, args) -> int:
    """`train-in-domain` under `cfg` with the command's parsed arguments (the recalibrate DAG's retrain calls it with
    a recipe's arguments, sourcegate/pipelines/app/retrain_step.py)."""
    from sourcegate.evals.evalset import load_evalset
    from sourcegate.pipelines.app.factories import retriever_for
    from sourcegate.pipelines.training.in_domain import EPOCHS, SEED, TIME_BUDGET_S, leave_out_judged, train_seeds

    if not args.train and not args.synthetic:
        raise ValueError("train-in-domain: give --train sets, --synthetic N (questions made from the corpus), or both")
    # a model that saw a question of the fit or check set fails every night's gate: copies are refused (or left
    # out), verbatim or reworded before any model loads, in other words once the version's bi-encoder is up
    judged = {"fit set": cfg.evals.calibration_set, "check set": cfg.evals.check_set}
    items = [q for path in args.train or [] for q in load_evalset(path)]
    left_out = leave_out_judged(items, judged, drop=args.drop_judged)
    index = Path(args.index)
    searcher = version_searcher(cfg, index)
    retriever, _ = retriever_for(cfg, searcher)
    rest = [q for q in items if q["id"] not in left_out]
    left_out |= leave_out_judged(rest, judged, retriever.text_vectors, drop=args.drop_judged)
    for qid, why in left_out.items():
        print(f"left out {qid} {why}")
    synthetic = None
    if args.synthetic:
        import pyarrow.parquet as pq

        from sourcegate.artifact_io.run_folder import loadable_chunks

        # the chunks the version searches; generated questions that copy a judged one are dropped, never refused
        columns = ["doc_id", "title", "section", "section_id", "body", "text"]
        chunks = pq.read_table(loadable_chunks(index), columns=columns)
        synthetic = {
            "n": args.synthetic,
            "chunks": chunks.to_pylist(),
            "leave_out": lambda made: leave_out_judged(made, judged, retriever.text_vectors, drop=True),
        }
    out = Path(args.out)
    recipes = train_seeds(
        retriever, args.index, args.train or [], out, Path(args.work) if args.work else out.parent / (out.name + "_work"),
        args.seed or [SEED], epochs=args.epochs or EPOCHS, export_as=args.export, left_out=left_out,
        synthetic=synthetic, time_budget_s=args.time_budget or TIME_BUDGET_S, teacher=args.distil_from,
        layers=args.layers, max_steps=args.max_steps,
    )  # fmt: skip
    recipe = recipes[0]
    print(f"trained {len(recipes)} model(s) on {len(recipe['trained_on'])} questions ({recipe['pairs']}) in {out}")
    if made := recipe.get("synthetic"):
        print(
            f"made from the corpus: {made['pseudo_queries']} inverse-cloze questions from {made['sections']} sections, "
            f"{made['borrowing']} asks borrowing its names, {len(made['left_out'])} left out as copies of judged ones"
        )
    where = config_file(args) or "your config"
    print(
        f"use it: answerability.answer_model_path: {out.resolve()} in {where} (or --set); under answer.signal: auto "
        "a night gates on it only where the rule chooses it on the fit set"
    )
    return 0


def cmd_init(args) -> int:
    """Scaffold a new corpus's config and eval sets, and say what to write next."""
    from sourcegate.pipelines.app.scaffold import next_steps, scaffold

    # From the defaults wherever it runs, never the repository's demo config: one config for a new corpus.
    made = scaffold(
        load_config(args, default=None),
        args.corpus_dir,
        args.out,
        args.format or "markdown",
        args.judged,
        args.judged_max,
        tuple(t.strip() for t in (args.near_topic or "").split(",") if t.strip()),
    )
    print(next_steps(made))
    return 0


def cmd_retrain(args) -> int:
    """Rebuild a trained answer model from its recipe and the repository's files (sourcegate/pipelines/training/retrain.py)."""
    import shlex

    from sourcegate.artifact_io.run_folder import loadable_chunks
    from sourcegate.pipelines.app.run import build
    from sourcegate.pipelines.app.steps import new_run_id
    from sourcegate.pipelines.training import retrain

    model, out = Path(args.model), Path(args.out)
    recorded = retrain.retrain_argv(model, out, Path("."))[1]["recorded_index"]
    index = Path(args.index or (recorded[0] if recorded else ""))
    if not (index / rf.CHUNKS).is_file():  # the recorded run folder is gone: build the version again
        cfg = config_mod.replace(load_config(args), {"artifacts": str(out.parent / f"{out.name}_work" / "artifacts")})
        run_id = new_run_id()
        print(f"{index} is not here: building the version from {cfg.corpus.path} (run {run_id})")
        run = RunFolder(cfg.artifacts, run_id)
        build(run, cfg)
        index = run.path
    share = retrain.same_content(model, loadable_chunks(index))
    print(f"{index} holds exactly what {model} learned ({share['n_sections']} sections)")
    argv, _ = retrain.retrain_argv(model, out, index)
    print("retraining: sourcegate " + shlex.join(argv))
    settings = [*(["--config", args.config] if args.config else []), *[w for o in args.set or () for w in ("--set", o)]]
    code = main([*settings, *argv])
    if code == 0:
        for line in retrain.compare(retrain.recipes(model), retrain.recipes(out)):
            print(line)
    return code


def cmd_record_corpus(args) -> int:
    """Write what a model trained before models recorded it learned, from the version it trained against."""
    from sourcegate.artifact_io.run_folder import loadable_chunks
    from sourcegate.pipelines.retrieval import learned_corpus

    index = Path(args.index)
    path = learned_corpus.write(args.model, learned_corpus.record(loadable_chunks(index), index.name, args.note))
    learned = learned_corpus.read(args.model)
    print(f"{path}: {len(learned['sections'])} sections, {len(learned['chunks'])} chunks of version {index.name}")
    return 0


def main(argv=None) -> int:
    return run_command(parse(argv))


def parse(argv=None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not args.verbose:  # the client logs every failed request with its traceback; the exit line names the cause
        logging.getLogger(OPENSEARCH_CLIENT_LOGGER).setLevel(logging.ERROR)
    return args


# Commands that write nothing once their answer is printed. Finalizing an interpreter that imported torch and holds
# ONNX sessions took 0.5-1 s here, a fifth of a cold `query` (docs/benchmarks/26-serve.md), so their process ends
# without it.
QUICK_EXIT = frozenset({"query"})


def console() -> None:
    """The `sourcegate` command: `main`, and for a command in QUICK_EXIT the process ends once its output is
    flushed (`main`, called in-process by tests and callers, always returns)."""
    args = parse()
    code = run_command(args)
    if args.command in QUICK_EXIT:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a reader that went away: the exit code still tells
                stream.flush()
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sourcegate", description=__doc__)
    parser.add_argument("--config", help=f"pipeline config (default: {DEFAULT_CONFIG} if present)")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override one config value by dotted key (repeatable), e.g. --set retrieval.rerank_weight=0.6",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="build or refresh the index, evaluate, gate, promote if passed")
    p.add_argument("--corpus"), p.add_argument("--format", choices=["markdown", "beir"])
    p.add_argument("--backend", choices=["embedded", "opensearch"]), p.add_argument("--artifacts")
    p.add_argument("--reranker", choices=["onnx", "sentence_transformers", "none"])
    p.add_argument("--run-id"), p.add_argument("--quiet", action="store_true")
    lock_timeout_option(p)
    p.add_argument("--no-promote", action="store_true", help="build, evaluate and gate, but leave the live index")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("promote", help="make a run's version live if its passed verdict binds to it (the deploy step)")
    p.add_argument("run", help="a run id"), p.add_argument("--artifacts")
    p.add_argument("--backend", choices=["embedded", "opensearch"]), p.add_argument("--actor", default="cli")
    p.add_argument("--corpus", help=CORPUS_HELP)
    p.add_argument("--force", action="store_true", help="also a version a rollback moved LIVE away from")
    lock_timeout_option(p)
    p.set_defaults(func=cmd_promote)

    p = sub.add_parser("query", help="ask the live index (or --index RUN_DIR) one question")
    p.add_argument("question"), p.add_argument("--context", action="append", help="a prior turn (repeatable)")
    p.add_argument("--index", help="an embedded run folder"), p.add_argument("--json", action="store_true")
    p.add_argument("--backend", choices=["embedded", "opensearch"]), p.add_argument("--artifacts")
    p.add_argument("--reranker", choices=["onnx", "sentence_transformers", "none"])
    p.add_argument(
        "--unproven",
        action="store_true",
        help="answer with the config as it is even where it differs from the decision the verdict proved (said so)",
    )
    p.add_argument("--all-signals", action="store_true", help=ALL_SIGNALS_HELP)
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("serve", help="answer queries over HTTP (GET /health, POST /query) from one warm process")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default loopback: no auth)")
    p.add_argument("--port", type=int, default=8765, help="default 8765; 0 picks a free port (printed)")
    p.add_argument("--backend", choices=["embedded", "opensearch"]), p.add_argument("--artifacts")
    p.add_argument("--reranker", choices=["onnx", "sentence_transformers", "none"])
    p.add_argument("--unproven", action="store_true", help="as query --unproven: the config as it is, said so")
    p.add_argument("--all-signals", action="store_true", help=ALL_SIGNALS_HELP)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("calibrate", help="sweep + precision evals of an existing index with a labelled set")
    p.add_argument("--index", required=True, help="a run folder (its chunks; its index on --backend)")
    p.add_argument("--questions", required=True), p.add_argument("--out", required=True)
    p.add_argument("--backend", choices=["embedded", "opensearch"])
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("beir", help="index a BEIR dataset and evaluate bm25, dense, hybrid, hybrid+rerank")
    p.add_argument("dataset"), p.add_argument("--out", required=True), p.add_argument("--decline")
    p.add_argument("--split", default="test", help="the judged queries of qrels/SPLIT.tsv (default: test)")
    p.add_argument("--backend", choices=["embedded", "opensearch"])
    (
        p.add_argument("--rerank-depth", type=int),
        p.add_argument("--artifacts"),
        p.add_argument("--quiet", action="store_true"),
    )
    p.set_defaults(func=cmd_beir)

    p = sub.add_parser("accept", help="accept a run's per-question precision and decline outcomes as the baseline")
    p.add_argument("run", help="a run folder (a run id with --artifacts s3://…)")
    p.add_argument("--out", help="default: evals.baseline")
    p.add_argument("--artifacts", help="the artifacts folder whose lock is held while writing")
    lock_timeout_option(p)
    p.set_defaults(func=cmd_accept)

    p = sub.add_parser("runs", help="list the runs with their verdicts, counts and timings (SQL over run folders)")
    p.add_argument("--artifacts"), p.add_argument("--json", action="store_true")
    p.add_argument("--backend", choices=["embedded", "opensearch"], help="whose promotions log says what was promoted")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("verify", help="check an index version's files against its manifest (exit 2 if not intact)")
    p.add_argument("version"), p.add_argument("--artifacts")
    p.add_argument("--backend", choices=["embedded", "opensearch"])
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("rollback", help="point the live index back at an earlier version that passed its gate")
    p.add_argument("version", nargs="?", help="default: the previously promoted version")
    p.add_argument("--artifacts"), p.add_argument("--backend", choices=["embedded", "opensearch"])
    p.add_argument(
        "--force",
        action="store_true",
        help="also a version never promoted, or one whose eval sets, baseline, config or code changed since its "
        "verdict (logged as forced, with what changed); never a failed, altered or unservable one",
    )
    p.add_argument("--actor", default="rollback", help="who rolls back (logged)")
    p.add_argument("--corpus", help=CORPUS_HELP)
    lock_timeout_option(p)
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("diff", help="what changed per question between two run folders (scores, modes, ranks)")
    p.add_argument("run_a", help="the older run folder"), p.add_argument("run_b", help="the newer run folder")
    p.add_argument("--json", action="store_true")
    p.add_argument("--artifacts", help="s3://bucket/prefix: run_a and run_b are run ids on that store")
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("train-answerability", help="train the answer-support model on SQuAD 2.0 (about 15 min)")
    p.add_argument("--data", required=True, help="SQuAD 2.0 dev-v2.0.json(.gz), e.g. ../shared/datasets/squad2/")
    p.add_argument("--out", default="models/answer_support", help="where the shipped files go")
    p.add_argument("--work", help="scratch for the torch checkpoints (default: OUT_work)")
    p.add_argument("--steps", type=int, default=200, help="training steps of 16 pairs")
    p.add_argument("--lr", type=float, default=2e-5, help="AdamW peak learning rate (the shipped model: 2e-5)")
    p.set_defaults(func=cmd_train_answerability)

    p = sub.add_parser("train-in-domain", help="train the answer-support model on this corpus's labelled questions")
    p.add_argument("--index", required=True, help="a run folder: the version whose retrieval pairs them")
    p.add_argument("--train", nargs="+", help="labelled sets to learn from (never the fit or check set)")
    p.add_argument(
        "--synthetic",
        type=int,
        metavar="N",
        help="also (or only) learn from N questions made from the corpus: inverse-cloze sentences and asks borrowing "
        "its names (sourcegate/pipelines/training/synthetic_pairs.py)",
    )
    p.add_argument(
        "--time-budget", type=float, metavar="SECONDS", help="train only the steps that fit (default: 6 hours)"
    )
    p.add_argument(
        "--max-steps",
        type=int,
        metavar="N",
        help="train exactly N steps (a recipe whose training a time budget cut records them: a retrain is the same)",
    )
    p.add_argument("--out", required=True, help="the model folder (answerability.answer_model_path)")
    p.add_argument("--work", help="scratch for the torch checkpoints (default: OUT_work)")
    p.add_argument("--epochs", type=int, help="passes over the pairs (default: the recipe's, 4)")
    p.add_argument("--export", choices=("int8", "fp32"), default="int8", help="int8 (about 22 MB) or fp32 (134 MB)")
    p.add_argument(
        "--drop-judged", action="store_true", help="leave out (and record) copies of fit or check questions, not refuse"
    )
    p.add_argument(
        "--distil-from",
        metavar="MODEL",
        help="learn a trained answer model's logits (one or an ensemble) on the sets' passages instead of their labels",
    )
    p.add_argument(
        "--layers", type=int, help="keep this many of the base model's 12 encoder layers (a smaller, faster model)"
    )
    p.add_argument(
        "--seed",
        type=int,
        nargs="+",
        help="training seed (default: the recipe's, 13); several: one model each in OUT/seed-N, read as their mean",
    )
    p.set_defaults(func=cmd_train_in_domain)

    p = sub.add_parser("init", help="scaffold a config and eval sets for your own corpus, and say what to write next")
    p.add_argument("corpus_dir", help="a folder of Markdown/HTML articles, or a BEIR dataset folder (--format beir)")
    p.add_argument("--out", required=True, help="where pipeline.yaml, evals/ and sections.tsv are written")
    p.add_argument("--format", choices=["markdown", "beir"])
    p.add_argument(
        "--judged",
        metavar="SPLIT",
        help="a BEIR dataset's judged queries of qrels/SPLIT.tsv as should-answer questions",
    )
    p.add_argument("--judged-max", type=int, metavar="N", help="at most N of them, a seeded sample (default 300)")
    p.add_argument(
        "--near-topic", metavar="TOPIC,...", help="the pool's questions of these topics (your domain) as near_topic"
    )
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("retrain", help="rebuild a trained answer model from its recipe and the repository's files")
    p.add_argument("model", help="the model folder (its recipe.json, or an ensemble's members')")
    p.add_argument("--out", required=True, help="where the rebuilt model goes")
    p.add_argument("--index", help="the run folder to pair against (default: the recorded one, else built anew)")
    p.add_argument("--corpus", help="the corpus to build the version from when it is gone (default: corpus.path)")
    p.set_defaults(func=cmd_retrain)

    p = sub.add_parser(
        "record-corpus", help="record which corpus a trained answer model learned (train-in-domain does it itself)"
    )
    p.add_argument("model", help="the model folder (answerability.answer_model_path)")
    p.add_argument("--index", required=True, help="the run folder of the version it trained against")
    p.add_argument("--note", help="how the record was made, kept in it (e.g. that it was written after training)")
    p.set_defaults(func=cmd_record_corpus)

    p = sub.add_parser("config-schema", help="print the JSON schema of the pipeline config (for editors)")
    p.add_argument(
        "--markdown", action="store_true", help="the configuration reference instead (docs/configuration.md)"
    )
    p.set_defaults(func=cmd_config_schema)

    return parser


def run_command(args) -> int:
    """The one top-level handler (G10): every exception is exit 2 with one line naming its cause and step;
    1 only ever comes from a command's own gate verdict. The traceback is shown only with -v."""
    try:
        return args.func(args)
    except BaseException as exc:  # noqa: BLE001 - the one place every failure becomes an exit code
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            raise
        # imported only on failure: errors.py reaches the evaluation harness, a second of a query's cold start
        from sourcegate.pipelines.app.errors import ERROR, exit_line
        from sourcegate.pipelines.search.opensearch.client import config_from_env, redact_url

        try:
            url = redact_url(config_from_env().url)
        except ValueError as bad:
            url = f"(OPENSEARCH_URL invalid: {bad})"
        print(f"sourcegate: {exit_line(exc, args.command, url)}", file=sys.stderr)
        if args.verbose:
            traceback.print_exception(exc, file=sys.stderr)
        return ERROR


if __name__ == "__main__":
    console()
