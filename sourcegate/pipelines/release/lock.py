"""One writer at a time: a lock per artifacts folder (and per OpenSearch alias).

Every command and task that writes run folders, index versions, LIVE or baselines holds
`writer_lock(cfg, command)`. The folder lock is `fcntl.flock` on `<artifacts>/.sourcegate.lock`:
the kernel releases it when its holder dies, SIGKILL included, so a dead holder can never keep it.
Who holds it is recorded beside it (`.sourcegate.lock.json`, written atomically once the lock is
taken) only so that a second writer can name the holder; a record left by a killed holder is
reported as a broken stale lock when the next writer takes over.

The OpenSearch alias is shared by every machine that talks to the node, so its lock is a document
created with `op_type=create` (atomic: exactly one creator wins) in the small index `LOCK_INDEX`. The
document carries a lease (`expires`), renewed by its holder while it works; a lock document of a dead
process on this host, or one whose lease ran out (its holder died on another host), is deleted with
`if_seq_no`/`if_primary_term` (so two breakers cannot both win, and a renewal in between wins over both).

Locks are re-entrant within one thread: `sourcegate run` holds the lock for the whole night and
the steps it calls (which lock for themselves when Airflow runs them as tasks) just join it.
Embed shards take the folder lock shared: Airflow runs them in parallel, each writes only its own
shard file, and a shared hold still keeps every exclusive writer (retention, promote) out.

An `s3://` artifacts prefix is locked by a renewed, fenced lease (object_lock.py), shared holders included;
`fence(cfg)` is the check its publication runs first (staging.publish).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from sourcegate.artifact_io import write_json
from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines import faults
from sourcegate.pipelines.config import Lock, PipelineConfig
from sourcegate.pipelines.release.object_lock import Lease, acquire_object
from sourcegate.pipelines.search.opensearch.health import LOCK_INDEX
from sourcegate.pipelines.versions.holder import POLL_S, LockHeld, describe, holder_record, is_stale
from sourcegate.pipelines.versions.object_store import ObjectStore, is_remote

log = logging.getLogger(__name__)

LOCK_FILE = ".sourcegate.lock"
HOLDER_FILE = ".sourcegate.lock.json"


@dataclass
class _Hold:
    count: int
    shared: bool
    release: Callable[[], None]
    since: float  # epoch seconds
    fence: Callable[[], None] | None = None  # an object-store lease's check: raises LockLost when superseded


_held: dict[tuple[str, int], _Hold] = {}  # (lock key, thread id) -> this thread's hold


_task_locking: ContextVar[Lock | None] = ContextVar("sourcegate_task_locking", default=None)


@contextmanager
def task_locking(settings: Lock) -> Iterator[None]:
    """Within it, every lock waits at least `settings.timeout_s`, and a step given only a config section locks by
    `settings` (its wait, its lease) instead of the defaults: a DAG task knows the whole config even where its step
    takes a section, and waits as a scheduled task may (common.in_store). The config itself is left as it is (a
    verdict judges it)."""
    token = _task_locking.set(settings)
    try:
        yield
    finally:
        _task_locking.reset(token)


def timeout_of(cfg: PipelineConfig) -> float:
    task = _task_locking.get()
    return max(float(cfg.lock.timeout_s), float(task.timeout_s) if task else 0.0)


def command_line() -> str:
    return " ".join(["sourcegate", *sys.argv[1:]]) if sys.argv and "pipelines" in sys.argv[0] else " ".join(sys.argv)


# --- the artifacts folder lock (flock) ------------------------------------------------------------


def _read_holder(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def acquire_folder(artifacts: str | Path, command: str, timeout_s: float, shared: bool = False) -> Callable[[], None]:
    """Take the folder lock (waiting up to `timeout_s`); returns the function that releases it."""
    folder = Path(artifacts)
    folder.mkdir(parents=True, exist_ok=True)
    holder_path = folder / HOLDER_FILE
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    deadline = time.monotonic() + max(timeout_s, 0.0)
    while True:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            if time.monotonic() >= deadline:
                os.close(fd)
                raise LockHeld(
                    f"{folder} is locked by {describe(_read_holder(holder_path))}; waited {timeout_s:g} s "
                    "(set lock.timeout_s, or --lock-timeout, to wait longer)"
                ) from None
            time.sleep(POLL_S)
    if shared:
        return lambda: os.close(fd)  # closing the descriptor drops the flock
    previous = _read_holder(holder_path)
    if previous:  # only a holder that died (its flock went with it) leaves a record behind
        log.warning("broke the stale lock of %s on %s", describe(previous), folder)
    record = holder_record(command)
    write_json(record, holder_path)

    def release() -> None:
        if (_read_holder(holder_path) or {}).get("token") == record["token"]:
            holder_path.unlink(missing_ok=True)
        os.close(fd)

    return release


# --- the OpenSearch alias lock (a document) ---------------------------------------------------------

# The alias lock's lease: a holder writes `expires` (epoch seconds) into its document and renews it every
# ALIAS_RENEW_EVERY of the lease while it works, so a holder that died on another host (no pid to check) is
# taken over once its lease has run out. Minutes, not seconds: hosts' clocks may differ by a few seconds, and a
# renewal may wait on a busy node.
ALIAS_LEASE_S = 300.0
ALIAS_RENEW_EVERY = 0.2  # of the lease: four renewals may fail before the lease runs out


def lease_expired(holder: dict, now: float) -> bool:
    """A holder whose lease ran out (a record written before leases has none: only its pid can free it)."""
    return "expires" in holder and float(holder["expires"]) <= now


class _Renewal(threading.Thread):
    """Pushes the lock document's `expires` forward while its holder works, each write conditional on the last
    (if_seq_no / if_primary_term): a holder whose document was taken over stops renewing and says so."""

    def __init__(self, client, alias: str, record: dict, seq_no: int, primary_term: int, lease_s: float):
        super().__init__(name=f"lease {alias}", daemon=True)
        self.client, self.alias, self.record, self.lease_s = client, alias, record, lease_s
        self.seq_no, self.primary_term = seq_no, primary_term
        self.done = threading.Event()

    def run(self) -> None:
        from opensearchpy import ConflictError, NotFoundError

        while not self.done.wait(self.lease_s * ALIAS_RENEW_EVERY):
            body = self.record | {"expires": time.time() + self.lease_s}
            try:
                out = self.client.index(
                    index=LOCK_INDEX,
                    id=self.alias,
                    body=body,
                    if_seq_no=self.seq_no,
                    if_primary_term=self.primary_term,
                    refresh="true",
                )
                self.seq_no, self.primary_term = out["_seq_no"], out["_primary_term"]
            except (ConflictError, NotFoundError):
                log.error("lost the lock on alias %s: its lease ran out and another writer took it", self.alias)
                return
            except Exception as exc:  # the node unreachable for a moment: the next renewal tries again
                log.warning("could not renew the lease on alias %s (%s: %s)", self.alias, type(exc).__name__, exc)

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=30)


def acquire_alias(
    client, alias: str, command: str, timeout_s: float, lease_s: float | None = None
) -> Callable[[], None]:
    from opensearchpy import ConflictError, NotFoundError

    lease_s = ALIAS_LEASE_S if lease_s is None else lease_s
    record = holder_record(command)

    def delete_unchanged(doc: dict) -> None:
        """Delete the lock document only if nobody rewrote it since `doc` was read."""
        client.delete(
            index=LOCK_INDEX,
            id=alias,
            if_seq_no=doc["_seq_no"],
            if_primary_term=doc["_primary_term"],
            refresh="true",
        )

    deadline = time.monotonic() + max(timeout_s, 0.0)
    while True:
        try:
            body = record | {"expires": time.time() + lease_s}
            created = client.index(index=LOCK_INDEX, id=alias, body=body, op_type="create", refresh="true")
            break
        except ConflictError:
            try:
                doc = client.get(index=LOCK_INDEX, id=alias)
            except NotFoundError:
                continue  # released between our create and get: try again
            holder = doc["_source"]
            expired = lease_expired(holder, time.time())
            if expired or is_stale(holder):
                try:
                    delete_unchanged(doc)
                    why = "its lease ran out" if expired else "its process is gone"
                    log.warning("broke the stale lock of %s on alias %s (%s)", describe(holder), alias, why)
                except (ConflictError, NotFoundError):
                    pass  # someone else broke, renewed or re-took it first
                continue
            if time.monotonic() >= deadline:
                raise LockHeld(
                    f"OpenSearch alias {alias} is locked by {describe(holder)}; waited {timeout_s:g} s. "
                    + until(holder, alias)
                ) from None
            time.sleep(POLL_S)

    renewal = _Renewal(client, alias, record, created["_seq_no"], created["_primary_term"], lease_s)
    renewal.start()

    def release() -> None:
        renewal.stop()
        try:
            doc = client.get(index=LOCK_INDEX, id=alias)
            if doc["_source"].get("token") == record["token"]:
                delete_unchanged(doc)
        except (NotFoundError, ConflictError):
            pass

    return release


def until(holder: dict, alias: str) -> str:
    """When a holder that is gone stops blocking (for the error a waiting writer gets)."""
    if "expires" in holder:
        return (
            f"Its lease is renewed while it works; if it is gone (another host), the lock is taken over once the "
            f"lease runs out, {max(float(holder['expires']) - time.time(), 0):.0f} s from now"
        )
    return f"If that process is gone (another host), delete the document {LOCK_INDEX}/_doc/{alias}"


# --- re-entrant holds ------------------------------------------------------------------------------


@contextmanager
def _hold(key: str, shared: bool, acquire: Callable[[], Callable[[], None]]) -> Iterator[None]:
    slot = (key, threading.get_ident())
    hold = _held.get(slot)
    if hold is not None:
        if hold.shared and not shared:
            raise RuntimeError(f"{key}: cannot upgrade a shared lock to an exclusive one")
        hold.count += 1
        try:
            yield
        finally:
            hold.count -= 1
        return
    got = acquire()  # a release function, or an object-store Lease (release + check)
    _held[slot] = _Hold(1, shared, getattr(got, "release", got), time.time(), getattr(got, "check", None))
    try:
        yield
    except BaseException as original:
        release_beside(_held.pop(slot).release, key, original)
        raise
    _held.pop(slot).release()


def release_beside(release: Callable[[], None], key: str, original: BaseException) -> None:
    """Release while `original` propagates: a failing release (the node that broke the step is gone too)
    is logged beside it and never replaces it; the record it leaves is stale once this process ends."""
    try:
        release()
    except Exception as exc:
        log.warning("could not release the lock %s (%s: %s) after: %s", key, type(exc).__name__, exc, original)


def lock_key(artifacts: str | Path) -> str:
    artifacts = str(artifacts)
    return artifacts.rstrip("/") if is_remote(artifacts) else str(Path(artifacts).resolve())


def acquire_remote(uri: str, command: str, timeout_s: float, lease_s: float, shared: bool = False) -> Lease:
    return acquire_object(ObjectStore.from_uri(uri), command, timeout_s, lease_s=lease_s, shared=shared)


@contextmanager
def writer_lock(
    cfg: PipelineConfig, command: str | None = None, *, shared: bool = False, root: str | Path | None = None
) -> Iterator[None]:
    """Hold the artifacts folder lock (and, on the OpenSearch backend, the alias lock). `root`: the local folder the
    steps work in when it is not `cfg.artifacts` (a scratch folder staged from an object store)."""
    command = command or command_line()
    timeout = timeout_of(cfg)
    artifacts = lock_key(root if root is not None else cfg.artifacts)
    with ExitStack() as stack:
        if is_remote(artifacts):  # no shared disk: a fenced lease; shared holders (embed shards) write only their part
            lease_s = float(cfg.lock.lease_s)
            stack.enter_context(
                _hold(artifacts, shared, lambda: acquire_remote(artifacts, command, timeout, lease_s, shared))
            )
        else:
            stack.enter_context(_hold(artifacts, shared, lambda: acquire_folder(artifacts, command, timeout, shared)))
        if cfg.backend.kind == "opensearch" and not shared:
            from sourcegate.pipelines.search.opensearch.client import client_for  # the Airflow connection under Airflow

            section = cfg.backend.opensearch
            alias = section.index_prefix
            stack.enter_context(
                _hold(f"opensearch:{alias}", False, lambda: acquire_alias(client_for(section), alias, command, timeout))
            )
        yield


def fence(cfg: PipelineConfig) -> Callable[[], None]:
    """The check a publication to `cfg.artifacts` runs before it writes: raises LockLost when this thread's
    lease was superseded or lapsed, RuntimeError when it holds no lock there at all."""
    hold = _held.get((lock_key(cfg.artifacts), threading.get_ident()))
    if hold is None:
        raise RuntimeError(f"publishing to {cfg.artifacts} without holding its writer lock")
    return hold.fence or (lambda: None)


def held_since(artifacts: str | Path) -> float | None:
    """When this thread took the lock it holds on the artifacts folder `artifacts` (None: it holds none)."""
    hold = _held.get((lock_key(artifacts), threading.get_ident()))
    return hold.since if hold else None


STEP_ATTR = "sourcegate_step"


def mark_step(exc: BaseException, step: str) -> None:
    """Name the step an exception left (the innermost one: an outer step never renames it)."""
    if getattr(exc, STEP_ATTR, None) is None:
        with contextlib.suppress(AttributeError):  # an exception type without a __dict__
            setattr(exc, STEP_ATTR, step)


def step_of(exc: BaseException) -> str | None:
    """The step `exc` was raised in (None: outside every locked step)."""
    return getattr(exc, STEP_ATTR, None)


def locked(step: str, *, shared: bool = False):
    """Decorator for a step `f(where, settings, ...)`: run it under the writer lock of the artifacts folder it works
    in. `where` is a run folder (its `root`) or, for a step over the whole store, that folder itself. A step given
    the whole config (`settings`) also takes the OpenSearch alias lock and waits the configured time; a step given a
    section writes only its run folder: the folder lock, waiting the time `task_locking` set, else the default."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(where, *args, **kwargs):
            if args and isinstance(args[0], PipelineConfig):
                cfg = args[0]
            else:
                cfg = PipelineConfig(lock=_task_locking.get() or Lock())
            root = where.root if isinstance(where, RunFolder) else Path(where)  # TypeError for anything else
            try:
                with writer_lock(cfg, f"{command_line()} [{step}]", shared=shared, root=root):
                    faults.reached(f"before:{step}")
                    out = fn(where, *args, **kwargs)
                    faults.reached(f"after:{step}")
                    return out
            except BaseException as exc:
                mark_step(exc, step)
                raise

        return inner

    return wrap
