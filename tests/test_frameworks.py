"""Traces captured from real agent frameworks (tests/fixtures/frameworks/capture_*.py), read as
``otel-plumb replay`` reads them: the exact tool steps the tools executed, the agents, and the
verdicts and status the refund policy gives; where a trace cannot show something, the
trajectory says so and no check fails on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from otel_plumb.check import decide, load_policy
from otel_plumb.replay import replay

FIXTURES = Path(__file__).parent / "fixtures" / "frameworks"
POLICY = load_policy(FIXTURES / "refund-policy.yaml")
NAMES = sorted(p.name.removesuffix(".expected.json") for p in FIXTURES.glob("*.expected.json"))


def _expected(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.expected.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", NAMES)
def test_framework_fixture_reads_to_the_executed_tool_steps_and_verdicts(name: str) -> None:
    expected = _expected(name)
    result = replay([FIXTURES / f"{name}.jsonl"], group_by=expected["group_by"])
    assert result.stats.errors_total == 0, result.errors
    assert len(result.trajectories) == expected["trajectories"]
    t = result.trajectories[0]
    got = [{"name": s.name, "ok": s.error is None} for s in t.tool_steps]
    assert got == [{"name": s["name"], "ok": s["ok"]} for s in expected["tool_steps"]]
    for step, want in zip(t.tool_steps, expected["tool_steps"], strict=True):
        if expected["args_captured"]:
            assert step.args_status == "captured" and step.args == want["args"], (step.name, step.args)
        else:
            # Content off: no arguments, or the tool's own, never something else passed off as them.
            assert step.args_status != "captured" or step.args == want["args"], step.args
        if "agent" in want:
            assert step.agent == want["agent"], step
    if expected["agents"] is not None:
        # The agents in control, in order: a handoff to an agent followed by that agent's own
        # run is one stretch of it.
        agents = [s.name for s in t.steps if s.kind == "agent"]
        assert [a for i, a in enumerate(agents) if i == 0 or agents[i - 1] != a] == expected["agents"]
    if expected["incomplete_reason"] is not None:
        assert not t.complete and t.incomplete_reason == expected["incomplete_reason"]
    decided = decide([POLICY], t)
    assert {v.invariant: v.verdict for v in decided.verdicts} == expected["verdicts"]
    assert decided.status == expected["status"]


def test_every_fixture_has_its_expected_file() -> None:
    traces = {p.name.removesuffix(".jsonl") for p in FIXTURES.glob("*.jsonl")}
    assert traces == set(NAMES)


def test_coverage_names_the_framework_and_its_content_switch() -> None:
    from otel_plumb.report.coverage import coverage_report

    result = replay([FIXTURES / "smolagents_content_off.jsonl", FIXTURES / "langgraph_openllmetry_clean.jsonl"])
    cov = coverage_report(result.trajectories, result.stats)
    frameworks = cov["frameworks"]
    assert frameworks["smolagents (OpenInference)"]["tool_calls"] == 3
    assert frameworks["smolagents (OpenInference)"]["with_arguments"] == 0
    assert frameworks["LangChain / LangGraph (OpenLLMetry)"]["with_arguments"] == 3
    note = next(n for n in cov["notes"] if "redacted arguments" in n)
    assert "smolagents (OpenInference): TraceConfig(hide_inputs=False" in note
