"""With content capture off, neither arguments nor results are data: both must read as absent,
so argument and dataflow checks are indeterminate rather than comparing against null."""

from pathlib import Path

from otel_plumb.replay import replay

FIXTURE = Path(__file__).parent / "fixtures" / "ap" / "no_argument_capture.jsonl"


def test_tool_steps_without_captured_content_have_no_args_and_no_results():
    (trajectory,) = replay([str(FIXTURE)]).trajectories
    tools = trajectory.tool_steps
    assert [s.name for s in tools][:2] == ["fetch_invoice", "match_purchase_order"]
    assert {s.args_status for s in tools} == {"absent"}
    assert {s.result_status for s in tools} == {"absent"}
    assert all(s.result is None for s in tools)
