"""What every convention reader shares: the base NormalisedSpan, errors, tokens, session ids,
the short attributes kept for checks, and setting arguments/results from raw values."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from otel_plumb.model.placeholders import is_placeholder
from otel_plumb.model.span import STATUS_ERROR, STATUS_OK, SpanRecord
from otel_plumb.model.trajectory import RESERVED_PREFIX, NormalisedSpan, RequestedCall
from otel_plumb.normalise.values import ABSENT, Decoded, decode, given_result, unwrap_call

# A convention reader fills in kind, name, convention, args, ... on a base NormalisedSpan.
Reader = Callable[[SpanRecord, NormalisedSpan], None]

MAX_ATTRIBUTE_CHARS: Final = 256

# Span attributes left out of NormalisedSpan.attributes: the conventions' own namespaces, which
# the readers turn into fields (tool name, args, tokens, ...), and flattened message payloads.
# What stays is what a trajectory-level check needs: task keys, plumb.*, session/user ids, and
# user metadata the conventions carry for the application (kept by _USER_PREFIXES).
_CONVENTION_PREFIXES: Final[tuple[str, ...]] = (
    "gen_ai.",
    "llm.",
    "ai.",
    "openinference.",
    "traceloop.",
    "mlflow.",
    "langfuse.observation.",
    "langsmith.span.",
    "langsmith.trace.",
    "tool.",
    "tool_call.",
    "input.",
    "output.",
    "logfire.",
    "mcp.",
    "gcp.vertex.agent.",
    "pydantic_ai.",
    "event_loop.",
    "jsonrpc.",
    "operation.name",
    "tool_arguments",
    "tool_response",
    "agent_name",
    "model_name",
    "model_request_parameters",
    "final_result",
    "all_messages_events",
    "events",
    "metadata",
)
_USER_PREFIXES: Final[tuple[str, ...]] = (
    "traceloop.association.properties.", "ai.telemetry.metadata.", "langsmith.metadata.",
)  # fmt: skip

# Attributes that carry the conversation/session key, in order of preference.
SESSION_KEYS: Final[tuple[str, ...]] = (
    "gen_ai.conversation.id",
    "session.id",
    "langfuse.session.id",
    "gcp.vertex.agent.session_id",
    "traceloop.association.properties.session_id",
    "ai.telemetry.metadata.sessionId",
    "ai.telemetry.metadata.session_id",
    "langsmith.metadata.session_id",
    "langsmith.metadata.thread_id",
    "langsmith.metadata.conversation_id",
    "mlflow.trace.session",
    "thread.id",
)

# (input, output) token attribute pairs, newest convention first.
_TOKEN_PAIRS: Final[tuple[tuple[str, str], ...]] = (
    ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"),
    ("gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens"),
    ("llm.token_count.prompt", "llm.token_count.completion"),
    ("ai.usage.promptTokens", "ai.usage.completionTokens"),
    ("ai.usage.inputTokens", "ai.usage.outputTokens"),
)
_TOTAL_TOKEN_KEYS: Final[tuple[str, ...]] = (
    "gen_ai.usage.total_tokens", "llm.token_count.total", "llm.usage.total_tokens",
)  # fmt: skip

# Span attributes holding a model call's finish reason(s); instrumentations keep them when content
# capture is off: OTel GenAI (opentelemetry-instrumentation-openai-v2, OpenLLMetry 0.5x and later,
# LangSmith) ``gen_ai.response.finish_reasons``, OpenInference ``llm.finish_reason``, Vercel AI SDK
# ``ai.response.finishReason``; older OpenLLMetry writes ``gen_ai.completion.N.finish_reason``.
_FINISH_KEYS: Final = frozenset({"gen_ai.response.finish_reasons", "llm.finish_reason", "ai.response.finishReason"})
_FLAT_FINISH: Final[tuple[str, ...]] = ("gen_ai.completion.", ".finish_reason")
# Finish reasons meaning "the model asked for tool calls": OpenAI "tool_calls" (legacy
# "function_call"), the GenAI enum "tool_call", Vercel "tool-calls", Anthropic/Bedrock "tool_use".
_TOOL_FINISH_REASONS: Final = frozenset({"tool_calls", "tool_call", "tool-calls", "tool_use", "function_call"})


class Shape:
    """What the shared fields need from a span's attribute keys, worked out once per key set:
    the session and token keys present, and how each kept attribute is kept."""

    __slots__ = ("finish_keys", "kept", "session_keys", "token_pairs", "total_keys")

    def __init__(self, keys: tuple[str, ...]) -> None:
        present = set(keys)
        self.session_keys = tuple(k for k in SESSION_KEYS if k in present)
        self.token_pairs = tuple(p for p in _TOKEN_PAIRS if p[0] in present or p[1] in present)
        self.total_keys = tuple(k for k in _TOTAL_TOKEN_KEYS if k in present)
        self.finish_keys = tuple(
            k for k in keys if k in _FINISH_KEYS or (k.startswith(_FLAT_FINISH[0]) and k.endswith(_FLAT_FINISH[1]))
        )
        self.kept = tuple((k, rule) for k in keys if (rule := _rule(k, resource=False)) != _DROP)


def base(span: SpanRecord, shape: Shape) -> NormalisedSpan:
    name = span.name
    return NormalisedSpan(
        span.trace_id,
        span.span_id,
        span.parent_span_id,
        name,
        span.start_ns,
        span.end_ns,
        "other",
        name,
        "unknown",
        attributes=short_attributes(span, shape),
        span_kind=span.kind,
    )


def finish(span: SpanRecord, out: NormalisedSpan, shape: Shape) -> None:
    """Fields read the same way whatever the convention: errors, session, tokens."""
    a = span.attributes
    if out.error is None:
        out.error = error_of(span)
    if out.session_id is None:
        for key in shape.session_keys:
            value = a.get(key)
            if value is not None and value != "":
                out.session_id = str(value)
                break
    if out.kind == "llm":
        if out.tokens is None:
            out.tokens = tokens_of(a, shape.token_pairs, shape.total_keys)
        if not out.requested_calls and (shape.finish_keys or span.events):
            out.hidden_tool_calls = asks_for_tools(span, shape.finish_keys)


def mark_cut(span: SpanRecord, out: NormalisedSpan) -> None:
    """A span the SDK dropped attributes or events from (its span limits) may have lost any of
    them: the one saying what it is, an argument of a flattened set, an ``error.type``. Its
    trajectory is incomplete (``ATTRIBUTES_DROPPED``); a tool call it records is unsure (it may
    have failed, or be no call: what said otherwise may be gone), and so is a model call (it may
    be another record of one counted already: what merged them may be gone); arguments read
    from flattened keys may miss some."""
    out.cut = True
    out.problems += (
        f"span {span.span_id} ({span.name!r}): the SDK dropped {span.dropped} of its attributes or events (span "
        "limits: OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT, OTEL_SPAN_EVENT_COUNT_LIMIT, 128 by default)",
    )  # fmt: skip
    out.outcome_recorded = False
    if out.args_status == "captured" and out.args_source is not None and out.args_source.endswith("*"):
        out.args, out.args_status = None, "undecodable"


def asks_for_tools(span: SpanRecord, finish_keys: tuple[str, ...]) -> bool:
    """Whether the model call's finish reason says it asked for tool calls: on the span's finish
    reason attributes, or on its ``gen_ai.choice`` events (the event-based GenAI form, Strands)."""
    a = span.attributes
    for key in finish_keys:
        if _is_tool_finish(a[key]):
            return True
    return any(e.name == "gen_ai.choice" and _is_tool_finish(e.attributes.get("finish_reason")) for e in span.events)


def _is_tool_finish(value: Any) -> bool:
    if isinstance(value, str):
        if value.startswith("["):
            value = decode(value).value
        else:
            return value.strip().lower() in _TOOL_FINISH_REASONS
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, str) and v.strip().lower() in _TOOL_FINISH_REASONS for v in value)
    return False


def error_of(span: SpanRecord) -> str | None:
    """Span status ERROR, an ``error.type`` attribute or an ``exception`` event mean the call failed.

    An ``exception`` event on a span with status OK does not: OK is final in OpenTelemetry (set
    by the instrumentation or the application, once the call succeeded), and an exception event
    records an exception raised during the span, which the code may have handled (a tool that
    retried and then succeeded). ``error.type`` still means failure whatever the status: the
    semantic conventions define it as the class of error the operation ended with."""
    a = span.attributes
    status = span.status_code
    exc = next((e for e in span.events if e.name == "exception"), None) if span.events and status != STATUS_OK else None
    error_type = a.get("error.type")
    if status != STATUS_ERROR and exc is None and not error_type:
        return None
    if span.status_message:
        return error_line(span.status_message)
    if exc is not None:
        message = exc.attributes.get("exception.message") or exc.attributes.get("exception.type")
        if message:
            return error_line(str(message))
    return str(error_type) if error_type else "error"


_MAX_ERROR_CHARS: Final = 300


def error_line(message: str) -> str:
    """The first line of an error message (some instrumentations append the traceback), bounded."""
    line = next((part.strip() for part in message.splitlines() if part.strip()), "") or "error"
    return line if len(line) <= _MAX_ERROR_CHARS else line[: _MAX_ERROR_CHARS - 1] + "…"


def tokens_of(
    a: dict[str, Any],
    pairs: tuple[tuple[str, str], ...] = _TOKEN_PAIRS,
    total_keys: tuple[str, ...] = _TOTAL_TOKEN_KEYS,
) -> int | None:
    """Input + output tokens, or a total; ``pairs`` and ``total_keys`` narrow the keys tried."""
    for kin, kout in pairs:
        tin, tout = as_int(a.get(kin)), as_int(a.get(kout))
        if tin is not None or tout is not None:
            return (tin or 0) + (tout or 0)
    for key in total_keys:
        total = as_int(a.get(key))
        if total is not None:
            return total
    return None


def as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value == value and abs(value) < 1e18:
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def as_str(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list, bytes)):
        return None
    s = str(value)
    return s or None


class _LastResource:
    """One-entry cache: the spans of one ResourceSpans share the resource mapping and arrive
    together. ``last`` is swapped as one tuple, so that concurrent callers never pair a resource
    with another's attributes. (An object's field, not a module global: compiled code looks a
    global up by name.)"""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: tuple[Mapping[str, Any] | None, dict[str, Any]] = (None, {})


_resource_cache: Final = _LastResource()


def short_attributes(span: SpanRecord, shape: Shape) -> dict[str, Any]:
    """Short scalars, the reserved ``plumb.*`` attributes whatever they hold, and for span
    attributes only keys outside the conventions' own namespaces.

    A span that keeps none of its own gets its resource's dict, shared by the spans of that
    resource (never written to after normalisation): most spans of a convention keep none."""
    resource = span.resource
    cached_resource, kept = _resource_cache.last
    if resource is not cached_resource:
        kept = {}
        _keep_into(kept, resource, [(k, _rule(k, resource=True)) for k in resource])
        _resource_cache.last = (resource, kept)
    out = kept
    attrs = span.attributes
    for k, rule in shape.kept:  # no _DROP rule: Shape leaves those out
        v = attrs[k]
        if rule == _IF_SHORT and not _short(v):
            continue
        if out is kept:
            out = kept.copy()  # the resource's first, then the span's own over them
        out[k] = v
    return out


# How an attribute is kept, by key (see _rule).
_DROP: Final = 0
_IF_SHORT: Final = 1
_ALWAYS: Final = 2


def _rule(key: str, resource: bool) -> int:
    if key.startswith(RESERVED_PREFIX):
        return _ALWAYS  # ground truth and campaign labels, whatever their size
    if resource or key.startswith(_USER_PREFIXES) or not key.startswith(_CONVENTION_PREFIXES):
        return _IF_SHORT
    return _DROP


def _keep_into(out: dict[str, Any], attrs: Mapping[str, Any], rules: Iterable[tuple[str, int]]) -> None:
    for k, rule in rules:
        if rule == _DROP:
            continue
        v = attrs[k]
        if rule == _IF_SHORT and not _short(v):
            continue
        out[k] = v


def _short(v: Any) -> bool:
    """A scalar, or a string of at most MAX_ATTRIBUTE_CHARS."""
    t = type(v)
    if t is str:
        return len(v) <= MAX_ATTRIBUTE_CHARS
    return t is int or t is float or t is bool


def add_tool_results(out: NormalisedSpan, results: Mapping[str, Any]) -> None:
    """Tool results onto ``out``; a span given none keeps the shared empty mapping. A result not
    captured in one payload (a ``Decoded``, see ``values.given_result``) does not replace the
    same result captured in another."""
    if not results:
        return
    merged = dict(out.tool_results)
    merge_tool_results(merged, results)
    out.tool_results = merged


def merge_tool_results(into: dict[str, Any], results: Mapping[str, Any]) -> None:
    """``results`` into ``into``, by tool-call id; a captured result wins over one not captured."""
    for call_id, value in results.items():
        if type(value) is not Decoded or type(into.get(call_id, value)) is Decoded:
            into[call_id] = value


def captured_tool_results(out: NormalisedSpan) -> bool:
    """Whether ``out`` holds at least one tool result whose value was captured."""
    return any(type(v) is not Decoded for v in out.tool_results.values())


def set_args(out: NormalisedSpan, raw: Any, source: str) -> bool:
    """Decode raw arguments onto ``out``. True when something was present (captured or not)."""
    d = decode(raw)
    if d.status == "absent":
        return False
    if d.status == "captured":
        unwrapped = unwrap_call(d.value)
        if unwrapped is not None:
            d = unwrapped
            source = f"{source} (call wrapper)"
    out.args_status = d.status
    out.args_source = source
    if d.status == "captured":
        out.args = d.value
        if type(d.value) is dict:
            _note_redacted_fields(out, d.value, source)
    elif d.status == "undecodable":
        out.problems += (f"{source}: {d.reason}",)
    return True


def _note_redacted_fields(out: NormalisedSpan, args: dict[Any, Any], source: str) -> None:
    """Arguments that are data except for some redacted fields: those fields are named in a
    problem line, so checks on them are known to look at a placeholder."""
    for key, value in args.items():
        if type(value) is str and len(value) <= _MAX_PLACEHOLDER_CHARS and is_placeholder(value):
            out.problems += (f"{source}: argument {key!r} is a redaction placeholder",)


_MAX_PLACEHOLDER_CHARS: Final = 32


def set_result(out: NormalisedSpan, raw: Any, source: str) -> bool:
    d = decode(raw)
    if d.status == "absent":
        return False
    out.result_status = d.status
    if d.status == "captured":
        out.result = unwrap_content(d.value)
    elif d.status == "undecodable":
        out.problems += (f"{source}: {d.reason}",)
    return True


def set_first_args(out: NormalisedSpan, a: dict[str, Any], keys: tuple[str, ...]) -> bool:
    for key in keys:  # noqa: SIM110 - a loop, not any(generator): this is the hot path
        if key in a and set_args(out, a[key], key):
            return True
    return False


def set_first_result(out: NormalisedSpan, a: dict[str, Any], keys: tuple[str, ...]) -> bool:
    for key in keys:  # noqa: SIM110 - as above
        if key in a and set_result(out, a[key], key):
            return True
    return False


def first_str(a: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        s = as_str(a.get(key))
        if s:
            return s
    return None


def name_after(span_name: str, prefix: str) -> str | None:
    """``"execute_tool get_weather"`` -> ``"get_weather"`` for prefix ``"execute_tool "``."""
    if span_name.startswith(prefix) and len(span_name) > len(prefix):
        return span_name[len(prefix) :].strip() or None
    return None


def flattened(a: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """Flattened lists (``<prefix>N.<field>``) -> one dict of fields per N, in order of N."""
    items: dict[int, dict[str, Any]] = {}
    n = len(prefix)
    for key, value in a.items():
        if key.startswith(prefix):
            i, _, field = key[n:].partition(".")
            if i.isdigit() and field:
                items.setdefault(int(i), {})[field] = value
    return [items[i] for i in sorted(items)]


def flat_calls(messages: list[dict[str, Any]], calls_prefix: str, fields: tuple[str, str, str]) -> list[RequestedCall]:
    """Requested calls from flattened output messages; ``fields`` names (name, arguments, id)."""
    name_key, args_key, id_key = fields
    out: list[RequestedCall] = []
    for message in messages:
        for call in flattened(message, calls_prefix):
            name = as_str(call.get(name_key))
            if name is not None:
                d = decode(call.get(args_key))
                out.append(RequestedCall(name, d.value, d.status, as_str(call.get(id_key))))
    return out


def flat_results(messages: list[dict[str, Any]], role_key: str, id_key: str, content_key: str) -> dict[str, Any]:
    """Tool results from flattened input messages with role "tool", by tool-call id: those after
    the last assistant message (see ``messages.tool_results``); content not captured gives a
    ``Decoded`` with its status (``values.given_result``), none at all no result."""
    out: dict[str, Any] = {}
    last_assistant = max((i for i, m in enumerate(messages) if m.get(role_key) == "assistant"), default=-1)
    for message in messages[last_assistant + 1 :]:
        call_id = as_str(message.get(id_key))
        if message.get(role_key) == "tool" and call_id is not None:
            result = given_result(message.get(content_key))
            if result is not ABSENT:
                out[call_id] = result
    return out


_MCP_RESULT_KEYS: Final = frozenset({"content", "isError", "structuredContent", "_meta"})


def unwrap_content(value: Any) -> Any:
    """Tool results wrapped in content blocks -> the content: ``[{"text": "<json>"}]`` (Strands,
    Bedrock) and MCP's ``{"content": [{"type": "text", "text": ...}], "isError": ...}`` (its
    ``structuredContent`` when present). Anything else is returned as it is."""
    if isinstance(value, dict) and "content" in value and value.keys() <= _MCP_RESULT_KEYS:
        if "structuredContent" in value:
            return value["structuredContent"]
        value = value["content"]
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
        block = value[0]
        text = block.get("text")
        if isinstance(text, str) and block.keys() <= {"text", "type"}:
            d = decode(text)
            return d.value if d.status == "captured" else text
    return value
