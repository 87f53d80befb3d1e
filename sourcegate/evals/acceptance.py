"""Is the decision a night ships the accepted one? A decision ships only through `sourcegate accept` (which retires
the check set it saw); a config edit that changes the gating signal or threshold without it is shown, not hidden.

The last accepted decision is the baseline's `threshold` (the signal and threshold of the run `accept` adopted); the
night's is calibration.json's shipped one. They differ when the config was edited and nothing was accepted since:
the gate records it (gate.json `decision_accepted`) and the report says it under the verdict. It does not fail the
gate: the night's checks judge the decision on its merits; this says whether the check set it saw is still a check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sourcegate.evals.check_set import threshold_of


def _text(decision: Mapping[str, Any]) -> str:
    return f"{decision['signal']} >= {decision['adjacent']:g}"


def decision_acceptance(calibration: Mapping[str, Any], baseline: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Whether the shipped decision is the last accepted one, with both and a sentence (None: nothing ships)."""
    shipped = threshold_of(calibration)
    if shipped is None:
        return None
    accepted = (baseline or {}).get("threshold")
    record = {
        "decision": shipped,
        "accepted_decision": accepted,
        "accepted_from": (baseline or {}).get("accepted_from"),
    }
    if accepted == shipped:
        return record | {"accepted": True, "note": f"The decision {_text(shipped)} is the accepted one."}
    last = (
        f"the last accepted decision is {_text(accepted)} (from {record['accepted_from']})"
        if accepted
        else "no decision has been accepted"
    )
    note = (
        f"The decision this night ships ({_text(shipped)}) was not accepted: {last}. A decision ships through "
        "`sourcegate accept`, which retires the check set it saw; until then that check set is not a fresh check."
    )
    return record | {"accepted": False, "note": note}
