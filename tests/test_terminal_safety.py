"""Text from traces cannot drive a terminal or forge lines, and a policy cannot read files
outside its folder by accident."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToJson
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_plumb.check import PolicyError, load_policy
from otel_plumb.processor.logs import TextFormatter
from otel_plumb.terminal import safe

HOSTILE = "refund\x1b]0;pwned\x07\x1b[2J\u202eevil\x9b31m\nFAIL critical forged"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),
        ("bell\x07", "bell\\x07"),
        ("csi\x9b31m", "csi\\x9b31m"),
        ("rtl\u202eoverride", "rtl\\u202eoverride"),
        ("two\nlines\r", "two\\nlines\\r"),
        ("café 日本 ✓", "café 日本 ✓"),
    ],
)
def test_controls_and_reordering_characters_are_escaped(raw: str, shown: str) -> None:
    assert safe(raw) == shown


def test_a_log_line_keeps_traffic_text_on_one_inert_line() -> None:
    record = logging.LogRecord("otel_plumb.processor", logging.INFO, __file__, 1, "verdict: %s", (HOSTILE,), None)
    line = TextFormatter("%(levelname)s %(message)s").format(record)
    assert "\n" not in line and "\x1b" not in line and "\u202e" not in line and "\x9b" not in line
    assert line.startswith("INFO verdict: refund\\x1b]0;pwned")


def test_replay_prints_hostile_names_and_messages_escaped(tmp_path: Path) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("agent")
    with tracer.start_as_current_span("invoke_agent a") as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        root.set_attribute("invoice.id", HOSTILE)
        with tracer.start_as_current_span("execute_tool pay") as span:
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", "pay")
            span.set_attribute("gen_ai.tool.call.arguments", json.dumps({"memo": HOSTILE}))
    traces = tmp_path / "t.json"
    traces.write_text(MessageToJson(encode_spans(memory.get_finished_spans()), indent=None))
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "policy: p\ntask: {attribute: invoice.id}\ninvariants:\n"
        "  - {id: plain-memo, severity: critical, arg_matches: {tool: pay, arg: memo, regex: '^[a-z]*$'}}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "otel_plumb", "replay", str(traces), "--policy", str(policy)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    out = done.stdout + done.stderr
    assert "plain-memo" in out
    for c in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert c not in out
    assert not any(line.startswith("FAIL critical forged") for line in out.splitlines())
    assert "refund\\x1b]0;pwned" in out


def _policy_with_context(folder: Path, context_file: str, allow: bool = False) -> Path:
    path = folder / "p.yaml"
    allow_line = "  allow_outside_policy_dir: true\n" if allow else ""
    path.write_text(
        "policy: p\ntask: {attribute: invoice.id}\ncontext:\n"
        f"  file: {context_file}\n{allow_line}invariants:\n  - {{id: i, must_call: t}}\n"
    )
    return path


def test_a_context_file_outside_the_policy_folder_needs_an_explicit_allow(tmp_path: Path) -> None:
    policies, elsewhere = tmp_path / "policies", tmp_path / "elsewhere"
    policies.mkdir()
    elsewhere.mkdir()
    (elsewhere / "truth.yaml").write_text("INV-1: {amount: 5}\n")
    (policies / "truth.yaml").write_text("INV-1: {amount: 6}\n")
    assert load_policy(_policy_with_context(policies, "truth.yaml")).name == "p"
    for escape in ("../elsewhere/truth.yaml", str(elsewhere / "truth.yaml"), "/proc/self/environ"):
        with pytest.raises(PolicyError) as exc:
            load_policy(_policy_with_context(policies, escape))
        assert exc.value.line == 4 and "outside the policy's folder" in exc.value.message
    # A symlink beside the policy that points out of its folder is outside too.
    os.symlink(elsewhere / "truth.yaml", policies / "link.yaml")
    with pytest.raises(PolicyError, match="outside the policy's folder"):
        load_policy(_policy_with_context(policies, "link.yaml"))
    assert load_policy(_policy_with_context(policies, "../elsewhere/truth.yaml", allow=True)).name == "p"
