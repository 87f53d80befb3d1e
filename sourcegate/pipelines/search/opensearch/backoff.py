"""Bounded exponential backoff for requests the node rejects as overloaded (HTTP 429).

One schedule for the bulk loader and the searches: `delays` gives the wait before each retry. A search
is retried only on 429 (a full search thread pool or a circuit breaker: the request did nothing); other
errors go straight to the caller, and once the retries are spent the last 429 propagates, which the CLI
turns into exit 2 and one line (sourcegate/pipelines/app/errors.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

REJECTED = 429


def delays(max_retries: int, initial: float, cap: float) -> Iterator[float]:
    """Seconds to wait before retry 1..max_retries: `initial` doubling, at most `cap`."""
    for attempt in range(max_retries):
        yield min(cap, initial * 2**attempt)


def rejected(exc: BaseException) -> bool:
    return getattr(exc, "status_code", None) == REJECTED


def retry_rejected(
    call: Callable[[], T],
    what: str,
    *,
    max_retries: int,
    initial: float,
    cap: float,
    sleep: Callable[[float], None] | None = None,
) -> T:
    """`call()`, retried after each 429 with the backoff schedule; the last 429 is raised as it came."""
    from opensearchpy import TransportError

    waits = delays(max_retries, initial, cap)
    while True:
        try:
            return call()
        except TransportError as exc:
            if not rejected(exc):
                raise
            delay = next(waits, None)
            if delay is None:
                raise
            log.warning("%s: 429 from OpenSearch (%s); retrying in %.2fs", what, exc.error, delay)
            (sleep or time.sleep)(delay)
