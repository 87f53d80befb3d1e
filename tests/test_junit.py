"""sourcegate.evals.junit: the gate's checks as JUnit XML (the serialiser alone; test_gate checks it on real verdicts)."""

import xml.etree.ElementTree as ET

from sourcegate.evals.junit import junit_xml

CHECKS = [
    {"name": "threshold_gap", "passed": True, "detail": "gap 0.25 between the labels"},
    {"name": "eval_sets_valid", "passed": False, "detail": 'bad <row> & "quote" \x01\x0b in file'},
    {"name": "precision_regression", "passed": False, "detail": "3 losses, 0 wins"},
]


def test_one_testcase_per_check_and_a_failure_per_failed_check():
    text = junit_xml({"checks": CHECKS, "passed": False})
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites') and text.endswith("</testsuites>\n")
    root = ET.fromstring(text.encode())
    assert (root.get("tests"), root.get("failures")) == ("3", "2")
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "sourcegate-gate" and (suite.get("errors"), suite.get("skipped")) == ("0", "0")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [c["name"] for c in CHECKS]
    assert {c.get("classname") for c in cases} == {"sourcegate.gate"}
    assert cases[0].find("failure") is None and cases[0].find("system-out").text == CHECKS[0]["detail"]
    failure = cases[2].find("failure")
    assert failure.get("type") == "GateCheckFailed" and failure.get("message") == failure.text == "3 losses, 0 wins"


def test_text_xml_cannot_hold_is_replaced_not_fatal():
    root = ET.fromstring(junit_xml({"checks": CHECKS}).encode())
    message = root.find(".//testcase[@name='eval_sets_valid']/failure").get("message")
    assert message == 'bad <row> & "quote" \ufffd\ufffd in file'


def test_no_checks_is_an_empty_suite():
    root = ET.fromstring(junit_xml({"checks": []}).encode())
    assert root.find("testsuite").get("tests") == "0" and root.find(".//testcase") is None
