"""A trace plainly no agent's run is decided without its steps (``plain_trajectory``): the
trajectory and every decision on it must be the ones the full build gives."""

import tempfile
from functools import cache
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_plumb.assemble import Assembler, AssemblyLimits, build_trajectory
from otel_plumb.assemble.trajectory import plain_trajectory
from otel_plumb.check import CompiledPolicy, ToolNames, decide, late_span_could_change, load_policy
from otel_plumb.intake import Intake, Source
from otel_plumb.model import SpanRecord
from otel_plumb.normalise import normalise
from otel_plumb.receive.files import read_spans

POLICY = """
policy: refunds
invariants:
  - {id: must-lookup, must_call: lookup_customer}
  - {id: never-delete, never_call: delete_account}
  - {id: orders-once, call_count: {tool: orders, max: 1}}
"""

TRACE = "a" * 32


@cache
def policies() -> list[CompiledPolicy]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.yaml"
        path.write_text(POLICY)
        return [load_policy(path)]


def http_trace(root_service: str | None = "checkout") -> list[SpanRecord]:
    """An HTTP server span and the database and HTTP client calls under it."""
    resource = {"service.name": root_service} if root_service else {}
    scope = "opentelemetry.instrumentation.flask"
    return [
        SpanRecord(TRACE, "d1", "r1", "SELECT customers", start_ns=20, end_ns=30, resource=resource,
                   attributes={"db.system": "postgresql", "db.statement": "SELECT 1"}, scope_name=scope),
        SpanRecord(TRACE, "h1", "r1", "GET", start_ns=40, end_ns=60, resource=resource,
                   attributes={"http.request.method": "GET", "url.full": "https://x/y"}, scope_name=scope),
        SpanRecord(TRACE, "r1", None, "POST /pay", start_ns=10, end_ns=90, resource=resource,
                   attributes={"http.request.method": "POST", "http.route": "/pay"}, scope_name=scope),
    ]  # fmt: skip


def test_an_http_trace_is_plain_and_named_by_its_roots_service():
    spans = [normalise(r) for r in http_trace()]
    t = plain_trajectory(TRACE, spans, complete=True, incomplete_reason=None, names_tool=ToolNames(policies()))
    assert t is not None and t.steps == []
    assert (t.service, t.root_span_id, t.start_ns, t.end_ns, t.span_count) == ("checkout", "r1", 10, 90, 3)
    d = decide(policies(), t)
    assert d.status == "unchecked" and not d.is_agent_run and d.policies == []


def test_what_makes_a_trace_not_plain():
    names = ToolNames(policies())

    def plain(records: list[SpanRecord]) -> bool:
        spans = [normalise(r) for r in records]
        return plain_trajectory(TRACE, spans, complete=True, incomplete_reason=None, names_tool=names) is not None

    assert plain(http_trace())
    # A model call: an agent's run.
    chat = SpanRecord(TRACE, "c1", "r1", "chat m", start_ns=50, end_ns=55,
                      attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"})  # fmt: skip
    assert not plain([*http_trace(), chat])
    # A span no convention reads, named after a tool the policy checks: it may hide that call.
    assert not plain([*http_trace(), SpanRecord(TRACE, "o1", "r1", "GET orders", start_ns=41, end_ns=42)])
    # No root, a root without a service name, a missing parent, two roots.
    assert not plain(http_trace()[:2])
    assert not plain(http_trace(root_service=None))
    assert not plain([*http_trace(), SpanRecord(TRACE, "x1", "gone", "SELECT 2", start_ns=70, end_ns=71)])
    assert not plain([*http_trace(), SpanRecord(TRACE, "r2", None, "GET /health", start_ns=5, end_ns=6)])
    # A span of an agent framework's scope, and one with a session.
    assert not plain([*http_trace(), SpanRecord(TRACE, "f1", "r1", "step", scope_name="traceloop.tracer")])
    assert not plain([*http_trace(), SpanRecord(TRACE, "s1", "r1", "step", attributes={"session.id": "s"})])
    # The full build decides the same as ever for each of those: the policy applies where a
    # span is named after its tool.
    full = build_trajectory(TRACE, [normalise(r) for r in [*http_trace(),
                            SpanRecord(TRACE, "o1", "r1", "GET orders", start_ns=41, end_ns=42)]])  # fmt: skip
    assert decide(policies(), full).policies == ["refunds"]


def test_the_intake_builds_a_marked_trace_in_full():
    """A trace part of whose data could not be read may be an agent's: the policies apply."""
    intake = Intake()
    source = Source("request")
    for r in http_trace():
        intake.add(r, None, 0.0, source)
    intake.unreadable(source, "span z could not be decoded", TRACE)
    (finished,) = intake.drain(10.0)
    t = intake.trajectory(finished, names_tool=ToolNames(policies()))
    assert [s.span_id for s in t.steps] == ["r1", "d1", "h1"]
    assert t.incomplete_reason == "unreadable_input"
    assert decide(policies(), t).status == "indeterminate"


NAMES = ["GET /orders", "SELECT orders", "POST /pay", "GET", "process", "run tool", "agent loop", "lookup_customer",
         "INSERT", "send", "delete_account cleanup", "chat m"]  # fmt: skip
ATTRIBUTES = [
    {"http.request.method": "GET", "url.full": "https://a/b"},
    {"db.system": "postgresql", "db.statement": "SELECT 1"},
    {"messaging.system": "kafka"},
    {"app.tenant": "t1", "app.order_id": "o-9"},
    {"tool.name": "x"},
    {"session.id": "s-1"},
    {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup_customer"},
    {"error.type": "TimeoutError"},
    {},
]
SCOPES = ["opentelemetry.instrumentation.requests", "", "traceloop.tracer", "my.app"]


PLAIN_NAMES = ["POST /pay", "GET", "SELECT customers", "INSERT", "send", "process"]


@st.composite
def traces(draw: st.DrawFn) -> tuple[list[SpanRecord], bool, str | None]:
    """Spans of one trace, mostly HTTP, database and application spans, with any parent links
    (a root or not, one or two, a parent missing), services, times (ties too) and names. Half
    are tidy (a root naming its service, every parent there, plain names and attributes), each
    of which one untidy span may still spoil."""
    n = draw(st.integers(1, 8))
    ids = [f"s{i}" for i in range(n)]
    tidy = draw(st.booleans())
    spoiled = draw(st.integers(0, 2 * n)) if tidy else -1
    records = []
    for i, span_id in enumerate(ids):
        messy = not tidy or i == spoiled
        if messy:
            parent = draw(st.sampled_from([None, "gone", *ids[:i]]))
        else:
            parent = draw(st.sampled_from(ids[:i])) if i else None
        service = draw(st.sampled_from(["checkout", "payments", None])) if messy or i else "checkout"
        attributes = dict(draw(st.sampled_from(ATTRIBUTES if messy else ATTRIBUTES[:4])))
        start = draw(st.integers(0, 5))
        end = start + draw(st.integers(0, 5))
        records.append(SpanRecord(
            TRACE, span_id, parent, draw(st.sampled_from(NAMES if messy else PLAIN_NAMES)), start_ns=start,
            end_ns=end, status_code=draw(st.sampled_from([0, 1, 2])), attributes=attributes,
            resource={"service.name": service} if service else {},
            scope_name=draw(st.sampled_from(SCOPES if messy else [s for s in SCOPES if s != "traceloop.tracer"])),
        ))  # fmt: skip
    draw(st.randoms()).shuffle(records)  # in any order of arrival
    complete = draw(st.booleans())
    return records, complete, None if complete else draw(st.sampled_from(["max_wait", "evicted", "span_limit"]))


@settings(max_examples=400, deadline=None)
@given(traces())
def test_a_plain_trajectory_is_the_full_one_without_steps_and_decides_the_same(case):
    records, complete, reason = case
    spans = [normalise(r) for r in records]
    full = build_trajectory(TRACE, list(spans), complete=complete, incomplete_reason=reason)
    plain = plain_trajectory(TRACE, list(spans), complete=complete, incomplete_reason=reason,
                             names_tool=ToolNames(policies()))  # fmt: skip
    if plain is None:
        return
    assert not full.has_agent_spans
    # Nothing for a redaction path to find in the steps left out.
    assert all(st.args_status != "captured" and st.result_status != "captured" for st in full.steps)
    for field in ("key", "trace_ids", "complete", "incomplete_reason", "root_span_id", "service", "agent",
                  "session_id", "start_ns", "end_ns", "span_count", "problems"):  # fmt: skip
        assert getattr(plain, field) == getattr(full, field), field
    assert plain.service == full.attributes.get("service.name")
    by_full, by_plain = decide(policies(), full), decide(policies(), plain)
    assert (by_plain.status, by_plain.policies, by_plain.verdicts, by_plain.key, by_plain.is_agent_run) == (
        by_full.status, by_full.policies, by_full.verdicts, by_full.key, by_full.is_agent_run
    )
    assert not late_span_could_change(policies(), by_full)


def test_the_assembler_hands_plain_traces_out_as_they_were_buffered():
    """The assembler's finished trace, asked with ``names_tool``, gives the plain trajectory; a
    session (several traces) is built in full."""
    assembler = Assembler(AssemblyLimits())
    for r in http_trace():
        assembler.add(normalise(r), None, 0.0)
    (finished,) = assembler.drain(10.0)
    assert finished.trajectory(ToolNames(policies())).steps == []
    assert len(finished.trajectory().steps) == 3


HTTPX_SERVICE = Path(__file__).parent / "fixtures" / "conventions" / "httpx_service.jsonl"


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_a_captured_service_trace_delivered_in_any_order_and_twice_is_decided_the_same(data: st.DataObject):
    """At-least-once delivery of the real httpx instrumentation's spans: whatever the order and
    however many are resent, the intake hands out the one plain trajectory a clean delivery gives."""
    records = [r for r in read_spans(HTTPX_SERVICE) if isinstance(r, SpanRecord)]
    names = ToolNames([])  # (the policy's tool "orders" is in the service's span name "sync_orders")

    def delivered(order: list[SpanRecord], names: ToolNames) -> tuple[object, ...]:
        intake = Intake()
        for r in order:
            intake.add(r, None, 0.0)
        (finished,) = intake.drain(10.0)
        t = intake.trajectory(finished, names_tool=names)
        d = decide(policies(), t)
        return (t.steps, t.service, t.root_span_id, t.span_count, t.complete, d.status, d.policies, d.is_agent_run)

    clean = delivered(records, names)
    assert clean[0] == [] and clean[5] == "unchecked"
    # Where a span name holds a checked tool's name, the trace is built in full, decided the same.
    full = delivered(records, ToolNames(policies()))
    assert len(full[0]) == 4 and full[1:] == clean[1:]
    resent = data.draw(st.lists(st.sampled_from(records), max_size=6))
    order = data.draw(st.permutations([*records, *resent]))
    assert delivered(order, names) == clean
