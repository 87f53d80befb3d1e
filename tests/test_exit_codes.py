"""Exit codes a release gate can rely on (G10): 0 passed, 1 the gate failed, 2 anything else, with one line
naming the cause and the step (the traceback only with -v). Each OpenSearch failure class is produced by a
real node: a closed port, a write block on an index of this test's own prefix on the shared node, and the
destructive ones (flood stage, a create-index block) on a private node (tests/private_node.py)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines import config
from sourcegate.pipelines.app import cli
from sourcegate.pipelines.app.errors import exit_line
from sourcegate.pipelines.release.lock import locked, step_of, writer_lock


def run_raising(exc: BaseException, capsys, *, verbose: bool = False, command: str = "run"):
    def raise_it(_args):
        raise exc

    args = argparse.Namespace(func=raise_it, command=command, verbose=verbose)
    code = cli.run_command(args)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("exc", [TypeError("boom"), KeyboardInterrupt(), KeyError("x"), RuntimeError("r")])
def test_every_exception_class_exits_2_with_one_line_and_no_traceback(exc, capsys):
    code, err = run_raising(exc, capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("sourcegate: ") and "Traceback" not in err
    assert "during run" in err


def test_the_command_line_keeps_its_exit_code_and_output_when_query_ends_its_process_early(tmp_path):
    # `query` ends its process without finalizing the interpreter (cli.QUICK_EXIT): what it printed and its exit
    # code must still reach the caller; another command exits as usual.
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}

    def sourcegate(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "sourcegate.pipelines.app.cli", *args]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env, timeout=120)

    assert "query" in cli.QUICK_EXIT and "run" not in cli.QUICK_EXIT
    refused = sourcegate("query", "--artifacts", str(tmp_path), "Is the fare free on Sundays?")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("sourcegate: ") and "no live index" in refused.stderr, refused.stderr
    schema = sourcegate("config-schema")
    assert schema.returncode == 0 and schema.stdout.rstrip().endswith("}"), schema.stderr


def test_an_interrupt_says_so(capsys):
    assert run_raising(KeyboardInterrupt(), capsys)[1] == "sourcegate: interrupted during run\n"


def test_the_traceback_only_with_verbose(capsys):
    code, err = run_raising(TypeError("boom"), capsys, verbose=True)
    assert code == 2 and "Traceback" in err and "TypeError: boom" in err


def test_a_locked_step_names_itself_and_an_outer_step_does_not_rename_it(tmp_path):
    cfg = config.load(None, {"artifacts": str(tmp_path)})
    run = RunFolder(tmp_path, "r1")

    @locked("evaluate")
    def inner(run, cfg):
        raise ValueError("no such question")

    @locked("run")
    def outer(run, cfg):
        inner(run, cfg)

    with pytest.raises(ValueError) as caught:
        outer(run, cfg)
    assert step_of(caught.value) == "evaluate"
    assert exit_line(caught.value, "run", "http://x") == "ValueError during evaluate: no such question"


def test_a_failing_lock_release_never_replaces_the_original_error(tmp_path, monkeypatch, caplog):
    """A unit test of a failure path: the release is made to fail as it does when the node went away."""
    from sourcegate.pipelines.release import lock

    real = lock.acquire_folder

    def acquire_with_failing_release(*a, **k):
        release = real(*a, **k)

        def failing():
            release()
            raise ConnectionError("node gone while releasing")

        return failing

    monkeypatch.setattr(lock, "acquire_folder", acquire_with_failing_release)
    cfg = config.load(None, {"artifacts": str(tmp_path)})
    with pytest.raises(ValueError, match="the original"), writer_lock(cfg, "test"):
        raise ValueError("the original")
    assert "could not release the lock" in caplog.text and "node gone while releasing" in caplog.text
    assert "the original" in caplog.text  # logged beside it


def test_a_wrapped_opensearch_error_is_named_by_its_cause():
    from opensearchpy import ConnectionError as Unreachable

    try:
        try:
            raise Unreachable("N/A", "refused", None)
        except Unreachable as e:
            raise RuntimeError("lost the connection while loading") from e
    except RuntimeError as wrapped:
        line = exit_line(wrapped, "load", "http://127.0.0.1:1")
    assert line.startswith("OpenSearch unreachable at http://127.0.0.1:1 during load")


@pytest.mark.opensearch
def test_an_unreachable_node_exits_2_naming_the_url_and_the_command(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("OPENSEARCH_URL", "http://127.0.0.1:1")  # nothing listens on port 1
    code = cli.main(["verify", "v1", "--backend", "opensearch", "--artifacts", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("sourcegate: OpenSearch unreachable at http://127.0.0.1:1 during verify")
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.opensearch
def test_a_write_block_on_a_real_index_is_a_clear_line_naming_the_step(os_client, tmp_path, capsys):
    """A read-only block on an index of this test's own prefix on the shared node; the index is deleted after."""
    index = f"sg-exit-{uuid.uuid4().hex[:8]}-v1"
    os_client.indices.create(index=index)
    os_client.indices.put_settings(index=index, body={"index": {"blocks": {"read_only": True}}})
    cfg = config.load(None, {"artifacts": str(tmp_path)})

    @locked("load")
    def write(_run, _cfg):
        os_client.index(index=index, id="c1", body={"text": "x"})

    try:
        args = argparse.Namespace(func=lambda _a: write(RunFolder(tmp_path, "r1"), cfg), command="run", verbose=False)
        code = cli.run_command(args)
    finally:
        os_client.indices.put_settings(index=index, body={"index": {"blocks": {"read_only": None}}})
        os_client.indices.delete(index=index)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("sourcegate: OpenSearch refuses writes during load: ")
    assert index in err and "read-only" in err and "then clear the block" in err


@pytest.mark.opensearch
def test_a_missing_index_is_a_clear_line(os_client, tmp_path, capsys):
    index = f"sg-exit-{uuid.uuid4().hex[:8]}-gone"

    @locked("evaluate")
    def search(_run, _cfg):
        os_client.search(index=index, body={"query": {"match_all": {}}})

    cfg = config.load(None, {"artifacts": str(tmp_path)})
    run = RunFolder(tmp_path, "r1")
    code = cli.run_command(argparse.Namespace(func=lambda _a: search(run, cfg), command="run", verbose=False))
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("sourcegate: OpenSearch has no such index or alias during evaluate: no such index")
