"""JUnit XML from the report dict: one test suite per policy, one test case per (trajectory,
invariant). A fail is a ``<failure>``, indeterminate is ``<error>`` (the check could not be
done: CI should notice, not count it as passed), not_applicable is ``<skipped>``."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any


def render(report: Mapping[str, Any]) -> str:
    suites: dict[str, ET.Element] = {}
    counts: dict[str, dict[str, int]] = {}
    root = ET.Element("testsuites", name="otel-plumb")
    for record in report.get("trajectories", ()):
        for v in record.get("verdicts", ()):
            policy = v.get("policy", "")
            suite = suites.get(policy)
            if suite is None:
                suite = suites[policy] = ET.SubElement(root, "testsuite", name=policy)
                counts[policy] = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
            c = counts[policy]
            c["tests"] += 1
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"{policy}.{v['invariant']}",
                name=f"{v['invariant']} [{_name(record)}]",
            )
            verdict = v["verdict"]
            if verdict == "fail":
                c["failures"] += 1
                el = ET.SubElement(case, "failure", message=v.get("message", ""), type=v.get("severity", ""))
                el.text = _detail(record, v)
            elif verdict == "indeterminate":
                c["errors"] += 1
                ET.SubElement(case, "error", message=v.get("message", ""), type="indeterminate")
            elif verdict == "not_applicable":
                c["skipped"] += 1
                ET.SubElement(case, "skipped", message=v.get("message", "") or "not applicable")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for policy, suite in suites.items():
        for k, n in counts[policy].items():
            suite.set(k, str(n))
            totals[k] += n
    for k, n in totals.items():
        if k != "skipped":
            root.set(k, str(n))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _name(record: Mapping[str, Any]) -> str:
    """The task key (an order or invoice id) with the trace it came from; the trace alone without one."""
    key, trace = record.get("key"), record.get("trace_id")
    return f"{key} trace {trace}" if key and key != trace else str(trace)


def _detail(record: Mapping[str, Any], v: Mapping[str, Any]) -> str:
    where = "whole trajectory" if v.get("step_index") is None else f"step {v['step_index']} (span {v.get('span_id')})"
    lines = [
        f"{_name(record)}, {where}, severity {v.get('severity')}",
        f"expected: {json.dumps(v.get('expected'), default=str, ensure_ascii=False)}",
        f"got: {json.dumps(v.get('got'), default=str, ensure_ascii=False)}",
        "steps: " + " > ".join(f"{s['index']}:{s['name']}{'(error)' if s.get('error') else ''}"
                               for s in record.get("steps", ()) if s.get("kind") == "tool"),
    ]  # fmt: skip
    return "\n".join(lines)

