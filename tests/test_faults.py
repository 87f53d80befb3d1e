"""The fault suite: real crashes and a really full disk, then a rerun.

Kills are real SIGKILLs of a real `sourcegate run` subprocess: `SOURCEGATE_KILL_AT=<point>`
(sourcegate/pipelines/faults.py) makes the process kill itself at a step boundary or in the middle of embed and
load. The disk is a size-limited tmpfs mounted by the test (root only). A tiny corpus (3 demo
articles) and a tiny eval set keep each run to seconds plus the model loads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines import config as config_mod
from sourcegate.pipelines.search.embedded import EmbeddedStore
from tests.conftest import build_validated

pytestmark = pytest.mark.models

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "corpus" / "demo"
ARTICLES = ["reduced-fares.md", "lost-and-found.md", "bikes-on-board.md"]


def tiny_eval_sets(folder: Path) -> tuple[Path, Path]:
    """A few should-answer questions about the tiny corpus, and a few off-topic declines."""
    articles = {a.removesuffix(".md") for a in ARTICLES}

    def about_corpus(q):
        return q["label"] == "answer" and {e.split("#")[0] for e in q["expected"]} <= articles

    calibration = [json.loads(line) for line in (ROOT / "config/evals/calibration.jsonl").open()]
    precision = [json.loads(line) for line in (ROOT / "config/evals/precision.jsonl").open()]
    cal = [q for q in calibration if about_corpus(q)][:4] + [q for q in calibration if q["kind"] == "off_topic"][:3]
    pre = [q for q in precision if about_corpus(q)][:3]
    paths = folder / "calibration.jsonl", folder / "precision.jsonl"
    for path, items in zip(paths, (cal, pre), strict=True):
        path.write_text("".join(json.dumps(q) + "\n" for q in items))
    return paths


def tiny_check_set(fit: Path, path: Path) -> Path:
    """A gate needs a check set; here the tiny fit set under new ids (a fixture)."""
    path.write_text(
        "".join(json.dumps({**json.loads(q), "id": "chk-" + json.loads(q)["id"]}) + "\n" for q in fit.open())
    )
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    return tiny_night(tmp_path_factory.mktemp("faults"))


def tiny_night(base: Path) -> dict:
    """Config file for a tiny night in `base`: 2 of the 3 articles to start with, tiny evals, the accepted baseline."""
    corpus = base / "corpus"
    corpus.mkdir()
    for name in ARTICLES[:2]:
        shutil.copy(DEMO / name, corpus / name)
    cal, pre = tiny_eval_sets(base)
    overrides = {"corpus.path": str(corpus)}
    # the accepted baseline: the tiny sets' questions are compared by id, the rest are `missing`, not compared
    check = tiny_check_set(cal, base / "check.jsonl")
    overrides |= {"evals.calibration_set": str(cal), "evals.precision_set": str(pre), "evals.check_set": str(check)}
    overrides["calibration.min_per_label"] = 3  # a gate that can pass on 3 off-topic questions: a fault-suite fixture
    overrides["lock.timeout_s"] = 0
    cfg = config_mod.load(ROOT / "config" / "pipeline.yaml", overrides)
    path = base / "pipeline.yaml"
    path.write_text(json.dumps(cfg.model_dump(mode="json")))  # JSON is YAML
    return {"config": path, "corpus": corpus, "base": base}


def sourcegate(tiny: dict, artifacts: Path, run_id: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("SOURCEGATE_KILL_AT", None)
    if kill_at:
        env["SOURCEGATE_KILL_AT"] = kill_at
    cmd = [sys.executable, "-m", "sourcegate.pipelines.app.cli", "--config", str(tiny["config"]), "run"]
    cmd += ["--artifacts", str(artifacts), "--run-id", run_id, "--quiet"]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)


def store_of(artifacts: Path) -> EmbeddedStore:
    return EmbeddedStore(artifacts / "runs", artifacts / "LIVE")


# Every step boundary, and the middle of embed and load, in the order a night reaches them.
KILL_POINTS = [
    "after:ingest",
    "after:chunk",
    "embed:encoded",
    "after:merge",
    "after:validate",
    "load:partial",
    "after:load",
    "after:evaluate",
    "after:gate",
]


def test_sigkill_inside_each_step_then_rerun(tiny, tmp_path):
    artifacts = tmp_path / "artifacts"
    first, second = "20260101-020000", "20260102-020000"
    done = sourcegate(tiny, artifacts, first)
    assert done.returncode == 0, done.stdout + done.stderr
    store = store_of(artifacts)
    assert store.live() == first
    shutil.copy(DEMO / ARTICLES[2], tiny["corpus"] / ARTICLES[2])  # the second night has something new

    folder = artifacts / "runs" / second
    for i, point in enumerate(KILL_POINTS):
        out = sourcegate(tiny, artifacts, second, kill_at=point)
        assert out.returncode == -9, f"{point}: {out.returncode} {out.stderr[-2000:]}"
        if i:  # the killed run before this one left its lock record; the kernel had already dropped the lock
            assert "broke the stale lock" in out.stderr, point
        assert store.live() == first, f"LIVE moved after a kill at {point}"
        loaded = KILL_POINTS.index(point) > KILL_POINTS.index("load:partial")
        # A version exists only once its index folder is whole (renamed into place at the end of load).
        assert (second in store.versions()) == loaded, point
        assert (folder / "index").is_dir() == loaded, point
        if point == "embed:encoded":
            assert not list((folder / "embed").glob("shard-*.parquet"))  # nothing half-written under its name
        if point == "load:partial":
            assert (folder / "index.tmp").is_dir()  # the half-built index is only ever under its temp name
        assert not (folder / "gate.json").exists() or point == "after:gate", point

    rerun = sourcegate(tiny, artifacts, second)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert store.live() == second
    assert not (folder / "index.tmp").exists()
    info = json.loads((folder / "run.json").read_text())
    assert info["counts"]["ingest"]["documents"] == 3
    assert {k: info["promoted"][k] for k in ("version", "replaced")} == {"version": second, "replaced": first}
    assert info["promoted"]["actor"] == "cli"
    query = subprocess.run(
        [sys.executable, "-m", "sourcegate.pipelines.app.cli", "--config", str(tiny["config"]), "query", "--artifacts"]
        + [str(artifacts), "--json", "Can I bring my bike on the train?"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert query.returncode == 0, query.stderr
    assert json.loads(query.stdout)["passages"][0]["doc_id"] == "bikes-on-board"  # served from the new night


# --- a full disk -------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MB tmpfs of its own: writes there really run out of space."""
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root (CI runs as root)")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill the file system at `disk` up to `leave` free bytes; returns the filler file."""
    filler = disk / "filler"
    free = shutil.disk_usage(disk).free - leave
    with filler.open("wb") as handle:
        chunk = b"\0" * (1 << 20)
        while free > 0:
            try:
                handle.write(chunk[: min(len(chunk), free)])
                handle.flush()
            except OSError:
                break
            free -= len(chunk)
    return filler


def test_disk_full_at_load_and_while_writing_artifacts(tiny, small_disk, embedder):
    from sourcegate.pipelines.app import steps

    artifacts = small_disk / "artifacts"
    cfg = config_mod.load(tiny["config"], {"artifacts": str(artifacts)})
    store = store_of(artifacts)

    good = "20260101-020000"
    build_validated(cfg, good, embedder)
    steps.load_step(RunFolder(cfg.artifacts, good), cfg)
    steps.evaluate_step(RunFolder(cfg.artifacts, good), cfg)
    assert steps.gate_step(RunFolder(cfg.artifacts, good), cfg)["passed"]
    steps.promote_step(RunFolder(cfg.artifacts, good), cfg)
    assert store.live() == good
    live_before = (artifacts / "LIVE").read_bytes()

    # 1. Out of space at load: the index is never renamed into place, LIVE is untouched.
    night = "20260102-020000"
    build_validated(cfg, night, embedder)
    filler = fill(small_disk, leave=4096)
    with pytest.raises(OSError, match="No space left"):
        steps.load_step(RunFolder(cfg.artifacts, night), cfg)
    assert night not in store.versions() and not (artifacts / "runs" / night / "index").exists()
    assert not (artifacts / "runs" / night / "index.tmp").exists()  # a failed load cleans up after itself
    assert (artifacts / "LIVE").read_bytes() == live_before
    with pytest.raises(RuntimeError, match="no gate verdict"):
        steps.promote_step(RunFolder(cfg.artifacts, night), cfg)  # no verdict, no index: nothing to promote

    # 2. Out of space while writing artifacts (the next night's ingest): no file half-written under its name.
    later = "20260103-020000"
    with pytest.raises(OSError, match="No space left"):
        steps.ingest_step(RunFolder(cfg.artifacts, later), cfg)
    assert not (artifacts / "runs" / later / "documents.parquet").exists()
    assert not list((artifacts / "runs" / later).glob(".*.tmp"))
    assert store.live() == good and (artifacts / "LIVE").read_bytes() == live_before

    # 3. The CLI says so plainly (exit 2, no traceback).
    out = sourcegate(tiny, artifacts, "20260104-020000")
    assert out.returncode == 2, out.stderr
    assert "No space left on device" in out.stderr and "Traceback" not in out.stderr

    # 4. Space again: the interrupted night completes and is promoted.
    filler.unlink()
    steps.load_step(RunFolder(cfg.artifacts, night), cfg)
    steps.evaluate_step(RunFolder(cfg.artifacts, night), cfg)
    assert steps.gate_step(RunFolder(cfg.artifacts, night), cfg)["passed"]
    steps.promote_step(RunFolder(cfg.artifacts, night), cfg)
    assert store.live() == night


# --- a corrupted live version ------------------------------------------------------------------------


def cli(tiny: dict, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "sourcegate.pipelines.app.cli", "--config", str(tiny["config"]), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_a_corrupted_live_version_fails_query_evaluate_and_verify_naming_the_file(tiny, tmp_path, embedder):
    from sourcegate.pipelines.app import steps
    from sourcegate.pipelines.versions.manifest import IntegrityError

    artifacts = tmp_path / "artifacts"
    cfg = config_mod.load(tiny["config"], {"artifacts": str(artifacts)})
    version = "20260101-020000"
    steps.load_step(build_validated(cfg, version, embedder), cfg)
    store = store_of(artifacts)
    store.promote(version)
    index = artifacts / "runs" / version / "index"
    assert cli(tiny, "verify", version, "--artifacts", str(artifacts)).returncode == 0

    for name, corrupt in (
        ("embeddings.npy", lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])),  # truncated
        ("chunks.parquet", lambda p: p.write_bytes(flip_middle_byte(p.read_bytes()))),  # same size, other bytes
    ):
        path = index / name
        intact = path.read_bytes()
        corrupt(path)
        verify = cli(tiny, "verify", version, "--artifacts", str(artifacts))
        assert verify.returncode == 2 and str(path) in verify.stderr, (name, verify.stderr)
        query = cli(tiny, "query", "--artifacts", str(artifacts), "Can I bring my bike on the train?")
        assert query.returncode == 2 and name in query.stderr and "Traceback" not in query.stderr, query.stderr
        with pytest.raises(IntegrityError, match=name):
            steps.evaluate_step(RunFolder(cfg.artifacts, "recal-20260101-030000"), cfg, version=version)
        assert store.live() == version  # nothing moved; the maintainer restores or rolls back
        path.write_bytes(intact)
    assert cli(tiny, "verify", version, "--artifacts", str(artifacts)).returncode == 0


def flip_middle_byte(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]
