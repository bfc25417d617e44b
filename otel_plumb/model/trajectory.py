"""Normalised spans, steps and trajectories (SPEC section 2).

A trajectory is the ordered list of steps of one trace (or of one session's traces). Every
span becomes a step, in one index space; checks look at the tool steps but report the
global index so a violation can be found in the trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

StepKind = Literal["tool", "llm", "agent", "other"]

# Why a value is or is not available: "captured" (decoded), "absent" (the instrumentation
# recorded nothing), "redacted" (a placeholder such as "<REDACTED>"), "undecodable" (present but
# not parseable; kept as the raw string). Only "captured" values are data.
CaptureStatus = Literal["captured", "absent", "redacted", "undecodable"]

# Attributes reserved for campaigns and ground truth; kept on the trajectory from the start.
RESERVED_PREFIX = "plumb."
CASE_ID: Final = "plumb.case.id"
VARIANT_ID: Final = "plumb.variant.id"
TRIAL_ID: Final = "plumb.trial.id"
ARM: Final = "plumb.arm"
CONTEXT_PREFIX: Final = "plumb.context."

# Incomplete reasons meaning spans (or what they say) may be missing from anywhere in the
# trajectory, not only that later spans have not arrived: a span could not be read, a region of
# the input that may have held spans could not be read, a span's parent is not in the trace, a
# model call asked for tools the trace does not show, spans look like an agent's but follow no
# convention read here, the SDK dropped some of what a span recorded.
UNREADABLE_SPAN = "unreadable_span"
UNREADABLE_INPUT = "unreadable_input"
MISSING_PARENT = "missing_parent"
TOOL_CALLS_NOT_CAPTURED = "tool_calls_not_captured"
UNRECOGNISED_SPANS = "unrecognised_spans"
# The SDK dropped attributes or events from a span (its span limits: 128 attributes by default,
# which a long conversation's messages exceed): what the span recorded may be cut anywhere.
ATTRIBUTES_DROPPED = "attributes_dropped"
# The tool results of a span that has none (shared, read-only).
NO_TOOL_RESULTS: Final[Mapping[str, Any]] = MappingProxyType({})

DATA_LOST = frozenset(
    {UNREADABLE_SPAN, UNREADABLE_INPUT, MISSING_PARENT, TOOL_CALLS_NOT_CAPTURED, UNRECOGNISED_SPANS, ATTRIBUTES_DROPPED}
)

# Tools that hand control to another agent, and the argument naming it (Google ADK's
# transfer_to_agent, Strands' handoff_to_agent swarm tool, LlamaIndex AgentWorkflow's handoff).
HANDOFF_TOOLS = {"transfer_to_agent": "agent_name", "handoff_to_agent": "agent_name", "handoff": "to_agent"}
# transfer_to_<agent> (LangGraph supervisors, OpenAI Agents' requested handoffs) is a handoff
# when <agent> is an agent of the trajectory; a tool such as transfer_to_savings stays a tool.
TRANSFER_PREFIX = "transfer_to_"


# The records made once per span, step or trajectory write their own ``__init__``
# (``init=False``, the same parameters as the fields): compiled by mypyc it runs about 8x faster
# than the one dataclasses generates, which stays interpreted. tests/test_model_init.py keeps the
# two alike.


@dataclass(slots=True, init=False)
class RequestedCall:
    """A tool call the model asked for in its output messages (e.g. ``llm.output_messages.*``)."""

    name: str
    args: Any
    args_status: CaptureStatus
    tool_call_id: str | None = None

    def __init__(self, name: str, args: Any, args_status: CaptureStatus, tool_call_id: str | None = None) -> None:
        self.name = name
        self.args = args
        self.args_status = args_status
        self.tool_call_id = tool_call_id


@dataclass(slots=True, init=False)
class NormalisedSpan:
    """What the normaliser read from one span: the stage between spans and steps.

    Compact on purpose: replay keeps these, not the raw spans, until a trace is assembled.
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None
    span_name: str
    start_ns: int
    end_ns: int
    kind: StepKind
    name: str
    convention: str
    args: Any = None
    args_status: CaptureStatus = "absent"
    args_source: str | None = None
    result: Any = None
    result_status: CaptureStatus = "absent"
    error: str | None = None
    agent: str | None = None
    tool_call_id: str | None = None
    tokens: int | None = None
    session_id: str | None = None
    # Immutable, and empty ones shared: a buffered span holds no containers of its own for
    # what it does not carry (most spans have no requested calls, results or problems).
    requested_calls: tuple[RequestedCall, ...] = ()
    # Tool results the model was given back in this span's input messages, by tool-call id.
    tool_results: Mapping[str, Any] = field(default_factory=lambda: NO_TOOL_RESULTS)
    # Short scalar attributes of the span (and its resource): task keys, plumb.* ground truth,
    # service.name. Long payloads are left out to keep buffers small.
    attributes: dict[str, Any] = field(default_factory=dict)
    # Values present but not understood, as "attribute: reason" lines for coverage.
    problems: tuple[str, ...] = ()
    # A model call whose finish reason says it asked for tool calls, none of which were
    # captured (content capture off): the trace cannot say which tools were called.
    hidden_tool_calls: bool = False
    # The framework or instrumentation that wrote the span (from its instrumentation scope).
    framework: str | None = None
    # False: the span does not say for sure how its call ended, or that it was one (see Step).
    outcome_recorded: bool = True
    # The SDK dropped attributes or events from the span (ATTRIBUTES_DROPPED).
    cut: bool = False
    # The span's OTel kind (``model.span.SPAN_KIND_NAMES``): a CLIENT span over a SERVER span in
    # another process is a call its caller waited for (``Trajectory.start_bounds``).
    span_kind: int = 0

    def __init__(
        self, trace_id: str, span_id: str, parent_span_id: str | None, span_name: str, start_ns: int, end_ns: int,
        kind: StepKind, name: str, convention: str, args: Any = None, args_status: CaptureStatus = "absent",
        args_source: str | None = None, result: Any = None, result_status: CaptureStatus = "absent",
        error: str | None = None, agent: str | None = None, tool_call_id: str | None = None,
        tokens: int | None = None, session_id: str | None = None, requested_calls: tuple[RequestedCall, ...] = (),
        tool_results: Mapping[str, Any] = NO_TOOL_RESULTS, attributes: dict[str, Any] | None = None,
        problems: tuple[str, ...] = (), hidden_tool_calls: bool = False, framework: str | None = None,
        outcome_recorded: bool = True, cut: bool = False, span_kind: int = 0,
    ) -> None:  # fmt: skip
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_span_id = parent_span_id
        self.span_name = span_name
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.kind = kind
        self.name = name
        self.convention = convention
        self.args = args
        self.args_status = args_status
        self.args_source = args_source
        self.result = result
        self.result_status = result_status
        self.error = error
        self.agent = agent
        self.tool_call_id = tool_call_id
        self.tokens = tokens
        self.session_id = session_id
        self.requested_calls = requested_calls
        self.tool_results = tool_results
        self.attributes = {} if attributes is None else attributes
        self.problems = problems
        self.hidden_tool_calls = hidden_tool_calls
        self.framework = framework
        self.outcome_recorded = outcome_recorded
        self.cut = cut
        self.span_kind = span_kind

    @property
    def is_root(self) -> bool:
        return self.parent_span_id is None


@dataclass(slots=True, init=False)
class Step:
    index: int
    kind: StepKind
    name: str
    span_id: str
    parent_span_id: str | None
    trace_id: str
    start_ns: int
    end_ns: int
    convention: str
    # "span": the step is the span itself; "llm_output": a tool call requested in a model's
    # output with no tool span of its own (span_id is then the model call's span).
    source: Literal["span", "llm_output"] = "span"
    args: Any = None
    args_status: CaptureStatus = "absent"
    args_source: str | None = None
    result: Any = None
    result_status: CaptureStatus = "absent"
    error: str | None = None
    agent: str | None = None
    tool_call_id: str | None = None
    tokens: int | None = None
    # The framework or instrumentation that wrote the span.
    framework: str | None = None
    # False: the span records the call, not for sure how it ended: an MCP client span whose SDK
    # records neither the result nor its ``isError`` (MCP reports a tool's failure in the
    # result), a span the SDK cut (what it lost may have said it failed, or was no call). The
    # call may have failed, or not run, as one only the model's request records may have. (A
    # model call on a span the SDK cut may be a second record of one: its count and tokens.)
    outcome_recorded: bool = True

    def __init__(
        self, index: int, kind: StepKind, name: str, span_id: str, parent_span_id: str | None, trace_id: str,
        start_ns: int, end_ns: int, convention: str, source: Literal["span", "llm_output"] = "span",
        args: Any = None, args_status: CaptureStatus = "absent", args_source: str | None = None,
        result: Any = None, result_status: CaptureStatus = "absent", error: str | None = None,
        agent: str | None = None, tool_call_id: str | None = None, tokens: int | None = None,
        framework: str | None = None, outcome_recorded: bool = True,
    ) -> None:  # fmt: skip
        self.index = index
        self.kind = kind
        self.name = name
        self.span_id = span_id
        self.parent_span_id = parent_span_id
        self.trace_id = trace_id
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.convention = convention
        self.source = source
        self.args = args
        self.args_status = args_status
        self.args_source = args_source
        self.result = result
        self.result_status = result_status
        self.error = error
        self.agent = agent
        self.tool_call_id = tool_call_id
        self.tokens = tokens
        self.framework = framework
        self.outcome_recorded = outcome_recorded

    @property
    def succeeded(self) -> bool:
        """A failed call did not happen."""
        return self.error is None

    @property
    def unsure(self) -> bool:
        """A tool call that may have failed, or not run, for all the trace says: only the
        model's request records it, or a span that does not record how it ended."""
        return self.source != "span" or not self.outcome_recorded

    @property
    def duration_ms(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e6


@dataclass(slots=True, init=False)
class Trajectory:
    key: str
    trace_ids: list[str]
    steps: list[Step]
    complete: bool = True
    # Why the trajectory is incomplete: "max_wait", "evicted", "span_limit", "no_root", "shutdown",
    # or one of the DATA_LOST reasons below.
    incomplete_reason: str | None = None
    root_span_id: str | None = None
    service: str | None = None
    agent: str | None = None
    session_id: str | None = None
    start_ns: int = 0
    end_ns: int = 0
    span_count: int = 0
    attributes: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # When the steps were timed by more than one clock (spans recorded on different hosts, or by
    # processes that name no host): the clock of each step's span, by span id. Empty otherwise.
    # Times from two clocks differ by the clocks' skew, which nothing in the trace measures.
    clocks: dict[str, str] = field(default_factory=dict)
    # For the steps timed by another clock than the agent's (its root span's): when each started
    # by the agent's clock, as far as the trace shows, by span id: after ``lo`` and before ``hi``
    # (None: any time after), both excluded. ``lo`` is the start of the agent's span the call came
    # from (what a remote span does, that span caused), ``hi`` its end when every hop on the way is
    # a call the caller waited for (a CLIENT span over a SERVER span). (0, None) when no span of the
    # agent's is found above the step. Empty when one clock timed every step.
    start_bounds: dict[str, tuple[int, int | None]] = field(default_factory=dict)

    def __init__(
        self, key: str, trace_ids: list[str], steps: list[Step], complete: bool = True,
        incomplete_reason: str | None = None, root_span_id: str | None = None, service: str | None = None,
        agent: str | None = None, session_id: str | None = None, start_ns: int = 0, end_ns: int = 0,
        span_count: int = 0, attributes: dict[str, Any] | None = None, problems: list[str] | None = None,
        clocks: dict[str, str] | None = None, start_bounds: dict[str, tuple[int, int | None]] | None = None,
    ) -> None:  # fmt: skip
        self.key = key
        self.trace_ids = trace_ids
        self.steps = steps
        self.complete = complete
        self.incomplete_reason = incomplete_reason
        self.root_span_id = root_span_id
        self.service = service
        self.agent = agent
        self.session_id = session_id
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.span_count = span_count
        self.attributes = {} if attributes is None else attributes
        self.problems = [] if problems is None else problems
        self.clocks = {} if clocks is None else clocks
        self.start_bounds = {} if start_bounds is None else start_bounds

    @property
    def trace_id(self) -> str:
        return self.trace_ids[0] if self.trace_ids else ""

    @property
    def tool_steps(self) -> list[Step]:
        return [s for s in self.steps if s.kind == "tool"]

    @property
    def has_agent_spans(self) -> bool:
        """Whether any span is an agent's: an agent, model or tool span, or one that looks like
        an agent framework's but follows no convention read here. A trace of HTTP, database and
        application spans only is not an agent's run."""
        for s in self.steps:  # noqa: SIM110 (any() over a generator, compiled, costs a call per step)
            if s.kind != "other" or s.convention == "unrecognised":
                return True
        return False

    @property
    def case_id(self) -> str | None:
        return _str_or_none(self.attributes.get(CASE_ID))

    @property
    def variant_id(self) -> str | None:
        return _str_or_none(self.attributes.get(VARIANT_ID))

    @property
    def trial_id(self) -> str | None:
        return _str_or_none(self.attributes.get(TRIAL_ID))

    @property
    def arm(self) -> str | None:
        return _str_or_none(self.attributes.get(ARM))

    def context(self, prefix: str = CONTEXT_PREFIX) -> dict[str, Any]:
        """Ground truth carried on the spans as ``<prefix><key>`` attributes."""
        n = len(prefix)
        return {k[n:]: v for k, v in self.attributes.items() if k.startswith(prefix)}


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
