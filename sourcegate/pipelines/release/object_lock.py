"""The writer lock of an object-store artifacts prefix, for processes sharing no disk: a renewed lease and a
fencing token.

Two kinds of object under the prefix:

- `.sourcegate.lock.d/<token>.json`, a **claim**: one per contender or holder (pid, host, command, since,
  token, `shared`, `expires`). A holder's claim is its lease: a thread re-PUTs it with a new `expires` every
  `lease_s / 3` while the holder works, so a short lease (minutes) outlives any night that keeps running,
  and a holder that vanished (another host, a frozen process) is broken soon after it stops renewing.
- `.sourcegate.lock.json`, the **fence record**: the `generation` (one more at every acquisition, never
  reset: releasing leaves the record), `exclusive_generation` (the generation of the newest exclusive
  acquisition) and who took it.

Acquiring: write my claim, then list the claims. I hold the lock when no other unexpired claim that conflicts
with mine is listed (an exclusive claim conflicts with every claim; shared claims, embed shards, with exclusive
ones only); otherwise I delete my claim, wait a random moment and look again. With strongly consistent PUT and
LIST (S3 since 2020, moto, MinIO) two racing contenders cannot both win: whichever finished its PUT second
lists the first one's claim. The winner then writes the next generation into the fence record.

Fencing: before the writer publishes (run files, LIVE and the promotions record after it, removals)
`Lease.check()` re-reads the record and the claim: a newer exclusive generation (or, for an exclusive holder, any
newer generation), a claim someone broke, or a lease with less than a third of its length left means this writer
was superseded or may be at any moment; it raises `LockLost` naming both holders and publishes nothing. A lease
is never renewed with less than a quarter of it left on the holder's own clock (a renewal landing after the lapse
would bring back a claim another writer may have broken already): the holder has lost it.

Why not a conditional PUT: pyarrow.fs (the one filesystem library, object_store.py) sends no If-Match /
If-None-Match, and the pipeline's environment has no botocore (its python-dateutil cap conflicts with the
pipeline's pin). So LIVE is written by a check-and-write under this fenced lock (staging.publish): what is left
is a holder that stalls longer than a third of its lease between its last check and the PUT that follows it.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sourcegate.pipelines.versions.holder import POLL_S, LockHeld, LockLost, describe, holder_record, is_stale
from sourcegate.pipelines.versions.object_store import ObjectStore

log = logging.getLogger(__name__)

LOCK_KEY = ".sourcegate.lock.json"  # the fence record
CLAIMS = ".sourcegate.lock.d/"
LEASE_S = 120.0  # the default lease (config lock.lease_s): renewed every third of it while the holder works
SAFE_FRACTION = 1 / 3  # a holder publishes only while at least this much of its lease is left
RENEW_FRACTION = 1 / 4  # ... and renews only while this much is: one failed renewal (a third) is survived


def _json(data: bytes | None) -> dict | None:
    try:
        value = json.loads(data) if data else None
    except ValueError:
        return None  # a foreign object: not a claim, not a record
    return value if isinstance(value, dict) else None


def claim_key(token: str) -> str:
    return f"{CLAIMS}{token}.json"


def read_record(store: ObjectStore) -> dict:
    return _json(store.get(LOCK_KEY)) or {}


def conflicts(claim: dict, shared: bool) -> bool:
    return not (shared and claim.get("shared"))


def breakable(claim: dict, now: float) -> bool:
    return float(claim.get("expires", 0)) <= now or is_stale(claim)


def live_claims(store: ObjectStore, now: float) -> list[dict]:
    """Every unexpired claim; an expired one, or one of a dead process on this host, is deleted with a warning."""
    found = []
    for key in sorted(store.listing(CLAIMS)):
        claim = _json(store.get(key))
        if claim is None:
            continue  # released between the listing and the read
        if breakable(claim, now):
            log.warning("broke the stale lock of %s on %s", describe(claim), store.uri)
            store.delete(key)
            continue
        found.append(claim)
    return found


def holder_line(holder: dict) -> str:
    gen = f", generation {holder['generation']}" if "generation" in holder else ""
    return f"{describe(holder)}{gen}"


@dataclass
class Lease:
    """A held lock: its claim renewed by a thread, its generation checked before every publication."""

    store: ObjectStore
    claim: dict
    generation: int
    exclusive_generation: int
    lease_s: float
    clock: Callable[[], float] = time.time
    lost: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def shared(self) -> bool:
        return bool(self.claim.get("shared"))

    @property
    def expires(self) -> float:
        return float(self.claim["expires"])

    def me(self) -> str:
        return holder_line(self.claim | {"generation": self.generation})

    def superseded_by(self, record: dict) -> str | None:
        """Who took the lock after this holder (None: nobody did)."""
        newer = int(record.get("exclusive_generation", 0)) > self.exclusive_generation
        if not self.shared:
            newer = newer or int(record.get("generation", 0)) != self.generation or record.get("token") != self.token
        return holder_line(record) if newer else None

    @property
    def token(self) -> str:
        return self.claim["token"]

    def _lose(self, why: str) -> str:
        self.lost = self.lost or f"{self.store.uri}: the lock of {self.me()} {why}; it publishes nothing"
        return self.lost

    def why_lost(self, margin_s: float) -> str | None:
        """Why this holder no longer holds the lock, a newer holder named first (None: it still holds it, with at
        least `margin_s` of its lease left)."""
        other = self.superseded_by(read_record(self.store))
        if other:
            return f"was superseded by {other}"
        if not self.store.exists(claim_key(self.token)):
            return "was broken by another writer (its lease had lapsed)"
        left = self.expires - self.clock()
        if left < margin_s:
            return f"has {max(left, 0.0):.1f} s of its {self.lease_s:g} s lease left (its renewal stalled)"
        return None

    def check(self) -> None:
        """Raise LockLost unless this holder still holds the lock, with a third of its lease left to publish in."""
        if self.lost:
            raise LockLost(self.lost)
        why = self.why_lost(self.lease_s * SAFE_FRACTION)
        if why:
            raise LockLost(self._lose(why))

    def renew(self) -> bool:
        """One renewal: a new `expires` on this holder's claim, unless it was superseded or has less than a quarter
        of its lease left. False: lost."""
        if self.lost:
            return False
        try:
            # never renewed once lapsed (another writer may hold it already), nor close to it: a PUT landing after
            # the lapse would bring back a claim another writer broke, and two would hold the lock
            why = self.why_lost(self.lease_s * RENEW_FRACTION)
            if why:
                self._lose(why)
                return False
            claim = self.claim | {"expires": self.clock() + self.lease_s}
            self.store.put(claim_key(self.token), _encode(claim))
            self.claim = claim
        except OSError as exc:  # the store unreachable: try again, until the lease runs out
            log.warning("could not renew the lock of %s on %s: %s", self.me(), self.store.uri, exc)
        return True

    def start(self) -> Lease:
        def run() -> None:
            while not self._stop.wait(self.lease_s / 3) and self.renew():
                pass

        self._thread = threading.Thread(target=run, name=f"lease-renewal-{self.token[:8]}", daemon=True)
        self._thread.start()
        return self

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.store.delete(claim_key(self.token))  # the record stays: it carries the generation on


def _encode(value: dict) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


def take_generation(store: ObjectStore, claim: dict, shared: bool) -> tuple[int, int]:
    """Write the next generation into the fence record (the caller holds the lock); returns (generation,
    exclusive generation). Shared holders racing here may take one number together: they are co-holders."""
    record = read_record(store)
    generation = int(record.get("generation", 0)) + 1
    exclusive = int(record.get("exclusive_generation", 0)) if shared else generation
    fence = {k: v for k, v in claim.items() if k != "expires"}
    store.put(LOCK_KEY, _encode(fence | {"generation": generation, "exclusive_generation": exclusive}))
    return generation, exclusive


def acquire_object(
    store: ObjectStore,
    command: str,
    timeout_s: float,
    lease_s: float = LEASE_S,
    shared: bool = False,
    clock: Callable[[], float] = time.time,
) -> Lease:
    """Take the lock (waiting up to `timeout_s`); returns the renewed Lease (`release()` lets go)."""
    if lease_s <= 0:
        raise ValueError(f"lock.lease_s must be positive, got {lease_s!r}")
    deadline = time.monotonic() + max(timeout_s, 0.0)
    claim = holder_record(command) | {"shared": shared}
    jitter = random.Random(claim["token"])  # seeded: a back-off that never depends on global state
    while True:
        blocking = [c for c in live_claims(store, clock()) if conflicts(c, shared)]
        if not blocking:
            claim = claim | {"expires": clock() + lease_s}
            store.put(claim_key(claim["token"]), _encode(claim))
            blocking = [
                c for c in live_claims(store, clock()) if c.get("token") != claim["token"] and conflicts(c, shared)
            ]
            if not blocking:
                generation, exclusive = take_generation(store, claim, shared)
                return Lease(store, claim, generation, exclusive, lease_s, clock).start()
            store.delete(claim_key(claim["token"]))  # a racer wrote too: both step back, at random
            time.sleep(jitter.uniform(0, POLL_S))
        if time.monotonic() >= deadline:
            raise LockHeld(
                f"{store.uri} is locked by {describe(blocking[0])}; waited {timeout_s:g} s (set lock.timeout_s, or "
                f"--lock-timeout, to wait longer; a holder that is gone is broken {lease_s:g} s after its last renewal)"
            )
        time.sleep(POLL_S)
