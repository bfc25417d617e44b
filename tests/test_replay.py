import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from test_files_support import agent_traces, by_trace, otlp_json, write_json_lines, write_records

from otel_plumb.cli.main import cli
from otel_plumb.replay import replay


def tool_path(t: Any) -> list[str]:
    return [s.name for s in t.tool_steps]


def test_replay_mixed_files_one_trace_split_across_formats(tmp_path: Path) -> None:
    sdk = agent_traces(3, fail_tool="schedule_payment")
    traces = by_trace(sdk)
    # Trace 0's first two spans in a JSON-lines file, the rest of it (with its root) in a protobuf file.
    a = write_json_lines(tmp_path / "a.jsonl", [traces[0][:2], traces[1]], extra_lines=["nonsense"])
    b = write_records(tmp_path / "b.pb", [traces[0][2:], traces[2]])
    result = replay([a, b])
    assert len(result.trajectories) == 3
    assert all(t.root_span_id for t in result.trajectories)
    # The unreadable line of a.jsonl may have held spans of any trace that file fed: traces 0 and 1
    # are incomplete (nothing says which trace the line held); trace 2, only in b.pb, is complete.
    fed_by_a = {f"{s.context.trace_id:032x}" for s in traces[0] + traces[1] if s.context is not None}
    assert {t.trace_id for t in result.trajectories if not t.complete} == fed_by_a
    for t in result.trajectories:
        if not t.complete:
            assert t.incomplete_reason == "unreadable_input"
            assert any(f"{a}:3" in p for p in t.problems)
    for t in result.trajectories:
        assert [s.kind for s in t.steps] == ["agent", "llm", "tool", "tool"]
        assert [s.index for s in t.steps] == [0, 1, 2, 3]
        assert tool_path(t) == ["fetch_invoice", "schedule_payment"]
        assert t.tool_steps[0].args == {"id": t.tool_steps[0].args["id"]} and t.tool_steps[0].error is None
        assert t.tool_steps[1].error == "503 upstream"
        assert t.service == "ap-agent"
    assert [(e.file, e.line) for e in result.errors] == [(str(a), 3)]
    assert [(f.spans, f.errors) for f in result.stats.files] == [(6, 1), (6, 0)]
    assert result.stats.spans == 12 and result.stats.late_spans == 0


def test_group_by_session_joins_traces(tmp_path: Path) -> None:
    sdk = agent_traces(3)
    doc = otlp_json(sdk)
    for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        if span["name"] == "invoke_agent ap":
            span["attributes"].append({"key": "gen_ai.conversation.id", "value": {"stringValue": "conv-1"}})
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    by_trace_result = replay([path])
    by_session = replay([path], group_by="session")
    assert len(by_trace_result.trajectories) == 3
    assert len(by_session.trajectories) == 1
    joined = by_session.trajectories[0]
    assert joined.key == "conv-1" and len(joined.trace_ids) == 3 and len(joined.tool_steps) == 6


def test_span_arriving_after_the_window_is_counted_late(tmp_path: Path) -> None:
    traces = by_trace(agent_traces(6))
    late_span = traces[0][0]  # a child of trace 0, written after five more traces
    batches = [[s] for s in traces[0][1:]] + [[s] for t in traces[1:] for s in t] + [[late_span]]
    path = write_json_lines(tmp_path / "late.jsonl", batches)
    result = replay([path], window_spans=8)
    assert result.stats.late_spans == 1
    first = next(t for t in result.trajectories if t.trace_id == f"{traces[0][0].context.trace_id:032x}")
    assert len(first.steps) == 3
    # with the default window the same file assembles completely
    assert replay([path]).stats.late_spans == 0


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_replay_command_writes_the_report(tmp_path: Path) -> None:
    sdk = agent_traces(2, fail_tool="fetch_invoice", case_ids=True)
    path = write_json_lines(tmp_path / "t.jsonl", by_trace(sdk), extra_lines=["{bad json"])
    out = tmp_path / "report.json"
    res = invoke("replay", str(path), "--json", str(out))
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["report_version"] == "1"
    assert len(report["trajectories"]) == 2
    t = report["trajectories"][0]
    assert {"trace_id", "key", "agent", "status", "complete", "steps", "verdicts"} <= set(t)
    # The bad line could have held spans of either trace: both incomplete, and unchecked (no policy).
    assert t["complete"] is False and t["incomplete_reason"] == "unreadable_input"
    assert t["status"] == "unchecked" and t["agent"] == "ap" and t["case_id"] in {"INV-0", "INV-1"}
    tools = [s for s in t["steps"] if s["kind"] == "tool"]
    assert [s["name"] for s in tools] == ["fetch_invoice", "schedule_payment"]
    assert tools[0]["error"] == "503 upstream" and tools[1]["error"] is None
    assert tools[0]["args"] == {"id": t["case_id"]} and tools[0]["source"] == "span"
    [error] = report["errors"]
    assert error["file"] == str(path) and error["line"] == 3 and error["offset"] is None
    assert error["message"].startswith("malformed JSON")
    assert report["coverage"]["tool_calls"]["total"] == 4 and report["coverage"]["tool_calls"]["errored"] == 2
    assert report["inputs"] == [{"file": str(path), "spans": 8, "errors": 1}]
    assert "conformance" in report and "by_invariant" in report
    # the terminal summary: counts, the error with its line, one line per trajectory with the tool path
    assert "read 1 file: 8 spans, 2 trajectories" in res.output
    assert f"{path}:3: malformed JSON" in res.output
    assert res.output.count("fetch_invoice! > schedule_payment") == 2


def test_replay_command_exit_2_when_nothing_can_be_read(tmp_path: Path) -> None:
    res = invoke("replay", str(tmp_path / "missing.jsonl"))
    assert res.exit_code == 2 and "missing.jsonl: no such file" in res.output
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("definitely not traces\n")
    res = invoke("replay", str(garbage))
    assert res.exit_code == 2 and "no spans could be read" in res.output and "garbage.txt" in res.output
    # a good file next to a missing one: still refused, naming the missing one
    good = write_json_lines(tmp_path / "good.jsonl", [agent_traces(1)])
    res = invoke("replay", str(good), str(tmp_path / "gone.pb"))
    assert res.exit_code == 2 and "gone.pb" in res.output


def test_replay_command_group_by_session_and_stdout_json(tmp_path: Path) -> None:
    sdk = agent_traces(2)
    path = write_records(tmp_path / "t.pb", by_trace(sdk))
    res = invoke("replay", str(path), "--group-by", "session", "--json", "-")
    assert res.exit_code == 0
    report = json.loads(res.output)
    assert len(report["trajectories"]) == 2  # no session key: one trajectory per trace


def test_coverage_command(tmp_path: Path) -> None:
    path = write_json_lines(tmp_path / "t.jsonl", by_trace(agent_traces(2, with_args=False)))
    out = tmp_path / "coverage.json"
    res = invoke("coverage", str(path), "--json", str(out))
    assert res.exit_code == 0, res.output
    assert "4 of 4 tool calls carry no arguments" in res.output
    assert "conventions: otel_genai 8" in res.output
    data = json.loads(out.read_text())
    assert data["coverage"]["tool_calls"]["arguments"]["absent"] == 4
    assert data["errors"] == [] and data["report_version"] == "1"
    assert invoke("coverage", str(tmp_path / "nope")).exit_code == 2


def test_spans_read_twice_become_one_step(tmp_path: Path) -> None:
    sdk = agent_traces(2)
    path = write_records(tmp_path / "t.pb", by_trace(sdk))
    once, twice = replay([path]), replay([path, path])
    assert twice.stats.duplicate_spans == 8 and once.stats.duplicate_spans == 0
    assert [tool_path(t) for t in twice.trajectories] == [tool_path(t) for t in once.trajectories]
    assert [len(t.steps) for t in twice.trajectories] == [4, 4]


def test_garbage_collector_state_restored_after_replay_and_when_closed_early(tmp_path: Path) -> None:
    import gc

    from otel_plumb.replay import ReplayStats, iter_trajectories

    path = write_records(tmp_path / "t.pb", by_trace(agent_traces(3)))
    assert gc.isenabled()
    replay([path])
    assert gc.isenabled()
    stream = iter_trajectories([path], ReplayStats(), window_spans=4)
    next(stream)
    assert not gc.isenabled()
    stream.close()
    assert gc.isenabled()


def test_session_spread_through_the_file_stays_one_trajectory(tmp_path: Path) -> None:
    traces = by_trace(agent_traces(8))
    lines = []
    for i, trace in enumerate(traces):
        doc = otlp_json(trace)
        if i in (0, 7):  # the first and last trace of the file are two turns of one conversation
            for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:
                span["attributes"].append({"key": "session.id", "value": {"stringValue": "s-1"}})
        lines.append(json.dumps(doc))
    path = tmp_path / "turns.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = replay([path], group_by="session", window_spans=4)
    sessions = [t for t in result.trajectories if t.session_id == "s-1"]
    assert len(sessions) == 1 and len(sessions[0].trace_ids) == 2
    assert len(result.trajectories) == 7 and result.stats.late_spans == 0


def test_entry_point_exit_codes(tmp_path: Path) -> None:
    import subprocess
    import sys

    good = write_records(tmp_path / "t.pb", by_trace(agent_traces(1)))
    ok = subprocess.run([sys.executable, "-m", "otel_plumb", "coverage", str(good)], capture_output=True, text=True)
    assert ok.returncode == 0 and "read 1 file: 4 spans, 1 trajectories" in ok.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "otel_plumb", "replay", str(good), str(tmp_path / "absent.json")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "absent.json: no such file" in missing.stderr
