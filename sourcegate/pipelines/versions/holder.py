"""Who holds a writer lock, whichever kind (a folder, an OpenSearch alias, an object-store prefix): the
record a holder writes, how an error names it, and when a record is stale (its process on this host is gone)."""

from __future__ import annotations

import os
import socket
import uuid
from datetime import UTC, datetime

POLL_S = 0.2  # how often a waiting writer looks again


class LockHeld(RuntimeError):
    """Another writer holds the lock and did not let go within the timeout."""


class LockLost(RuntimeError):
    """This writer's lease lapsed or a newer holder fenced it out: it must publish nothing."""


def holder_record(command: str) -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "since": datetime.now(UTC).isoformat(timespec="seconds"),
        "token": uuid.uuid4().hex,
    }


def describe(holder: dict | None) -> str:
    if not holder:
        return "another process (no holder record: a shared holder such as an embed shard, or one just starting)"
    return f"pid {holder.get('pid')} on {holder.get('host')} ({holder.get('command')}, since {holder.get('since')})"


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def is_stale(holder: dict | None) -> bool:
    """A holder record of a process on this host that no longer runs."""
    return bool(holder) and holder.get("host") == socket.gethostname() and not process_alive(int(holder["pid"]))
