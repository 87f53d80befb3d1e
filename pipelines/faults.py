"""Named crash points for the fault suite (tests/test_faults.py).

`SOURCEGATE_KILL_AT=<point>` makes the process SIGKILL itself when it reaches that point: a real,
uncatchable kill at a chosen place, so a test can crash a real `sourcegate run` inside any step.
Points: `before:<step>` / `after:<step>` around every locked step (pipelines/versions/lock.py), plus
`embed:encoded` (vectors computed, shard not yet written) and `load:partial` (half the index files
written). Unset (always, outside tests), `reached` is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "SOURCEGATE_KILL_AT"


def reached(point: str) -> None:
    if os.environ.get(ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
