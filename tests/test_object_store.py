"""Artifacts on an object store (issue 23), against a real S3-compatible server (moto_server, tests/s3_server.py).

Unit tests of the write-once and staging rules use pyarrow's local filesystem (no server, fast tier); the
tests that say S3 works talk to the server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyarrow import fs as pafs

from pipelines.app import staging
from pipelines.versions.object_store import ObjectStore, WriteOnceViolation, endpoint_from_env, split_uri

ROOT = Path(__file__).resolve().parents[1]


def local_store(tmp_path) -> ObjectStore:
    """The same ObjectStore over pyarrow's local filesystem: the rules, without a server."""
    (tmp_path / "bucket" / "prefix").mkdir(parents=True)
    return ObjectStore("s3://bucket/prefix", pafs.LocalFileSystem(), str(tmp_path / "bucket" / "prefix"))


def test_uri_and_environment_parsing():
    assert split_uri("s3://nights/demo/") == ("nights", "demo")
    with pytest.raises(ValueError, match="no credentials"):
        split_uri("s3://key:secret@nights/demo")
    with pytest.raises(ValueError, match="expected s3://"):
        split_uri("gs://nights/demo")
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1", "AWS_SECRET_ACCESS_KEY": "x"}
    assert endpoint_from_env(env) == {"endpoint_override": "127.0.0.1:9000", "scheme": "http", "region": "eu-west-1"}
    assert endpoint_from_env(env | {"AWS_ENDPOINT_URL_S3": "https://s3.local"})["endpoint_override"] == "s3.local"


def test_write_once_refuses_other_bytes_and_keeps_same_bytes(tmp_path):
    store = local_store(tmp_path)
    src = tmp_path / "a.bin"
    src.write_bytes(b"version one")
    assert store.upload_once(src, "runs/r1/index/a.bin") is True
    assert store.upload_once(src, "runs/r1/index/a.bin") is False  # same bytes: left as is
    src.write_bytes(b"version two")
    with pytest.raises(WriteOnceViolation, match="other content"):
        store.upload_once(src, "runs/r1/index/a.bin")
    assert store.get("runs/r1/index/a.bin") == b"version one"


def test_publish_writes_manifests_last_records_as_objects_and_live_once(tmp_path):
    store = local_store(tmp_path)
    scratch = tmp_path / "scratch"
    (scratch / "runs" / "r1" / "index").mkdir(parents=True)
    for name in ("chunks.parquet", "index/embeddings.npy", "index/manifest.json", "run.json"):
        (scratch / "runs" / "r1" / name).write_text(name)
    (scratch / "LIVE").write_text("r1\n")
    from pipelines.versions import promotions

    promotions.append_record(promotions.promotion_record("r1", None, "abc", "cli"), scratch / "promotions.jsonl")
    order = []
    real_upload = store.upload
    store.upload = lambda src, key: (order.append(key), real_upload(src, key))[1]
    staging.publish(store, scratch, staging.Snapshot())
    assert order[-1] == "runs/r1/index/manifest.json"
    assert store.get("LIVE") == b"r1\n"
    records = store.listing("promotions/")
    assert len(records) == 1 and json.loads(store.get(next(iter(records))))["version"] == "r1"


def test_staging_reads_what_a_step_reads_and_only_records_of_the_rest():
    keys = {f"runs/{r}/{n}": 1 for r in ("r1", "r2", "r3") for n in ("chunks.parquet", "run.json")}
    assert staging.previous_of(keys, "r4") == "r3" and staging.previous_of(keys, "r1") is None
    night = staging.roles_of(staging.NIGHT, "r4", "r3", "r1")
    assert staging.wanted("runs/r2/run.json", staging.NIGHT, night)  # every run's records
    assert not staging.wanted("runs/r2/chunks.parquet", staging.NIGHT, night)
    assert staging.wanted("runs/r3/chunks.parquet", staging.NIGHT, night)  # the previous run (embed cache)
    assert not staging.wanted("runs/r3/index/embeddings.npy", staging.NIGHT, night)  # a version's files: to open it
    assert staging.wanted("runs/r4/index/embeddings.npy", staging.NIGHT, night)
    embed = staging.STEP_READS["embed"]
    roles = staging.roles_of(embed, "r4", "r3", "r1")
    assert staging.wanted("runs/r4/chunks.text.parquet", embed, roles)
    assert staging.wanted("runs/r3/chunks.parquet", embed, roles)
    assert not staging.wanted("runs/r4/documents.parquet", embed, roles)
    assert not staging.wanted("runs/r1/chunks.parquet", embed, roles)  # the live run: not what embed reads


def test_a_staged_step_sees_placeholders_of_what_it_does_not_read_and_publishes_only_what_it_wrote(tmp_path):
    store = local_store(tmp_path)
    for key, body in {"runs/r1/run.json": b"{}", "runs/r1/chunks.parquet": b"vectors", "LIVE": b"r1\n"}.items():
        store.put(key, body)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    snap = staging.stage(store, scratch, "r2", staging.STEP_READS["ingest"])
    assert (scratch / "runs/r1/chunks.parquet").read_bytes() == b""  # listed, not downloaded
    assert (scratch / "runs/r1/run.json").read_bytes() == b"{}"
    (scratch / "runs/r2").mkdir(parents=True)
    (scratch / "runs/r2/run.json").write_text("{}")
    staging.publish(store, scratch, snap)
    assert store.get("runs/r1/chunks.parquet") == b"vectors" and store.get("runs/r2/run.json") == b"{}"


# --- against the real server ---------------------------------------------------------------------------


# The config's relative paths (corpus, eval sets, baseline, combiner) made absolute: the CLI resolves them
# against its working directory, and every command here runs in its own empty one.
RELATIVE_KEYS = (
    ("corpus", "path"),
    ("evals", "calibration_set"),
    ("evals", "precision_set"),
    ("evals", "baseline"),
    ("answerability", "combiner"),
)


def project_config(dest: Path) -> Path:
    import yaml

    body = yaml.safe_load((ROOT / "config" / "pipeline.yaml").read_text())
    for section, key in RELATIVE_KEYS:
        body[section][key] = str(ROOT / body[section][key])
    dest.write_text(yaml.safe_dump(body, sort_keys=False))
    return dest


def sourcegate_argv(args, config: Path) -> list[str]:
    return [sys.executable, "-m", "pipelines.app.cli", "--config", str(config), *args]


def sourcegate(args, env, cwd, config: Path, timeout=1800) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | env | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(
        sourcegate_argv(args, config),
        env=full,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


HOLDER = """
import sys, time
from pipelines.versions.lock import writer_lock
cfg = {"artifacts": sys.argv[1], "backend": {"kind": "embedded"}, "lock": {"timeout_s": 120}}
with writer_lock(cfg, "writer " + sys.argv[2]):
    with open(sys.argv[3], "a") as log:
        log.write(f"start {sys.argv[2]} {time.time()}\\n")
    time.sleep(3)
    with open(sys.argv[3], "a") as log:
        log.write(f"end {sys.argv[2]} {time.time()}\\n")
"""


@pytest.mark.s3
def test_two_writers_with_separate_working_directories_are_serialised_by_the_lock_object(s3_server, tmp_path):
    uri = s3_server.bucket("locks-two-writers") + "/nightly"
    log = tmp_path / "holds.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | s3_server.env | {"PYTHONPATH": str(ROOT)}
    procs = []
    for name in ("a", "b"):
        cwd = tmp_path / f"worker-{name}"
        cwd.mkdir()
        procs.append(subprocess.Popen([sys.executable, "-c", HOLDER, uri, name, str(log)], cwd=cwd, env=env))
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    events = [line.split() for line in log.read_text().splitlines()]
    assert [e[0] for e in events] == ["start", "end", "start", "end"]  # never two holders at once
    assert events[0][1] == events[1][1] and events[2][1] == events[3][1] != events[0][1]
    assert float(events[2][2]) >= float(events[1][2])
    assert not any((tmp_path / f"worker-{n}" / ".sourcegate.lock").exists() for n in ("a", "b"))


@pytest.mark.s3
def test_an_expired_lock_object_is_broken_and_a_live_one_is_named(s3_server, monkeypatch, caplog):
    from pipelines.versions import object_lock
    from pipelines.versions.lock import LockHeld

    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    store = ObjectStore.from_uri(s3_server.bucket("locks-stale") + "/n")
    gone = {"pid": 1, "host": "another-host", "command": "sourcegate run x", "since": "then", "token": "t"}
    store.put(object_lock.LOCK_KEY, json.dumps(gone | {"expires": 0}).encode())
    release = object_lock.acquire_object(store, "me", timeout_s=0)
    assert "broke the stale lock" in caplog.text
    with pytest.raises(LockHeld, match="locked by pid"):
        object_lock.acquire_object(store, "second", timeout_s=0)
    release()
    assert not store.exists(object_lock.LOCK_KEY)


def all_text(folder: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in folder.rglob("*") if p.is_file())


@pytest.mark.s3
@pytest.mark.models
def test_a_whole_night_to_the_server_then_a_query_from_it_and_an_outage_leaves_live(s3_server, tmp_path):
    from tests.s3_server import SECRET

    uri = s3_server.bucket("demo-nights") + "/sourcegate"
    env = s3_server.env | {"SOURCEGATE_CACHE": str(tmp_path / "cache")}
    config = project_config(tmp_path / "pipeline.yaml")
    work = tmp_path / "night-1"
    work.mkdir()
    night = sourcegate(["run", "--artifacts", uri, "--quiet"], env, work, config)
    assert night.returncode == 0, night.stderr[-3000:]
    assert f"artifacts: {uri}/runs/" in night.stdout
    store = ObjectStore.from_uri(uri, fs=_server_fs(s3_server))
    live = store.get("LIVE").decode().strip()
    keys = store.listing()
    assert f"runs/{live}/index/manifest.json" in keys and f"runs/{live}/report.html" in keys
    assert len(store.listing("promotions/")) == 1
    assert not (work / "artifacts").exists()  # nothing written to a local artifacts folder

    query_dir = tmp_path / "query"
    query_dir.mkdir()
    answer = sourcegate(
        ["query", "Can I bring my bike on the train?", "--artifacts", uri, "--json"], env, query_dir, config
    )
    assert answer.returncode == 0, answer.stderr[-3000:]
    assert json.loads(answer.stdout)["passages"]
    assert list((tmp_path / "cache").iterdir())  # downloaded once, keyed by the manifest hash
    verify = sourcegate(["verify", live, "--artifacts", uri], env, query_dir, config)
    assert verify.returncode == 0 and "ok" in verify.stdout

    # The server goes away during the next night (its endpoint closes: moto keeps objects only in memory, so
    # the night talks to it through a relay that is closed): a clear error, exit 2, and LIVE is untouched.
    # The steps run on scratch and first meet the store again when they publish, whatever they computed, so
    # this night runs without the cross-encoder (its evaluation is most of a night's time; the gate's
    # verdict does not matter to a night that cannot publish). The rerun below is a whole night.
    from tests.s3_server import Relay

    relay = Relay(s3_server.port)
    outage = tmp_path / "night-2"
    outage.mkdir()
    proc = subprocess.Popen(
        sourcegate_argv(
            ["run", "--artifacts", uri, "--quiet", "--run-id", "outage-night", "--set", "reranker.kind=none"], config
        ),
        env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        | env
        | {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{relay.port}", "PYTHONPATH": str(ROOT)},
        cwd=outage,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_stage(proc)
    relay.close()
    out, err = proc.communicate(timeout=1800)
    assert proc.returncode == 2, (out[-2000:], err[-2000:])
    assert f"object store {uri} failed while publishing" in err and "LIVE was not changed" in err, err[-2000:]
    assert "Traceback" not in err
    assert store.get("LIVE").decode().strip() == live
    assert not store.listing("runs/outage-night/")  # nothing of the failed night was published

    rerun = sourcegate(["run", "--artifacts", uri, "--quiet", "--run-id", "outage-night"], env, outage, config)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert store.get("LIVE").decode().strip() == "outage-night"

    # No credential in any artifact on the store, any local leftover, or any output.
    scratch_copy = tmp_path / "copy"
    for key in store.listing():
        store.download(key, scratch_copy / key)
    texts = [all_text(scratch_copy), all_text(tmp_path / "cache"), all_text(work), all_text(outage)]
    texts += [night.stdout, night.stderr, answer.stdout, answer.stderr, out, err, rerun.stdout, rerun.stderr]
    texts.append(s3_server.log.read_text(errors="replace"))
    assert not any(SECRET in text for text in texts)


def _server_fs(server):
    from tests.s3_server import CREDENTIALS

    return pafs.S3FileSystem(
        access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region="us-east-1",
        endpoint_override=f"127.0.0.1:{server.port}",
        scheme="http",
    )


def _wait_for_stage(proc, timeout=600):
    """Until the night has staged its inputs and is running its steps (a scratch folder exists)."""
    import glob
    import tempfile
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if glob.glob(os.path.join(tempfile.gettempdir(), "sourcegate-stage-*", "runs", "outage-night", "run.json")):
            return
        time.sleep(0.5)
    raise AssertionError("the night never reached its steps")
