import json
from pathlib import Path
from typing import Any

from test_files_support import agent_traces, by_trace, otlp_json

from otel_plumb.normalise import CAPTURE_HINTS
from otel_plumb.replay import replay
from otel_plumb.report.coverage import coverage_report


def spans_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]


def small_file(tmp_path: Path) -> Path:
    """Four traces: args captured (labelled), args missing, args redacted (with an extra span no
    convention explains), and one whose root span was lost."""
    captured = by_trace(agent_traces(1, case_ids=True, fail_tool="schedule_payment"))
    missing = by_trace(agent_traces(1, with_args=False))
    redacted_doc = otlp_json(agent_traces(1)[:])
    for span in spans_of(redacted_doc):
        for a in span["attributes"]:
            if a["key"] == "gen_ai.tool.call.arguments":
                a["value"] = {"stringValue": "<REDACTED>"}
    extra = dict(spans_of(redacted_doc)[0], spanId="00000000000000ff", name="SELECT invoices",
                 attributes=[{"key": "db.system", "value": {"stringValue": "postgresql"}}])
    redacted_doc["resourceSpans"][0]["scopeSpans"][0]["spans"].append(extra)
    rootless = [s for s in agent_traces(1) if s.parent is not None]
    lines = [
        json.dumps(otlp_json(captured[0])),
        json.dumps(otlp_json(missing[0])),
        json.dumps(redacted_doc),
        json.dumps(otlp_json(rootless)),
    ]
    path = tmp_path / "small.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_coverage_counts_and_notes(tmp_path: Path) -> None:
    result = replay([small_file(tmp_path)])
    assert result.errors == []
    cov = coverage_report(result.trajectories, result.stats)
    assert cov["trajectories"] == 4 and cov["spans"] == 4 + 4 + 5 + 3
    assert cov["conventions"] == {"otel_genai": 15, "unknown": 1}
    assert cov["steps_by_kind"] == {"tool": 8, "llm": 4, "agent": 3, "other": 1}
    tools = cov["tool_calls"]
    assert tools["total"] == 8
    assert tools["arguments"] == {"captured": 4, "absent": 2, "redacted": 2, "undecodable": 0}
    assert tools["results"]["captured"] == 0 and tools["errored"] == 1
    assert tools["by_tool"]["schedule_payment"] == {"calls": 4, "with_arguments": 2, "with_result": 0, "errors": 1}
    # the rootless trace lost its invoke_agent span: its calls are counted under the service
    assert tools["by_agent"] == {
        "ap": {"calls": 6, "arguments": {"captured": 2, "absent": 2, "redacted": 2, "undecodable": 0}},
        "ap-agent": {"calls": 2, "arguments": {"captured": 2, "absent": 0, "redacted": 0, "undecodable": 0}},
    }
    assert cov["not_understood"] == {"spans": 1, "names": {"SELECT invoices": 1}}
    assert cov["incomplete"] == {"trajectories": 1, "by_reason": {"no_root": 1}} and cov["without_root"] == 1
    assert cov["unlabelled"]["trajectories"] == 3

    notes = "\n".join(cov["notes"])
    assert "2 of 8 tool calls carry no arguments: argument checks will be indeterminate for them" in notes
    assert CAPTURE_HINTS["otel_genai"] in notes
    assert "2 of 8 tool calls have redacted arguments" in notes
    assert "8 of 8 tool calls carry no usable result" in notes
    assert "1 of 8 tool calls failed" in notes
    assert "1 of 16 spans follow no known convention (e.g. 'SELECT invoices')" in notes
    assert "1 of 4 trajectories are incomplete (no_root: 1)" in notes
    assert "3 of 4 trajectories carry no task label" in notes


def test_coverage_of_nothing_says_so() -> None:
    cov = coverage_report([])
    assert cov["trajectories"] == 0 and cov["notes"] == ["No spans were read: nothing can be checked."]


def test_task_attributes_label_trajectories(tmp_path: Path) -> None:
    result = replay([small_file(tmp_path)])
    assert coverage_report(result.trajectories, task_attributes=["service.name"])["unlabelled"]["trajectories"] == 0


def test_model_calls_without_tool_calls_are_flagged(tmp_path: Path) -> None:
    only_chat = [s for s in agent_traces(1) if not s.name.startswith("execute_tool")]
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(otlp_json(only_chat)))
    cov = coverage_report(replay([path]).trajectories)
    assert cov["model_calls_without_tool_calls"] == 1 and cov["tool_calls"]["total"] == 0
    [note] = [n for n in cov["notes"] if n.startswith("1 of 1 trajectories have model calls but no tool call")]
    assert CAPTURE_HINTS["otel_genai"] in note
