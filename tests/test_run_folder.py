"""RunFolder: a run's paths, its run.json and its neighbours, from one type."""

from __future__ import annotations

import pytest

from sourcegate.artifact_io import run_folder as rf
from sourcegate.artifact_io.run_folder import RunFolder


def test_a_run_lives_under_the_artifacts_runs_folder(tmp_path):
    run = RunFolder(str(tmp_path), "20261205-020000")
    assert run.path == tmp_path / "runs" / "20261205-020000"
    assert run / rf.CHUNKS == run.path / "chunks.parquet"
    assert run.shard(3) == run.path / "embed" / "shard-0003.parquet"


@pytest.mark.parametrize("bad", ["", "../escape", "Upper", "a/b", "-lead", "x" * 102])
def test_a_run_id_that_cannot_be_a_folder_and_an_index_suffix_is_refused_by_name(tmp_path, bad):
    with pytest.raises(ValueError, match="must match") as err:
        RunFolder(tmp_path, bad)
    assert repr(bad) in str(err.value)


def test_run_json_merges_one_level_deep_and_reads_empty_before_it_exists(tmp_path):
    run = RunFolder(tmp_path, "r1")
    assert run.info() == {}
    run.mkdir()
    run.update_info(counts={"chunks": 3}, backend="embedded")
    run.update_info(counts={"indexed": 3}, backend="opensearch")
    assert run.info() == {"counts": {"chunks": 3, "indexed": 3}, "backend": "opensearch"}
    with run.timed("load"):
        pass
    assert set(run.info()["timings_s"]) == {"load"}


def test_the_previous_run_is_the_newest_earlier_one_with_chunks(tmp_path):
    for run_id, name in [("r1", rf.CHUNKS), ("r2", rf.DOCUMENTS), ("r3", rf.CHUNKS), ("r5", rf.CHUNKS)]:
        (RunFolder(tmp_path, run_id).mkdir() / name).touch()
    (RunFolder(tmp_path, "r2") / rf.TEXT_VECTORS).touch()
    assert RunFolder(tmp_path, "r4").previous().run_id == "r3"  # r5 is later, r2 has no chunks
    assert RunFolder(tmp_path, "r1").previous() is None
    assert RunFolder(tmp_path, "r4").earlier_evaluation().run_id == "r2"
    assert RunFolder(tmp_path, "r2").earlier_evaluation() is None


def test_loadable_chunks_are_the_validated_ones_when_validation_set_any_aside(tmp_path):
    run = RunFolder(tmp_path, "r1")
    run.mkdir()
    assert run.loadable_chunks() == run / rf.CHUNKS
    (run / rf.CHUNKS_VALID).touch()
    assert run.loadable_chunks() == run / rf.CHUNKS_VALID


def test_a_staged_folder_names_its_files_where_they_are_published(tmp_path):
    local = RunFolder(tmp_path, "r1")
    assert local.published() == str(local.path)
    (tmp_path / rf.PUBLISHED_AS).write_text("s3://bucket/nightly", encoding="utf-8")
    assert local.published() == "s3://bucket/nightly/runs/r1"
    assert local.published(local / rf.REPORT) == "s3://bucket/nightly/runs/r1/report.html"
