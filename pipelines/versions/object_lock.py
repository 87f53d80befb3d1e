"""The one-writer lock of an object-store artifacts prefix: a lock object, for processes sharing no disk.

`<prefix>/.sourcegate.lock.json` holds the holder (pid, host, command, since, token) and `expires` (epoch
seconds, `LEASE_S` after it was taken). A writer takes the lock when no unexpired lock object exists: it
PUTs its record, waits `SETTLE_S` and reads the object back; only the writer whose token is read back
holds it (two writers that raced both read the later PUT, so exactly one goes on). An expired lock, or
one whose holder is a dead process on this host, is broken with a warning naming it.

Why read-back and not a conditional PUT: pyarrow.fs (the one filesystem library, object_store.py) sends
no If-None-Match. Read-back after a settle is safe while every writer's PUT lands within SETTLE_S of its
look-up (S3 has been strongly consistent since 2020); a store behind a slower path needs a longer settle.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from pipelines.versions.holder import POLL_S, LockHeld, describe, holder_record, is_stale
from pipelines.versions.object_store import ObjectStore

log = logging.getLogger(__name__)

LOCK_KEY = ".sourcegate.lock.json"
LEASE_S = 6 * 3600.0  # a night takes minutes; a holder that vanished (another host) is broken after this
SETTLE_S = 1.0


def _read(store: ObjectStore) -> dict | None:
    data = store.get(LOCK_KEY)
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None  # a torn or foreign object: treated as no lock, and overwritten


def breakable(holder: dict | None, now: float) -> bool:
    return bool(holder) and (float(holder.get("expires", 0)) <= now or is_stale(holder))


def acquire_object(store: ObjectStore, command: str, timeout_s: float) -> Callable[[], None]:
    """Take the lock object (waiting up to `timeout_s`); returns the function that releases it."""
    deadline = time.monotonic() + max(timeout_s, 0.0)
    while True:
        holder = _read(store)
        if holder and breakable(holder, time.time()):
            log.warning("broke the stale lock of %s on %s", describe(holder), store.uri)
            holder = None
        if holder is None:
            record = holder_record(command) | {"expires": time.time() + LEASE_S}
            store.put(LOCK_KEY, json.dumps(record, sort_keys=True).encode())
            time.sleep(SETTLE_S)
            holder = _read(store)
            if holder and holder.get("token") == record["token"]:
                return lambda: _release(store, record["token"])
        if time.monotonic() >= deadline:
            raise LockHeld(
                f"{store.uri} is locked by {describe(holder)}; waited {timeout_s:g} s (set lock.timeout_s, or "
                f"--lock-timeout, to wait longer; a holder that is gone is broken after {LEASE_S:g} s)"
            )
        time.sleep(POLL_S)


def _release(store: ObjectStore, token: str) -> None:
    if (_read(store) or {}).get("token") == token:
        store.delete(LOCK_KEY)
