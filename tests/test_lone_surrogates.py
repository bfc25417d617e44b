"""A JSON escape of half a surrogate pair (``"\\ud800"``) in trace data: read, checked and sent on
with the escape written out, never a refused request, an unexportable span or a lost record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_plumb.model.span import SpanRecord
from otel_plumb.model.text import may_hold_lone_surrogates, repair_lone_surrogates, valid_text
from otel_plumb.receive.files import read_spans
from otel_plumb.receive.http_server import decode

TRACE, SPAN = "0102030405060708090a0b0c0d0e0f10", "0102030405060708"

# Any code point, lone surrogates included (hypothesis leaves them out of text() by default).
any_text = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=8)
json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | any_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3),
    max_leaves=20,
)


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in strings(item)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *strings(v)]]
    return []


@settings(max_examples=300, deadline=None)
@given(json_like)
def test_repaired_values_hold_only_valid_text_and_keep_what_was_valid(value: Any) -> None:
    text = json.dumps(value)  # ensure_ascii: a lone surrogate is written as its escape
    parsed = json.loads(text)
    repaired = repair_lone_surrogates(json.loads(text))
    for s in strings(repaired):
        s.encode("utf-8")  # raises on a lone surrogate
    assert strings(repaired) == [valid_text(s) for s in strings(parsed)]
    if not may_hold_lone_surrogates(text):
        assert repaired == parsed


def test_a_lone_surrogate_is_written_as_its_escape_and_a_pair_is_kept() -> None:
    assert valid_text("a\ud800b") == "a\\ud800b"
    assert valid_text("\U0001f600") == "\U0001f600"
    nested: Any = json.loads('[{"k\\udfff": ["\\ud800", {"x": "\\ud83d\\ude00"}]}]')
    assert repair_lone_surrogates(nested) == [{"k\\udfff": ["\\ud800", {"x": "\U0001f600"}]}]
    deep: Any = json.loads("[" * 900 + '"\\ud800"' + "]" * 900)
    inner = repair_lone_surrogates(deep)
    for _ in range(900):
        inner = inner[0]
    assert inner == "\\ud800"


def otlp_json(name: str, value: str) -> dict[str, Any]:
    span = {"traceId": TRACE, "spanId": SPAN, "name": name, "startTimeUnixNano": "1", "endTimeUnixNano": "2",
            "attributes": [{"key": "gen_ai.tool.call.arguments", "value": {"stringValue": value}}]}  # fmt: skip
    return {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {}, "spans": [span]}]}]}


def test_an_otlp_json_request_with_a_lone_surrogate_is_accepted() -> None:
    body = json.dumps(otlp_json("execute_tool send\ud800", '{"to": "\\ud800@x.org"}')).encode()
    assert b"\\ud800" in body
    (span,) = decode(body, as_json=True).message.resource_spans[0].scope_spans[0].spans
    assert span.name == "execute_tool send\\ud800"
    # The escape inside the arguments' JSON text is the normaliser's to read: still text here.
    assert span.attributes[0].value.string_value == '{"to": "\\ud800@x.org"}'


def test_trace_files_with_a_lone_surrogate_are_read(tmp_path: Path) -> None:
    document = otlp_json("execute_tool send\ud800", "x\ud800")
    lines, pretty = tmp_path / "lines.jsonl", tmp_path / "pretty.json"
    lines.write_text(json.dumps(document) + "\n")
    pretty.write_text(json.dumps(document, indent=2))  # a document: streamed by ijson
    (record,) = list(read_spans(lines))
    assert isinstance(record, SpanRecord), record
    assert record.name == "execute_tool send\\ud800"
    assert record.attributes["gen_ai.tool.call.arguments"] == "x\\ud800"
    # The streaming parser's C backend writes it as "?" itself: valid text either way.
    (record,) = list(read_spans(pretty))
    assert isinstance(record, SpanRecord), record
    assert record.name in ("execute_tool send\\ud800", "execute_tool send?")
    record.name.encode("utf-8")
    str(record.attributes["gen_ai.tool.call.arguments"]).encode("utf-8")


def test_a_value_looked_up_inside_json_text_is_valid_text() -> None:
    from otel_plumb.check.values import MISSING, lookup

    assert lookup({"payload": '{"to": "\\ud800@x.org"}'}, ("payload", "to")) == "\\ud800@x.org"
    assert lookup({"payload": "[" * 100_000}, ("payload", 0)) is MISSING  # too deep to parse: not there


def test_arguments_with_a_lone_surrogate_are_checked_and_their_verdict_stored(tmp_path: Path) -> None:
    import orjson

    from otel_plumb.assemble import build_trajectory
    from otel_plumb.check import decide, load_policies
    from otel_plumb.normalise import normalise
    from otel_plumb.report.records import decided_record

    policy = tmp_path / "p.yaml"  # the mail must go to x.com
    policy.write_text(
        "policy: mail\ninvariants:\n  - {id: m, arg_matches: {tool: send_email, arg: to, regex: '@x\\.com$'}}\n"
    )
    root = SpanRecord(TRACE, "00" * 8, None, "invoke_agent", start_ns=0, end_ns=10,
                      attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"})  # fmt: skip
    tool = SpanRecord(TRACE, SPAN, "00" * 8, "execute_tool send_email", start_ns=1, end_ns=2, attributes={
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "send_email",
        "gen_ai.tool.call.arguments": '{"to": "\\ud800@x.org"}',
    })  # fmt: skip
    step = normalise(tool)
    assert step.args == {"to": "\\ud800@x.org"}
    decided = decide(load_policies([policy]), build_trajectory(TRACE, [normalise(root), step]))
    assert decided.status == "violating"
    (failure,) = decided.failures
    assert failure.got == "\\ud800@x.org"
    orjson.dumps(decided_record(decided))  # the console's store writes it so: no lone surrogate left
