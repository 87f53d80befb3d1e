"""junit.xml: the gate's checks as JUnit test cases, so CI systems show a gate like a test run.

One <testsuite name="sourcegate-gate"> with one <testcase> per check: a failed check carries a
<failure> with its detail, a passed one its detail as system-out. Text that XML 1.0 cannot hold
(control characters from a corpus or an eval set) is replaced, never dropped with the file.
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


def junit_xml(gate: Mapping) -> str:
    """One <testcase> per check in one <testsuite name="sourcegate-gate">."""
    checks = gate["checks"]
    failures = sum(not c["passed"] for c in checks)
    suites = ET.Element("testsuites", tests=str(len(checks)), failures=str(failures))
    suite = ET.SubElement(
        suites,
        "testsuite",
        name="sourcegate-gate",
        tests=str(len(checks)),
        failures=str(failures),
        errors="0",
        skipped="0",
    )
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname="sourcegate.gate", name=_xml_text(c["name"]))
        if c["passed"]:
            ET.SubElement(case, "system-out").text = _xml_text(c["detail"])
        else:
            failure = ET.SubElement(case, "failure", message=_xml_text(c["detail"]), type="GateCheckFailed")
            failure.text = _xml_text(c["detail"])
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
