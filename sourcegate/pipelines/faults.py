"""Named crash and pause points for the fault suite (tests/test_faults.py, tests/test_opensearch_nights.py).

`SOURCEGATE_KILL_AT=<point>` makes the process SIGKILL itself when it reaches that point: a real,
uncatchable kill at a chosen place, so a test can crash a real `sourcegate run` inside any step.
`SOURCEGATE_STOP_AT=<point>` makes it SIGSTOP itself there instead: the test sees the process stopped
(state T), breaks something (stops the OpenSearch node), then SIGCONTs it, so the fault lands at exactly
that place without polling the run's output. Points: `before:<step>` / `after:<step>` around every locked
step (sourcegate/pipelines/release/lock.py), plus `embed:encoded` (vectors computed, shard not yet written),
`load:partial` (half the index files written), `evaluate:searching` (the version opened, the models
loaded, no question asked yet), `promote:swapped` and `promote:logged`. Unset (always, outside tests),
`reached` is two dictionary lookups.
"""

from __future__ import annotations

import os
import signal

ENV = "SOURCEGATE_KILL_AT"
STOP_ENV = "SOURCEGATE_STOP_AT"


def reached(point: str) -> None:
    if os.environ.get(ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(STOP_ENV) == point:
        os.kill(os.getpid(), signal.SIGSTOP)  # resumes where it stopped on SIGCONT
