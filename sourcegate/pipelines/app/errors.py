"""What an exception means to a release gate: one exit code and one line naming the cause and the step (G10).

Exit codes mean one thing each: 0 passed, 1 the gate failed (a verdict, never an exception), 2 anything
else. Every exception, whatever its class, is a 2: a client error, a full disk or a ^C must never read as
"the gate failed". The step is the innermost locked step the exception crossed (`lock.step_of`), else the
command. OpenSearch failures are named by class (unreachable, refusing writes, rejecting, missing index),
looked up along the exception's cause chain, so a wrapper's message never hides that the node was the cause.
"""

from __future__ import annotations

from collections.abc import Iterator

from sourcegate.evals.harness import NotAVerdict
from sourcegate.pipelines.release.decision import NotProven
from sourcegate.pipelines.release.lock import step_of
from sourcegate.pipelines.retrieval.rerank import ModelUnavailable
from sourcegate.pipelines.search.opensearch.health import RECOVERY, PreflightFailed
from sourcegate.pipelines.versions.holder import LockHeld
from sourcegate.pipelines.versions.manifest import IntegrityError

GATE_FAILED = 1
ERROR = 2


def causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and what caused it, outermost first (each once)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def opensearch_reason(exc) -> str:
    """The node's own reason for a TransportError (its root cause), else the exception's text."""
    info = exc.info if isinstance(getattr(exc, "info", None), dict) else {}
    error = info.get("error")
    if isinstance(error, dict):
        root = (error.get("root_cause") or [error])[0]
        return str(root.get("reason") or root.get("type") or error)
    return str(getattr(exc, "error", None) or exc)


def opensearch_line(exc: BaseException, step: str, url: str) -> str | None:
    """One line for an OpenSearch client error, None when `exc` is not one."""
    try:
        from opensearchpy import ConnectionError as Unreachable
        from opensearchpy import ConnectionTimeout, NotFoundError, TransportError
    except ImportError:  # pragma: no cover - opensearch-py is a pinned dependency
        return None
    if isinstance(exc, Unreachable):
        how = "timed out" if isinstance(exc, ConnectionTimeout) else "connection refused or lost"
        return f"OpenSearch unreachable at {url} during {step} ({how}); the live alias did not move"
    if not isinstance(exc, TransportError):
        return None
    reason = opensearch_reason(exc)
    if exc.error == "cluster_block_exception":
        return f"OpenSearch refuses writes during {step}: {reason}; {RECOVERY}"
    if exc.status_code == 429:
        return f"OpenSearch rejected requests (429 Too Many Requests) during {step} after bounded retries: {reason}"
    if isinstance(exc, NotFoundError):
        return f"OpenSearch has no such index or alias during {step}: {reason}"
    return f"OpenSearch error {exc.status_code} during {step}: {reason}"


def exit_line(exc: BaseException, command: str, url: str) -> str:
    """The one line a failed command prints: the cause and the step it happened in."""
    step = step_of(exc) or command
    for cause in causes(exc):
        line = opensearch_line(cause, step, url)
        if line:
            return line
    if isinstance(exc, PreflightFailed):
        return f"{exc} (pre-flight check of {step}: nothing was written)"
    if isinstance(exc, KeyboardInterrupt):
        return f"interrupted during {step}"
    if isinstance(exc, IntegrityError):
        return f"integrity error during {step}: {exc}"
    if isinstance(exc, LockHeld):
        return f"lock timeout during {step}: {exc}"
    if isinstance(exc, ModelUnavailable):
        return f"model unavailable during {step}, before anything was scored (no verdict): {exc}"
    if isinstance(exc, NotAVerdict):
        return f"not a verdict during {step}: {exc}"
    if isinstance(exc, NotProven):
        return f"not proven during {step}: {exc}"
    return f"{type(exc).__name__} during {step}: {exc}"
