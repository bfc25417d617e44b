import gzip
import json
import struct
from pathlib import Path
from typing import Any

import zstandard
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from test_files_support import (
    agent_traces,
    by_trace,
    otlp_json,
    records,
    request,
    write_json_lines,
    write_records,
)

from otel_plumb.model import SpanRecord
from otel_plumb.model.span import STATUS_ERROR
from otel_plumb.receive.files import ReadError, read_files, read_spans
from otel_plumb.receive.otlp_json import _base64_ids_to_hex


def split(items: list[Any]) -> tuple[list[SpanRecord], list[ReadError]]:
    spans = [i for i in items if isinstance(i, SpanRecord)]
    errors = [i for i in items if isinstance(i, ReadError)]
    assert len(spans) + len(errors) == len(items)
    return spans, errors


def ids(spans: list[SpanRecord]) -> set[tuple[str, str]]:
    return {(s.trace_id, s.span_id) for s in spans}


def expected_ids(sdk_spans: list[Any]) -> set[tuple[str, str]]:
    return {(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in sdk_spans}


def test_otlp_json_document_pretty_printed(tmp_path: Path) -> None:
    sdk = agent_traces(2, fail_tool="schedule_payment")
    path = tmp_path / "export.json"
    path.write_text(json.dumps(otlp_json(sdk), indent=2))
    spans, errors = split(list(read_spans(path)))
    assert errors == []
    assert ids(spans) == expected_ids(sdk)
    tool = next(s for s in spans if s.name == "execute_tool schedule_payment")
    assert tool.attributes["gen_ai.tool.name"] == "schedule_payment"
    assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"amount_gbp": 0}
    assert tool.status_code == STATUS_ERROR and tool.status_message == "503 upstream"
    assert tool.resource["service.name"] == "ap-agent" and tool.scope_name == "ap.agent"
    roots = [s for s in spans if s.parent_span_id is None]
    assert len(roots) == 2 and all(r.name == "invoke_agent ap" for r in roots)


def test_json_lines_trace_split_over_lines_and_a_malformed_line(tmp_path: Path) -> None:
    sdk = agent_traces(2)
    one_span_per_line = [[s] for s in sdk]
    path = write_json_lines(tmp_path / "traces.jsonl", one_span_per_line[:3])
    with path.open("a") as f:
        f.write('{"resourceSpans": [ oops\n')
        f.write("\n")
        for batch in one_span_per_line[3:]:
            f.write(json.dumps(otlp_json(batch)) + "\n")
    spans, errors = split(list(read_spans(path)))
    assert ids(spans) == expected_ids(sdk)
    assert len(errors) == 1
    assert errors[0].line == 4 and errors[0].file == str(path) and "malformed JSON" in errors[0].message
    assert str(errors[0]).startswith(f"{path}:4: ")


def test_json_lines_first_line_malformed(tmp_path: Path) -> None:
    traces = by_trace(agent_traces(2))
    path = tmp_path / "t.jsonl"
    lines = ["", "{broken", "", json.dumps(otlp_json(traces[0])), "{broken too", json.dumps(otlp_json(traces[1]))]
    path.write_text("\n".join(lines) + "\n")
    spans, errors = split(list(read_spans(path)))
    assert ids(spans) == expected_ids(traces[0] + traces[1])
    assert [(e.line, "malformed JSON" in e.message) for e in errors] == [(2, True), (5, True)]


def test_byte_order_mark_before_json(tmp_path: Path) -> None:
    sdk = agent_traces(1)
    path = tmp_path / "bom.json"
    for text in (json.dumps(otlp_json(sdk)), json.dumps(otlp_json(sdk), indent=2)):
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        spans, errors = split(list(read_spans(path)))
        assert errors == [] and ids(spans) == expected_ids(sdk)


def test_several_traces_per_line(tmp_path: Path) -> None:
    sdk = agent_traces(3)
    path = write_json_lines(tmp_path / "t.jsonl", [sdk[:10], sdk[10:]])
    spans, errors = split(list(read_spans(path)))
    assert errors == [] and ids(spans) == expected_ids(sdk)
    assert len({s.trace_id for s in spans}) == 3


def test_line_that_is_json_but_not_a_trace_request_is_reported(tmp_path: Path) -> None:
    sdk = agent_traces(1)
    path = write_json_lines(tmp_path / "t.jsonl", [sdk], extra_lines=['{"hello": 1}', '{"resourceLogs": []}', "[1]"])
    spans, errors = split(list(read_spans(path)))
    assert ids(spans) == expected_ids(sdk)
    assert [e.line for e in errors] == [2, 4]  # other signals (line 3) are skipped quietly


def test_bad_span_is_reported_with_its_line_and_the_rest_of_the_line_kept(tmp_path: Path) -> None:
    doc = otlp_json(agent_traces(1)[:2])
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = "zz"
    path = write_json_lines(tmp_path / "t.jsonl", [agent_traces(1)], extra_lines=[json.dumps(doc)])
    spans, errors = split(list(read_spans(path)))
    assert len(spans) == 4 + 1 and len(errors) == 1
    assert errors[0].line == 2 and "spanId is not 16 hex digits: 'zz'" in errors[0].message


def test_length_prefixed_protobuf_with_a_corrupt_record(tmp_path: Path) -> None:
    sdk = agent_traces(2)
    traces = by_trace(sdk)
    good = [request(t).SerializeToString() for t in traces]
    corrupt = b"\xff" * 12  # an invalid tag: not a protobuf message
    path = tmp_path / "traces.pb"
    path.write_bytes(records([good[0], corrupt, good[1]]))
    spans, errors = split(list(read_spans(path)))
    assert ids(spans) == expected_ids(sdk)
    assert len(errors) == 1 and errors[0].offset == 4 + len(good[0]) and errors[0].line is None
    assert "not an OTLP protobuf record" in errors[0].message


def test_truncated_last_record(tmp_path: Path) -> None:
    sdk = agent_traces(2)
    traces = by_trace(sdk)
    data = records([request(t).SerializeToString() for t in traces])
    path = tmp_path / "traces.pb"
    path.write_bytes(data[:-7])
    spans, errors = split(list(read_spans(path)))
    assert ids(spans) == expected_ids(traces[0])
    assert len(errors) == 1 and "truncated record" in errors[0].message
    assert errors[0].offset == 4 + len(request(traces[0]).SerializeToString())


def test_zstd_compressed_records_protobuf_and_json(tmp_path: Path) -> None:
    sdk = agent_traces(2)
    path = write_records(tmp_path / "traces.proto", by_trace(sdk), zstd=True)
    spans, errors = split(list(read_spans(path)))
    assert errors == [] and ids(spans) == expected_ids(sdk)
    # format: json + compression: zstd writes length-prefixed compressed JSON
    payloads = [zstandard.ZstdCompressor().compress(json.dumps(otlp_json(t)).encode()) for t in by_trace(sdk)]
    path2 = tmp_path / "traces.json"
    path2.write_bytes(records(payloads))
    spans2, errors2 = split(list(read_spans(path2)))
    assert errors2 == [] and ids(spans2) == expected_ids(sdk)


def test_bare_serialized_request(tmp_path: Path) -> None:
    sdk = agent_traces(2)
    path = tmp_path / "request.bin"
    path.write_bytes(request(sdk).SerializeToString())
    spans, errors = split(list(read_spans(path)))
    assert errors == [] and ids(spans) == expected_ids(sdk)


def test_gzip_and_zstd_files_detected_by_content(tmp_path: Path) -> None:
    sdk = agent_traces(2)
    plain = write_json_lines(tmp_path / "plain.jsonl", by_trace(sdk)).read_bytes()
    pb = write_records(tmp_path / "plain.pb", by_trace(sdk)).read_bytes()
    (tmp_path / "a").write_bytes(gzip.compress(plain))  # no telling extension on purpose
    (tmp_path / "b").write_bytes(zstandard.ZstdCompressor().compress(pb))
    (tmp_path / "c").write_bytes(gzip.compress(pb))
    for name in ("a", "b", "c"):
        spans, errors = split(list(read_spans(tmp_path / name)))
        assert errors == [] and ids(spans) == expected_ids(sdk), name


def test_cut_gzip_file_reads_what_it_can(tmp_path: Path) -> None:
    sdk = agent_traces(20)
    data = gzip.compress(write_json_lines(tmp_path / "x.jsonl", [[s] for s in sdk]).read_bytes())
    path = tmp_path / "cut.gz"
    path.write_bytes(data[: len(data) * 3 // 4])
    spans, errors = split(list(read_spans(path)))
    assert 0 < len(spans) < len(sdk)
    assert len(errors) == 1 and "unreadable past this point" in errors[0].message


def jaeger_trace() -> dict[str, Any]:
    """As Jaeger's UI 'Download JSON' writes it (a 64-bit trace id, tags with types)."""
    return {
        "traceID": "5b8efff798038103",
        "spans": [
            {
                "traceID": "5b8efff798038103",
                "spanID": "a1",
                "operationName": "invoke_agent ap",
                "references": [],
                "startTime": 1700000000000000,
                "duration": 5000,
                "tags": [
                    {"key": "gen_ai.operation.name", "type": "string", "value": "invoke_agent"},
                    {"key": "span.kind", "type": "string", "value": "server"},
                    {"key": "otel.scope.name", "type": "string", "value": "ap.agent"},
                ],
                "logs": [],
                "processID": "p1",
            },
            {
                "traceID": "5b8efff798038103",
                "spanID": "00000000000000b2",
                "operationName": "execute_tool fetch_invoice",
                "references": [{"refType": "CHILD_OF", "traceID": "5b8efff798038103", "spanID": "a1"}],
                "startTime": 1700000000001000,
                "duration": 1000,
                "tags": [
                    {"key": "gen_ai.operation.name", "type": "string", "value": "execute_tool"},
                    {"key": "gen_ai.tool.name", "type": "string", "value": "fetch_invoice"},
                    {"key": "gen_ai.tool.call.arguments", "type": "string", "value": '{"id": "INV-1"}'},
                    {"key": "retries", "type": "int64", "value": 2},
                    {"key": "score", "type": "float64", "value": 0.5},
                    {"key": "cached", "type": "bool", "value": False},
                    {"key": "blob", "type": "binary", "value": "AAE="},
                    {"key": "error", "type": "bool", "value": True},
                    {"key": "otel.status_description", "type": "string", "value": "503 upstream"},
                ],
                "logs": [
                    {
                        "timestamp": 1700000000001500,
                        "fields": [
                            {"key": "event", "type": "string", "value": "gen_ai.tool.message"},
                            {"key": "content", "type": "string", "value": "hi"},
                        ],
                    }
                ],
                "processID": "p1",
            },
            {
                "traceID": "5b8efff798038103",
                "spanID": "c3",
                "operationName": "follow-up",
                "references": [{"refType": "FOLLOWS_FROM", "traceID": "5b8efff798038103", "spanID": "b2"}],
                "startTime": 1700000000003000,
                "duration": 10,
                "tags": [],
                "processID": "p2",
            },
        ],
        "processes": {
            "p1": {"serviceName": "ap-agent", "tags": [{"key": "host.name", "type": "string", "value": "h1"}]},
            "p2": {"serviceName": "ledger", "tags": []},
        },
        "warnings": None,
    }


def check_jaeger_spans(spans: list[SpanRecord]) -> None:
    by_name = {s.name: s for s in spans}
    root, tool, follow = by_name["invoke_agent ap"], by_name["execute_tool fetch_invoice"], by_name["follow-up"]
    assert root.trace_id == "00000000000000005b8efff798038103" and root.span_id == "00000000000000a1"
    assert root.parent_span_id is None and root.kind == 2 and root.scope_name == "ap.agent"
    assert "span.kind" not in root.attributes and "otel.scope.name" not in root.attributes
    assert tool.parent_span_id == root.span_id
    assert tool.start_ns == 1700000000001000000 and tool.end_ns == 1700000000002000000
    assert tool.status_code == STATUS_ERROR and tool.status_message == "503 upstream"
    assert tool.attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "fetch_invoice",
        "gen_ai.tool.call.arguments": '{"id": "INV-1"}',
        "retries": 2,
        "score": 0.5,
        "cached": False,
        "blob": b"\x00\x01",
    }
    assert [(e.name, e.time_ns, e.attributes) for e in tool.events] == [
        ("gen_ai.tool.message", 1700000000001500000, {"content": "hi"})
    ]
    assert tool.resource == {"service.name": "ap-agent", "host.name": "h1"}
    assert follow.parent_span_id == tool.span_id and follow.resource["service.name"] == "ledger"


def test_jaeger_json_api_response_compact_and_pretty(tmp_path: Path) -> None:
    response = {"data": [jaeger_trace()], "total": 0, "limit": 0, "offset": 0, "errors": None}
    compact = tmp_path / "jaeger.json"
    compact.write_text(json.dumps(response))
    pretty = tmp_path / "jaeger-pretty.json"
    pretty.write_text(json.dumps(response, indent=2))
    for path in (compact, pretty):
        spans, errors = split(list(read_spans(path)))
        assert errors == [], path
        check_jaeger_spans(spans)


def test_jaeger_bad_span_is_reported_and_others_kept(tmp_path: Path) -> None:
    trace = jaeger_trace()
    trace["spans"][2]["spanID"] = "not-hex"
    path = tmp_path / "jaeger.json"
    path.write_text(json.dumps({"data": [trace]}))
    spans, errors = split(list(read_spans(path)))
    assert len(spans) == 2 and len(errors) == 1 and "spanID" in errors[0].message and errors[0].line == 1


def test_jaeger_out_of_range_values_and_bad_process_are_reported(tmp_path: Path) -> None:
    trace = jaeger_trace()
    trace["spans"][2]["startTime"] = 1e400  # read back as infinity
    trace["processes"]["p2"] = {"serviceName": "ledger", "tags": [7]}
    path = tmp_path / "jaeger.json"
    path.write_text(json.dumps({"data": [trace]}))
    spans, errors = split(list(read_spans(path)))
    assert sorted(s.name for s in spans) == ["execute_tool fetch_invoice", "invoke_agent ap"]
    messages = sorted(e.message for e in errors)
    assert len(messages) == 2 and messages[0].startswith("Jaeger process 'p2'")
    assert messages[1].startswith("Jaeger span #2")


def snake_case(node: Any) -> Any:
    if isinstance(node, dict):
        return {_snake(k): snake_case(v) for k, v in node.items()}
    if isinstance(node, list):
        return [snake_case(x) for x in node]
    return node


def _snake(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


def comparable(spans: list[SpanRecord]) -> list[tuple[Any, ...]]:
    return sorted(
        (s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind, s.start_ns, s.end_ns, s.status_code,
         sorted(s.attributes.items()), dict(s.resource))
        for s in spans
    )


def test_camel_and_snake_case_enum_names_and_numbers_int64_string_and_number(tmp_path: Path) -> None:
    sdk = agent_traces(1, fail_tool="fetch_invoice")
    req = request(sdk)
    req.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="count").value.int_value = 2**40
    camel_names_strings = _base64_ids_to_hex(json_format.MessageToDict(req))
    snake_numbers = _base64_ids_to_hex(
        json_format.MessageToDict(req, preserving_proto_field_name=True, use_integers_for_enums=True)
    )
    assert "resource_spans" in snake_numbers
    # int64 as JSON numbers rather than strings
    span0 = snake_numbers["resource_spans"][0]["scope_spans"][0]["spans"][0]
    span0["start_time_unix_nano"] = int(span0["start_time_unix_nano"])
    next(a for a in span0["attributes"] if a["key"] == "count")["value"]["int_value"] = 2**40
    assert isinstance(camel_names_strings["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["kind"], str)
    results = []
    for i, doc in enumerate((camel_names_strings, snake_numbers, snake_case(camel_names_strings))):
        path = tmp_path / f"{i}.json"
        path.write_text(json.dumps(doc))
        spans, errors = split(list(read_spans(path)))
        assert errors == [] and len(spans) == 4
        results.append(comparable(spans))
    assert results[0] == results[1] == results[2]
    assert any(("count", 2**40) in r[8] for r in results[0])
    assert {r[4] for r in results[0]} == {1}  # SPAN_KIND_INTERNAL by name and by number
    assert 2 in {r[7] for r in results[0]}  # STATUS_CODE_ERROR


def test_tempo_batches_with_base64_ids(tmp_path: Path) -> None:
    """Grafana Tempo's trace JSON: ``batches`` for resourceSpans and proto3 JSON's base64 ids."""
    sdk = agent_traces(2)
    proto3 = json_format.MessageToDict(request(sdk))  # ids stay base64
    assert len(proto3["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"]) == 24
    tempo = {"batches": proto3["resourceSpans"]}
    for doc, indent in ((tempo, None), (tempo, 2), ({"trace": proto3}, None), ({"trace": tempo}, 2)):
        path = tmp_path / "tempo.json"
        path.write_text(json.dumps(doc, indent=indent))
        spans, errors = split(list(read_spans(path)))
        assert errors == [] and ids(spans) == expected_ids(sdk), (list(doc), indent)
        assert sum(1 for s in spans if s.parent_span_id is None) == 2


def test_missing_file_and_directory_are_errors(tmp_path: Path) -> None:
    items = list(read_files([tmp_path / "nope.json", tmp_path]))
    assert [type(i) for i in items] == [ReadError, ReadError]
    assert items[0].file.endswith("nope.json") and "cannot open" in items[0].message


def test_text_file_is_not_a_trace_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello, these are not traces\n")
    spans, errors = split(list(read_spans(path)))
    assert spans == [] and len(errors) == 1 and "not a trace file" in errors[0].message


def test_empty_file_reads_nothing(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert list(read_spans(path)) == []


# --- robustness: a reader never raises, whatever the bytes --------------------------------------

_FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)

otlp_keys = st.sampled_from(
    ["resourceSpans", "resource_spans", "scopeSpans", "spans", "traceId", "spanId", "parentSpanId", "attributes",
     "key", "value", "stringValue", "intValue", "kind", "status", "code", "data", "traceID", "spanID", "references",
     "tags", "logs", "processes", "startTime", "duration", "result", "events"]
)
otlp_shaped = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.sampled_from(["0af7651916cd43dd", "a1"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(otlp_keys, children, max_size=5),
    max_leaves=30,
)


jaeger_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6) | st.sampled_from(
    ["a1", "5b8efff798038103", "CHILD_OF", "FOLLOWS_FROM", "int64", "float64", "bool", "binary", "AAE=", "p1"]
)
jaeger_tag = st.fixed_dictionaries(
    {"key": jaeger_scalars, "type": jaeger_scalars, "value": jaeger_scalars | st.sampled_from(["inf", "1e400"])}
)
jaeger_span = st.fixed_dictionaries(
    {},
    optional={
        "traceID": jaeger_scalars,
        "spanID": jaeger_scalars,
        "operationName": jaeger_scalars,
        "references": st.lists(st.fixed_dictionaries({"refType": jaeger_scalars, "spanID": jaeger_scalars}))
        | jaeger_scalars,
        "startTime": jaeger_scalars,
        "duration": jaeger_scalars,
        "tags": st.lists(jaeger_tag, max_size=3) | jaeger_scalars,
        "logs": st.lists(st.fixed_dictionaries({"timestamp": jaeger_scalars, "fields": st.lists(jaeger_tag)})),
        "processID": jaeger_scalars,
    },
)
jaeger_docs = st.fixed_dictionaries(
    {
        "data": st.lists(
            st.fixed_dictionaries(
                {
                    "traceID": jaeger_scalars,
                    "spans": st.lists(jaeger_span, max_size=3),
                    "processes": st.dictionaries(
                        st.text(max_size=3),
                        st.fixed_dictionaries({"serviceName": jaeger_scalars, "tags": st.lists(jaeger_tag)})
                        | jaeger_scalars,
                        max_size=2,
                    )
                    | jaeger_scalars,
                }
            ),
            max_size=2,
        )
    }
)


def assert_reads_without_raising(path: Path) -> None:
    for item in read_spans(path):
        assert isinstance(item, SpanRecord | ReadError)


@_FUZZ
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes_never_crash(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.bin"
    for blob in (data, struct.pack(">I", len(data)) + data, gzip.compress(data), b"\x28\xb5\x2f\xfd" + data):
        path.write_bytes(blob)
        assert_reads_without_raising(path)


@_FUZZ
@given(values=st.lists(json_values | otlp_shaped | jaeger_docs, min_size=1, max_size=4))
def test_arbitrary_json_never_crashes(tmp_path: Path, values: list[Any]) -> None:
    path = tmp_path / "fuzz.json"
    path.write_text("\n".join(json.dumps(v) for v in values))
    assert_reads_without_raising(path)
    path.write_text(json.dumps(values, indent=1))
    assert_reads_without_raising(path)
    path.write_bytes(records([json.dumps(v).encode() for v in values]))
    assert_reads_without_raising(path)


def test_single_jaeger_trace_object_and_top_level_arrays(tmp_path: Path) -> None:
    single = tmp_path / "trace.json"
    single.write_text(json.dumps(jaeger_trace(), indent=2))
    spans, errors = split(list(read_spans(single)))
    assert errors == []
    check_jaeger_spans(spans)
    sdk = agent_traces(2)
    array = tmp_path / "requests.json"
    array.write_text(json.dumps([otlp_json(t) for t in by_trace(sdk)], indent=2))
    spans, errors = split(list(read_spans(array)))
    assert errors == [] and ids(spans) == expected_ids(sdk)
    v3 = tmp_path / "v3.json"
    v3.write_text(json.dumps({"result": otlp_json(sdk)}, indent=1))
    spans, errors = split(list(read_spans(v3)))
    assert errors == [] and ids(spans) == expected_ids(sdk)


def test_truncated_json_document_reports_an_error_after_what_it_read(tmp_path: Path) -> None:
    traces = by_trace(agent_traces(3))
    # one ResourceSpans per trace, as a Collector batch of three services would have
    doc = json.dumps({"resourceSpans": [otlp_json(t)["resourceSpans"][0] for t in traces]}, indent=2)
    path = tmp_path / "cut.json"
    path.write_text(doc[: len(doc) - 40])
    spans, errors = split(list(read_spans(path)))
    assert ids(spans) == expected_ids(traces[0] + traces[1])
    assert len(errors) == 1 and "malformed JSON document" in errors[0].message


def test_deeply_nested_json_is_refused_not_built(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    for content in ("[" * 200_000 + "]" * 200_000, '{"resourceSpans": ' + "[" * 100_000, "[[[{}]]]\n[[1]]\n"):
        path.write_text(content)
        spans, errors = split(list(read_spans(path)))
        assert spans == [] and errors, content[:20]


def test_bare_request_whose_length_byte_reads_as_a_brace(tmp_path: Path) -> None:
    """0a 7b ... is a newline and a '{' to a text sniffer, but a request of 123-byte ResourceSpans."""
    req = ExportTraceServiceRequest()
    span = req.resource_spans.add().scope_spans.add().spans.add(
        trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)), name=""
    )
    for n in range(123):  # length prefixes grow with the name: find the name that fits
        span.name = "x" * n
        if req.resource_spans[0].ByteSize() == 123:
            break
    data = req.SerializeToString()
    assert data[:2] == b"\x0a\x7b"
    path = tmp_path / "request.bin"
    path.write_bytes(data)
    spans, errors = split(list(read_spans(path)))
    assert errors == [] and [(s.span_id, s.name) for s in spans] == [(bytes(range(1, 9)).hex(), span.name)]
