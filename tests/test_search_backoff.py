"""Searches the node rejects with 429 (overloaded) are retried with bounded backoff, then exit 2 with one line.

A unit test of a failure path: the client is a fake that answers 429 (the whole request, or one sub-search of an
``_msearch`` as the node reports it) a given number of times; the waits are recorded instead of slept.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from opensearchpy import TransportError

from sourcegate.pipelines.app import cli
from sourcegate.pipelines.config import OpenSearch
from sourcegate.pipelines.search.opensearch import backoff
from sourcegate.pipelines.search.opensearch.searcher import OpenSearchSearcher

REJECTION = {
    "error": {
        "root_cause": [{"type": "rejected_execution_exception", "reason": "rejected execution of search (queue full)"}],
        "type": "rejected_execution_exception",
        "reason": "rejected execution of search (queue full)",
    },
    "status": 429,
}
OK = {"hits": {"total": {"value": 3}, "hits": [{"_id": "c1", "_score": 0.9, "_source": {}}]}, "status": 200}


class RejectingClient:
    """Answers 429 `rejections` times, then normally; counts the calls."""

    def __init__(self, rejections: int, *, per_search: bool):
        self.rejections = rejections
        self.per_search = per_search
        self.calls = 0

    def _reject(self) -> bool:
        self.calls += 1
        if self.calls > self.rejections:
            return False
        if not self.per_search:
            raise TransportError(429, "rejected_execution_exception", REJECTION)
        return True

    def msearch(self, body, filter_path):
        rejected = self._reject()
        n = len(body) // 2
        return {"responses": [REJECTION if rejected and i == 1 else OK for i in range(n)]}

    def search(self, index, body):
        self._reject()
        return OK


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(backoff.time, "sleep", slept.append)
    return slept


def test_the_schedule_doubles_and_is_capped():
    assert list(backoff.delays(6, 0.5, 8.0)) == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert list(backoff.delays(0, 0.5, 8.0)) == []


@pytest.mark.parametrize("per_search", [False, True], ids=["whole-request", "one-sub-search"])
def test_a_rejected_search_is_retried_with_backoff_and_then_answers(waits, per_search):
    client = RejectingClient(2, per_search=per_search)
    searcher = OpenSearchSearcher(client, "sg-v1", OpenSearch(search_retries=4))
    result = searcher.hybrid("fares", np.ones(4, dtype=np.float32), 5, 5)
    assert [h.chunk_id for h in result.bm25] == ["c1"] and result.distribution.total == 3
    assert client.calls == 3 and waits == [0.5, 1.0]


@pytest.mark.parametrize("per_search", [False, True], ids=["whole-request", "one-sub-search"])
def test_a_search_still_rejected_after_the_retries_exits_2_with_one_line(waits, per_search, capsys):
    client = RejectingClient(10, per_search=per_search)
    searcher = OpenSearchSearcher(client, "sg-v1", OpenSearch(search_retries=4))
    with pytest.raises(TransportError) as caught:
        searcher.hybrid("fares", np.ones(4, dtype=np.float32), 5, 5)
    assert caught.value.status_code == 429
    assert client.calls == 5 and waits == [0.5, 1.0, 2.0, 4.0]  # bounded: 4 retries, 7.5 s in all

    def raise_it(_args):
        raise caught.value

    code = cli.run_command(argparse.Namespace(func=raise_it, command="query", verbose=False))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err == (
        "sourcegate: OpenSearch rejected requests (429 Too Many Requests) during query after bounded retries: "
        "rejected execution of search (queue full)\n"
    )


def test_other_errors_are_not_retried(waits):
    class Failing:
        calls = 0

        def search(self, index, body):
            self.calls += 1
            raise TransportError(400, "parsing_exception", {"error": {"reason": "bad query"}})

    client = Failing()
    with pytest.raises(TransportError, match="parsing_exception"):
        OpenSearchSearcher(client, "sg-v1").bm25("fares", 5)
    assert client.calls == 1 and waits == []
