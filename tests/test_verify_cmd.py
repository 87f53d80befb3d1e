"""`sourcegate verify` holds the writer lock and works on s3:// artifacts as on a local folder.

It may write run.json (the `promoted` a crash left out, from the promotions log), so it waits for a running
writer like any other writer; on an object store it verifies the version's staged files and publishes the
repaired run.json back (the moto server, tests/s3_server.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sourcegate.artifact_io import read_json, write_json
from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines.app import staging, steps
from sourcegate.pipelines.app.cli import main
from sourcegate.pipelines.app.factories import open_store
from sourcegate.pipelines.versions import promotions
from tests.test_lock import start_holder
from tests.test_verdicts import INPUTS, pass_gate

VERSION = "20260101-020000"


def promoted_then_crashed(cfg, chunks: Path) -> Path:
    """A promoted version whose run.json lost its `promoted` (a crash after the promotions log was written)."""
    open_store(cfg).load(VERSION, str(chunks), inputs=INPUTS)
    pass_gate(cfg, VERSION)
    steps.promote_step(RunFolder(cfg.artifacts, VERSION), cfg)
    run_json = RunFolder(cfg.artifacts, VERSION).path / "run.json"
    info = read_json(run_json)
    del info["promoted"]
    write_json(info, run_json)
    return run_json


@pytest.fixture
def local_night(make_cfg, tmp_path):
    from tests.test_embedded_backend import synthetic_chunks

    cfg = make_cfg()
    synthetic_chunks(tmp_path / "c.parquet", n=9)
    return cfg, promoted_then_crashed(cfg, tmp_path / "c.parquet")


def test_verify_waits_for_the_writer_lock_and_names_its_holder(local_night, capsys):
    cfg, run_json = local_night
    holder = start_holder(cfg.artifacts)
    try:
        assert main(["--set", "lock.timeout_s=0", "verify", VERSION, "--artifacts", cfg.artifacts]) == 2
        err = capsys.readouterr().err
        assert f"is locked by pid {holder.pid}" in err and "test holder" in err
        assert "promoted" not in read_json(run_json)  # nothing written beside the holder
    finally:
        holder.communicate("")
    assert main(["verify", VERSION, "--artifacts", cfg.artifacts]) == 0
    assert "run.json's missing `promoted` written" in capsys.readouterr().out
    assert read_json(run_json)["promoted"]["version"] == VERSION


def upload(folder: Path, store) -> None:
    """A local artifacts folder onto the object store, laid out as a night on the store publishes it."""
    for path in sorted((folder / "runs").rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            store.upload(path, path.relative_to(folder).as_posix())
    for record in promotions.read_records(folder / promotions.PROMOTIONS_LOG):
        store.put(staging.record_key(record), json.dumps(record, sort_keys=True, ensure_ascii=False).encode())
    store.put(staging.LIVE, (folder / staging.LIVE).read_bytes())


@pytest.mark.s3
def test_verify_on_s3_repairs_run_json_on_the_store_under_the_lock_object(local_night, s3_server, s3_env, capsys):
    from sourcegate.pipelines.release.object_lock import acquire_object
    from sourcegate.pipelines.versions.object_store import ObjectStore
    from tests.test_object_store import _server_fs

    cfg, _ = local_night
    uri = s3_server.bucket("verify-cmd") + "/sourcegate"
    store = ObjectStore.from_uri(uri, fs=_server_fs(s3_server))
    upload(Path(cfg.artifacts), store)
    run_key = f"runs/{VERSION}/run.json"
    assert "promoted" not in json.loads(store.get(run_key))

    held = acquire_object(store, "test holder on the store", 0)  # a night holds the store's lock
    try:
        assert main(["--set", "lock.timeout_s=0", "verify", VERSION, "--artifacts", uri]) == 2
        assert "is locked by" in capsys.readouterr().err
        assert "promoted" not in json.loads(store.get(run_key))
    finally:
        held.release()

    assert main(["verify", VERSION, "--artifacts", uri]) == 0
    out = capsys.readouterr().out
    assert "run.json's missing `promoted` written" in out and f"{VERSION}: ok" in out
    assert json.loads(store.get(run_key))["promoted"]["version"] == VERSION  # published back to the store

    npy = f"runs/{VERSION}/index/embeddings.npy"
    store.put(npy, store.get(npy)[:-8])  # a truncated file on the store
    assert main(["verify", VERSION, "--artifacts", uri]) == 2
    assert "embeddings.npy" in capsys.readouterr().err
