"""Early checks on traces in flight, kept incremental: per trace, counters updated as its spans
arrive tell when a failure of an early invariant has become possible, and only then is the
partial trajectory built and checked (``CompiledPolicy.early_failures``), so the verdicts are
those of that evaluation, message for message.

Cost: ``EarlyState.add`` is O(1) per span (O(requested calls) for a model call naming tools);
``EarlyWatch.may_fail`` is O(early invariants x tools they name) per request touching the
trace, whatever the trace's size. The partial trajectory (O(spans)) is built only on a
request after which some early invariant not yet reported may fail, which for an invariant
that does fail is once per trace; that keeps a trace of N spans in requests of k at O(N), not
O(N^2 / k). Only the invariants that may fail are checked on it.

What ``may_fail`` says is a necessary condition of a fail, from what building a trajectory
can do to the steps: it only ever removes tool calls (a tool that ran another agent becomes an
``other`` step, a handoff an ``agent`` step, and calls a model requested are steps of their own
only in a trace with no tool span, so they are counted only while it has none) and
model calls (one recorded twice counts once), and takes tokens away, so counts and totals over
the spans bound those over the steps. Order is by start time, so for ``precedes`` a first
successful ``then`` that starts no later than every successful ``first`` is necessary, unless
the order or the kinds may be rearranged (a turn of parallel calls put in request order, an
agent span under another span, a ``first`` tool named like a handoff): then any successful
``then`` call is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from otel_plumb.check import checks as ck
from otel_plumb.check.policy import CompiledPolicy
from otel_plumb.model.trajectory import NormalisedSpan

_NEVER = 1 << 62  # no such call yet: later than any start time


@dataclass(slots=True)
class _Tool:
    """One watched tool name in one trace: successful calls, attempts, calls only requested by a
    model, and the earliest start of a successful (or requested) call."""

    ok: int = 0
    tried: int = 0
    asked: int = 0
    first_ok: int = _NEVER
    first_asked: int = _NEVER


class EarlyState:
    """What the early invariants need to know of one trace in flight, updated span by span."""

    __slots__ = ("end", "llm_spans", "reordered", "requested", "spans", "start", "tokens", "tool_errors",
                 "tool_spans", "tools", "watched")  # fmt: skip

    def __init__(self, watched: frozenset[str]) -> None:
        self.watched = watched
        self.spans = self.requested = self.tool_spans = self.llm_spans = self.tool_errors = self.tokens = 0
        self.start, self.end = _NEVER, -_NEVER
        # The step order may differ from start order, or a tool call may become another kind.
        self.reordered = False
        self.tools: dict[str, _Tool] = {}

    def _tool(self, name: str) -> _Tool:
        tool = self.tools.get(name)
        if tool is None:
            tool = self.tools[name] = _Tool()
        return tool

    def add(self, span: NormalisedSpan) -> None:
        """Count one span taken into the trace's buffer (each span once: duplicates are not)."""
        self.spans += 1
        if span.start_ns < self.start:
            self.start = span.start_ns
        if span.end_ns > self.end:
            self.end = span.end_ns
        if span.tokens is not None:
            self.tokens += span.tokens
        kind = span.kind
        if kind == "tool":
            self.tool_spans += 1
            if span.error is not None:
                self.tool_errors += 1
            if span.name in self.watched:
                tool = self._tool(span.name)
                tool.tried += 1
                if span.error is None:
                    tool.ok += 1
                    tool.first_ok = min(tool.first_ok, span.start_ns)
        elif kind == "llm":
            self.llm_spans += 1
        elif kind == "agent" and span.parent_span_id is not None:
            self.reordered = True  # it may be a tool's run: that tool call becomes another kind
        calls = span.requested_calls
        if calls:
            self.requested += len(calls)
            if len(calls) > 1:
                self.reordered = True  # a turn of parallel calls runs in request order
            for call in calls:
                if call.name in self.watched:
                    tool = self._tool(call.name)
                    tool.asked += 1
                    tool.first_asked = min(tool.first_asked, span.end_ns)  # where a requested step sits

    @property
    def asked_are_steps(self) -> bool:
        """Requested calls become steps only in a trace without tool spans (else they are
        matched to those spans, or dropped as a problem): see ``build_trajectory``."""
        return self.tool_spans == 0

    def ok(self, tools: ck.Tools) -> int:
        """Successful and requested calls of ``tools``: at least the successful calls among the steps."""
        return self._calls(tools, attempts=False)

    def tried(self, tools: ck.Tools) -> int:
        return self._calls(tools, attempts=True)

    # Over the names a check watches (one or two), not the trace's tools.
    def _calls(self, tools: ck.Tools, *, attempts: bool) -> int:
        asked = self.asked_are_steps
        n = 0
        for name in tools:
            t = self.tools.get(name)
            if t is not None:
                n += (t.tried if attempts else t.ok) + (t.asked if asked else 0)
        return n

    def first_ok(self, tools: ck.Tools, *, requested: bool) -> int:
        asked = requested and self.asked_are_steps
        first = _NEVER
        for name in tools:
            t = self.tools.get(name)
            if t is not None:
                # Comparisons, not min(): this runs for every precedes invariant on every request.
                if t.first_ok < first:
                    first = t.first_ok
                if asked and t.first_asked < first:
                    first = t.first_asked
        return first


@dataclass(frozen=True, slots=True)
class _Rule:
    key: tuple[str, str]  # (policy, invariant), as reported
    check: ck.Check
    may_fail: Callable[[EarlyState], bool]


class EarlyWatch:
    """The early invariants of a set of policies, and when each may fail on a trace in flight."""

    __slots__ = ("rules", "watched")

    def __init__(self, policies: Sequence[CompiledPolicy]) -> None:
        self.rules = [
            _Rule((p.name, inv.id), inv.check, _may_fail(inv.check, scoped=inv.scope is not None))
            for p in policies
            for inv in p.invariants
            if inv.early
        ]
        self.watched = frozenset(
            name
            for rule in self.rules
            for attr in ("tools", "first", "then")
            for name in getattr(rule.check, attr, frozenset[str]())
        )

    def state(self) -> EarlyState:
        return EarlyState(self.watched)

    def may_fail(
        self, state: EarlyState, reported: set[tuple[str, str]] | frozenset[tuple[str, str]]
    ) -> list[tuple[str, str]]:
        """The early invariants not yet reported for the trace that may fail on what it holds
        now, as (policy, invariant) keys: only those need checking on its partial trajectory."""
        rules = [rule for rule in self.rules if rule.key not in reported] if reported else self.rules
        return [rule.key for rule in rules if rule.may_fail(state)]


def _handoff_named(tools: frozenset[str] | tuple[()]) -> bool:
    # The names build_trajectory may turn into agent steps (handoff tools, transfer_to_<agent>).
    return any(t in ("transfer_to_agent", "handoff_to_agent", "handoff") or t.startswith("transfer_to_") for t in tools)


def _may_fail(check: ck.Check, *, scoped: bool) -> Callable[[EarlyState], bool]:
    """The necessary condition of a fail of ``check`` (see the module docstring), made once."""
    if isinstance(check, ck.NeverCall):
        tools = check.tools
        if check.attempts:
            return lambda s: s.tried(tools) > 0
        return lambda s: s.ok(tools) > 0
    if isinstance(check, ck.CallCount):
        high, tools = check.high, check.tools
        if high is None:
            return lambda s: False
        return lambda s: s.ok(tools) > high
    if isinstance(check, ck.Precedes):
        first, then = check.first, check.then
        # A scope cuts the ``first`` calls before its opening off; reordering may move them.
        anywhere = scoped or _handoff_named(first)

        def precedes(s: EarlyState) -> bool:
            at = s.first_ok(then, requested=True)
            if at == _NEVER:
                return False
            return anywhere or s.reordered or at <= s.first_ok(first, requested=False)

        return precedes
    if isinstance(check, ck.Budget):
        over = [_over(name, limit) for name, limit in check.limits.items()]

        def budget(s: EarlyState) -> bool:
            for o in over:  # noqa: SIM110 (a loop: any() over a generator takes twice as long)
                if o(s):
                    return True
            return False

        return budget
    return lambda s: True  # a kind this does not know: check every time


def _over(name: str, limit: float) -> Callable[[EarlyState], bool]:
    if name == "max_steps":
        return lambda s: s.spans + (s.requested if s.asked_are_steps else 0) > limit
    if name == "max_tool_calls":
        return lambda s: s.tool_spans + (s.requested if s.asked_are_steps else 0) > limit
    if name == "max_llm_calls":
        return lambda s: s.llm_spans > limit
    if name == "max_tool_errors":
        return lambda s: s.tool_errors > limit
    if name == "max_duration_ms":
        return lambda s: s.spans > 0 and (s.end - s.start) / 1e6 > limit
    if name == "max_tokens":
        return lambda s: s.tokens > limit
    return lambda s: True
