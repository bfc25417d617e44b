"""The verdict log: a line of strict JSON per decided trajectory, whatever its steps' arguments hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from otel_plumb.export.verdict_log import VerdictLog
from otel_plumb.model import Decided, Step, Trajectory
from otel_plumb.report.records import STEP_KEYS, decided_record, step_record, step_row


def _strict(line: bytes) -> Any:
    """JSON as RFC 8259 has it: no NaN or Infinity tokens, UTF-8."""

    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    return json.loads(line.decode("utf-8"), parse_constant=refuse)


def _written(tmp_path: Path, *records: dict[str, Any]) -> list[bytes]:
    log = VerdictLog(tmp_path / "verdicts.jsonl")
    for record in records:
        log.write(record)
    log.close()
    lines = (tmp_path / "verdicts.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == len(records) + 1  # one line each, newline-ended
    return lines[:-1]


def test_a_decided_trajectory_is_one_line_that_reads_back_as_its_record(tmp_path: Path) -> None:
    step = Step(0, "tool", "pay", "01" * 8, None, "ab" * 16, 1, 2, "otel_genai",
                args={"invoice": "INV-7", "note": "café ✓"}, args_status="captured")  # fmt: skip
    trajectory = Trajectory(key="k", trace_ids=["ab" * 16], steps=[step], complete=True)
    record = decided_record(Decided(trajectory, [], ["p"], "conformant", "final"))
    (line,) = _written(tmp_path, record)
    assert _strict(line) == json.loads(json.dumps(record))
    assert "café ✓".encode() in line  # UTF-8, not escaped


def test_arguments_no_json_can_hold_as_they_are_still_give_a_line_of_json(tmp_path: Path) -> None:
    """A tool's arguments from trace data may hold what strict JSON (or orjson) has no place for:
    each is written as the store writes it, and the line stays JSON, never refused."""
    deep: Any = "bottom"
    for _ in range(300):
        deep = [deep]
    odd = {"nan": float("nan"), "inf": float("-inf"), "big": 10**30, "lone": "a\ud800b", 7: "int key", "deep": deep}
    plain, written = _written(tmp_path, {"steps": [{"args": {"n": 1}}]}, {"steps": [{"args": odd}]})
    assert _strict(plain) == {"steps": [{"args": {"n": 1}}]}
    args = _strict(written)["steps"][0]["args"]
    assert (args["nan"], args["inf"], args["big"], args["7"]) == (None, None, str(10**30), "int key")
    assert args["lone"] == "a\\ud800b"  # the lone surrogate as its escape text
    depth, node = 0, args["deep"]
    while isinstance(node, list):
        depth, node = depth + 1, node[0]
    assert depth < 300 and isinstance(node, str)  # the deepest levels as their JSON text: nothing lost
    node = json.loads(node)
    while isinstance(node, list):
        depth, node = depth + 1, node[0]
    assert (depth, node) == (300, "bottom")


@pytest.mark.parametrize("status", ["captured", "redacted", "absent", "undecodable"])
def test_a_step_keeps_its_arguments_and_result_only_when_captured(status: str) -> None:
    """What a redaction or a failed decode left on a step never reaches a record, in either form."""
    step = Step(3, "tool", "pay", "01" * 8, "02" * 8, "ab" * 16, 1, 2, "otel_genai", args={"amount": 12},
                args_status=status, result="paid", result_status=status)  # fmt: skip
    record = step_record(step)
    expected = ({"amount": 12}, "paid") if status == "captured" else (None, None)
    assert (record["args"], record["result"]) == expected
    assert (record["index"], record["args_status"], record["start_time_unix_nano"]) == (3, status, 1)
    assert step_row(step) == tuple(record[key] for key in STEP_KEYS)
