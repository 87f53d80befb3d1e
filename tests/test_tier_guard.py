"""The tier guard: an unmarked test cannot reach the real models or the node; fakes and broken paths pass."""

import logging

import pytest

from tests.tier_guard import UnmarkedHeavyUse, guarded


class Item:
    """The parts of a pytest item the guard reads."""

    def __init__(self, *markers):
        self.nodeid = "tests/test_x.py::test_x"
        self.marks = [pytest.Mark(m, (), {}) for m in markers]

    def iter_markers(self):
        return iter(self.marks)


def test_unmarked_embedding_model_load_raises_naming_the_marker():
    from sourcegate.pipelines.build.embed import Embedder

    with guarded(Item()) as trips, pytest.raises(UnmarkedHeavyUse, match="pytest.mark.models"):
        Embedder("sentence-transformers/all-MiniLM-L6-v2")
    assert trips and "loads the embedding model" in trips[0]


def test_swallowed_cross_encoder_load_is_still_recorded(caplog):
    from sourcegate.pipelines.retrieval.rerank import load_scorer

    with guarded(Item()) as trips, caplog.at_level(logging.WARNING):
        assert load_scorer("onnx") is None  # load_scorer logs and swallows load errors by design
    assert len(trips) == 1 and "cross-encoder" in trips[0]


def test_broken_model_paths_pass_through_to_their_own_error(tmp_path):
    from sourcegate.pipelines.retrieval.rerank import OnnxCrossEncoder

    with guarded(Item()) as trips, pytest.raises(FileNotFoundError):
        OnnxCrossEncoder(tmp_path / "missing")
    assert trips == []


def test_unmarked_opensearch_request_raises():
    from opensearchpy import OpenSearch

    client = OpenSearch("http://127.0.0.1:1")
    with guarded(Item("models")) as trips, pytest.raises(UnmarkedHeavyUse, match="pytest.mark.opensearch"):
        client.info()
    assert len(trips) == 1


def test_marked_tests_are_not_guarded():
    from opensearchpy.transport import Transport

    from sourcegate.pipelines.build.embed import Embedder

    before = (Embedder.__init__, Embedder.encode, Transport.perform_request)
    with guarded(Item("models", "opensearch")) as trips:
        assert (Embedder.__init__, Embedder.encode, Transport.perform_request) == before
    with guarded(Item()):
        assert Embedder.__init__ is not before[0]
    assert (Embedder.__init__, Embedder.encode, Transport.perform_request) == before  # undone
    assert trips == []
