"""junit.xml: the gate's checks as JUnit test cases, so CI systems show a gate like a test run.

One <testsuite name="sourcegate-gate"> with one <testcase> per check: a failed check carries a
<failure> with its detail, a passed one its detail as system-out. A night that stopped before its gate (a preflight
refusal, a node down) is one <testcase name="night"> with an <error>: a release gate reading junit.xml sees why,
not a missing file. Text that XML 1.0 cannot hold (control characters from a corpus or an eval set) is replaced,
never dropped with the file.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

# Characters XML 1.0 cannot carry even escaped (question text may hold them).
_XML_ILLEGAL = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text: Any) -> str:
    return _XML_ILLEGAL.sub("\ufffd", str(text))


def _suite(tests: int, failures: int, errors: int) -> tuple[ET.Element, ET.Element]:
    counts = {"tests": str(tests), "failures": str(failures)}
    suites = ET.Element("testsuites", **counts, **({"errors": str(errors)} if errors else {}))
    suite = ET.SubElement(suites, "testsuite", name="sourcegate-gate", **counts, errors=str(errors), skipped="0")
    return suites, suite


def _serialised(suites: ET.Element) -> str:
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def stopped_xml(step: str, kind: str, error: str) -> str:
    """A night that stopped in `step` with error `kind`: `error` (run.json's `stopped`), as one errored test case."""
    suites, suite = _suite(1, 0, 1)
    case = ET.SubElement(suite, "testcase", classname="sourcegate.gate", name="night")
    ET.SubElement(case, "error", message=_xml_text(f"stopped during {step}"), type=_xml_text(kind)).text = _xml_text(
        error
    )
    return _serialised(suites)


def junit_xml(gate: Mapping) -> str:
    """One <testcase> per check in one <testsuite name="sourcegate-gate">."""
    checks = gate["checks"]
    failures = sum(not c["passed"] for c in checks)
    suites, suite = _suite(len(checks), failures, 0)
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname="sourcegate.gate", name=_xml_text(c["name"]))
        if c["passed"]:
            ET.SubElement(case, "system-out").text = _xml_text(c["detail"])
        else:
            failure = ET.SubElement(case, "failure", message=_xml_text(c["detail"]), type="GateCheckFailed")
            failure.text = _xml_text(c["detail"])
    return _serialised(suites)
