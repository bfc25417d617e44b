"""Early checks on traces in flight, kept incremental and sound.

Sound: a failure reported early is one the final verdict will have. The partial trajectory it
is found on is what the spans so far say, less what spans still to come may change
(``in_flight``): a tool call the model requested that a tool span may still show failed, a
``transfer_to_<agent>`` call the agent it hands to may still turn into a handoff, tokens of a
model call a framework's span around it (arriving later) may take over. A ``precedes`` failure
stands once the ``then`` call's turn is over (``EarlyWatch.stands``), since a ``first`` call
running beside it may have started earlier and end later; it is not looked for at all once a
model call of the trace asked for tool calls whose names were not captured (one of them may be
the ``first`` call). A policy or invariant with
``applies_to`` is checked in flight only when its globs name services only, matching every
service the spans came from (which agent a trajectory is, is known from its root, which
arrives last). This holds
when a process's spans arrive in the order they end, as the OpenTelemetry SDK exports them, and
children end before their parents.

Incremental: per trace, counters updated as its spans arrive tell when a failure of an early
invariant has become possible, and only then is the partial trajectory built and checked, so
the verdicts are those of that evaluation, message for message.

Cost: ``EarlyState.add`` is O(1) per span (O(watched tools) while the turn of a tool's earliest
successful call is not over); ``EarlyWatch.may_fail`` is O(early invariants x tools they name)
per request touching the trace, whatever the trace's size. The partial trajectory (O(spans)) is
built only on a request after which some early invariant not yet reported may fail, which for
an invariant that does fail is once per trace (for ``precedes``, once its ``then`` call's turn
is over, unless the order may be rearranged); where the counters cannot rule a failure out and
the check finds none, once more each time the trace has grown by a quarter
(``EarlyState.worth_checking``). That keeps a trace of N spans in requests of k at O(N), not
O(N^2 / k). Only the invariants that may fail are checked on it.

What ``may_fail`` says is a necessary condition of a fail, from what building a trajectory
and ``in_flight`` can do to the steps: they only ever remove tool calls (a tool that ran
another agent becomes an ``other`` step, a handoff an ``agent`` step, an MCP record of a call
inside a tool span of its name counts once) and model calls (one recorded twice counts once),
and take tokens away, so counts and totals over the spans bound
those over the steps. Order is by start time, so for ``precedes`` a first successful ``then``
that starts no later than every successful ``first`` is necessary, unless the order or the
kinds may be rearranged (a turn of parallel calls put in request order, an agent span under
another span): then any successful ``then`` call is. And since that earliest ``then`` call is the
one a fail names, its turn being over, as ``stands`` asks, is necessary too (unless another
``then`` call started at the same time: either may be first).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from otel_plumb.check import checks as ck
from otel_plumb.check.policy import CompiledInvariant, CompiledPolicy, Glob
from otel_plumb.model.trajectory import HANDOFF_TOOLS, TRANSFER_PREFIX, NormalisedSpan, Step, Trajectory
from otel_plumb.model.verdict import Verdict


@dataclass(slots=True, init=False)
class _Tool:
    """One watched tool name in one trace: successful calls, attempts, whether there is a
    successful call (``has_first``) and the earliest start of one, and of that call: its parent,
    its end, whether another successful call started at the same time, and whether its turn is
    over (``EarlyWatch.stands``). (A flag, not a start time no span can have: span times are any
    integers a sender writes, and compiled code compares 62-bit integers fastest.)"""

    ok: int = 0
    tried: int = 0
    has_first: bool = False
    first_ok: int = 0
    first_parent: str | None = None
    first_end: int = 0
    first_tied: bool = False
    turn_over: bool = False

    def __init__(
        self, ok: int = 0, tried: int = 0, has_first: bool = False, first_ok: int = 0,
        first_parent: str | None = None, first_end: int = 0, first_tied: bool = False, turn_over: bool = False,
    ) -> None:  # fmt: skip
        self.ok = ok
        self.tried = tried
        self.has_first = has_first
        self.first_ok = first_ok
        self.first_parent = first_parent
        self.first_end = first_end
        self.first_tied = first_tied
        self.turn_over = turn_over


class EarlyState:
    """What the early invariants need to know of one trace in flight, updated span by span."""

    __slots__ = ("arrived", "end", "fruitless", "hidden_calls", "last_attributes", "latest_llm", "llm_spans",
                 "open_turns", "own_ids", "recheck_at", "recorders", "reordered", "services", "spans", "start",
                 "tokens", "tool_errors", "tool_spans", "tools", "unsettled", "watched")  # fmt: skip

    def __init__(self, watched: frozenset[str], arrived: Container[str] | None = None) -> None:
        self.watched = watched
        self.spans = self.tool_spans = self.llm_spans = self.tool_errors = self.tokens = 0
        # The earliest start and the latest end of its spans (when it has any).
        self.start = self.end = 0
        # The step order may differ from start order, or a tool call may become another kind.
        self.reordered = False
        # A model call asked for tool calls whose names were not captured (content capture off).
        self.hidden_calls = False
        # Nothing is checked early on a trace whose partial trajectory may say more than its final
        # one. An MCP record of a tool call arrived: a framework's tool span around records of one
        # call (a retry inside it), arriving later, makes them one step (``assemble.trajectory``),
        # so the partial trajectory may count more calls and errors than the final one. A tool or
        # model call of one name recorded by two conventions (two instrumentations at once: their
        # records become one step). A span the SDK cut (its final verdicts rest on lost data).
        self.unsettled = False
        # The convention of each tool or model call name's first span (for ``unsettled``).
        self.recorders: dict[tuple[str, str], str] = {}
        self.tools: dict[str, _Tool] = {}
        # The services its spans came from (for applies_to), and the attributes last read for one.
        self.services: set[str] = set()
        self.last_attributes: Mapping[str, Any] | None = None
        # For the turns of the earliest successful calls: the ids of the spans arrived, the latest
        # start of a model call under each parent, and how many of those turns are not over yet.
        # ``arrived``: the assembler's index of the trace's spans, when given (a set of their ids
        # here cost about 100 bytes per buffered span), else the ids of the spans added here.
        self.own_ids: set[str] | None = None
        self.arrived: Container[str]
        if arrived is None:
            self.own_ids = self.arrived = set()
        else:
            self.arrived = arrived
        self.latest_llm: dict[str | None, int] = {}
        self.open_turns = 0
        # The invariants the last check on the partial trajectory found no new failure of, and
        # the span count at which they are worth checking again (``worth_checking``).
        self.fruitless: frozenset[tuple[str, str]] = frozenset()
        self.recheck_at = 0

    def add(self, span: NormalisedSpan) -> None:
        """Count one span taken into the trace's buffer (each span once: duplicates are not)."""
        if not self.spans:
            self.start, self.end = span.start_ns, span.end_ns
        else:
            if span.start_ns < self.start:
                self.start = span.start_ns
            if span.end_ns > self.end:
                self.end = span.end_ns
        self.spans += 1
        if span.tokens is not None:
            self.tokens += span.tokens
        attributes = span.attributes
        if attributes is not self.last_attributes:  # spans of one resource share theirs
            self.last_attributes = attributes
            self.services.add(str(attributes.get("service.name", "")))
        if self.own_ids is not None:
            self.own_ids.add(span.span_id)
        kind = span.kind
        if self.open_turns:
            self._end_turns(span)
        if span.cut:
            self.unsettled = True
        if (kind == "tool" or kind == "llm") and not self.unsettled:
            first = self.recorders.setdefault((kind, span.name), span.convention)
            if first != span.convention:
                self.unsettled = True
        if kind == "tool":
            self.tool_spans += 1
            if span.convention == "mcp":
                self.unsettled = True
            if span.error is not None:
                self.tool_errors += 1
            if span.name in self.watched:
                tool = self.tools.get(span.name)
                if tool is None:
                    tool = self.tools[span.name] = _Tool()
                tool.tried += 1
                if span.error is None:
                    tool.ok += 1
                    if not tool.has_first or span.start_ns < tool.first_ok:
                        self._first_call(tool, span)
                    elif span.start_ns == tool.first_ok:
                        tool.first_tied = True
        elif kind == "llm":
            self.llm_spans += 1
            parent = span.parent_span_id
            latest = self.latest_llm.get(parent)
            if latest is None or span.start_ns > latest:
                self.latest_llm[parent] = span.start_ns
        elif kind == "agent" and span.parent_span_id is not None:
            self.reordered = True  # it may be a tool's run: that tool call becomes another kind
        if len(span.requested_calls) > 1:
            self.reordered = True  # a turn of parallel calls runs in request order
        if span.hidden_tool_calls:
            self.hidden_calls = True

    def _first_call(self, tool: _Tool, span: NormalisedSpan) -> None:
        """``span``, a successful call of ``tool``, started before every other one so far."""
        if not tool.turn_over and tool.has_first:
            self.open_turns -= 1
        parent = span.parent_span_id
        tool.has_first, tool.first_ok, tool.first_parent, tool.first_end = True, span.start_ns, parent, span.end_ns
        tool.first_tied = False
        latest = self.latest_llm.get(parent)
        parent_arrived = parent is not None and parent in self.arrived
        tool.turn_over = parent_arrived or (latest is not None and latest >= span.end_ns)
        if not tool.turn_over:
            self.open_turns += 1

    def _end_turns(self, span: NormalisedSpan) -> None:
        """The turns ``span`` ends: its children's (a parent ends after them), and its siblings'
        that ended before it started, if it is a model call (the agent asks again)."""
        llm = span.kind == "llm"
        for tool in self.tools.values():
            if not tool.turn_over and tool.has_first and (
                span.span_id == tool.first_parent
                or (llm and span.parent_span_id == tool.first_parent and span.start_ns >= tool.first_end)
            ):
                tool.turn_over = True
                self.open_turns -= 1

    def turn_over(self, tools: Sequence[str], earliest: int) -> bool:
        """Whether the turn of the earliest successful call of ``tools``, started at ``earliest``,
        may be over: it is, or which call that is is not certain (another started at the same time)."""
        calls = [
            t for name in tools if (t := self.tools.get(name)) is not None and t.has_first and t.first_ok == earliest
        ]
        return len(calls) != 1 or calls[0].first_tied or calls[0].turn_over

    def worth_checking(self, may_fail: Collection[tuple[str, str]]) -> bool:
        """Whether to build and check the partial trajectory for ``may_fail`` now. The counters
        over-approximate (see the module docstring): where they say an invariant may fail and
        the check finds it does not (a trace of parallel calls, whose step order is not start
        order; a call a sub-agent ran, which is no tool step), they say so again on every
        request. Such invariants are checked again once the trace has grown by a quarter, or at
        once with any other: so each costs O(N) over a trace of N spans, not O(N) per request.
        A failure is reported that much later at most (or by the full evaluation)."""
        return self.spans >= self.recheck_at or not self.fruitless.issuperset(may_fail)

    def checked(self, may_fail: Collection[tuple[str, str]], found: Collection[tuple[str, str]]) -> None:
        """The partial trajectory was checked for ``may_fail``, and ``found`` failed."""
        self.fruitless = frozenset(may_fail).difference(found)
        self.recheck_at = self.spans + max(1, self.spans // 4)

    def ok(self, tools: Sequence[str]) -> int:
        """Successful calls of ``tools``: at least those among the steps."""
        return self._calls(tools, attempts=False)

    def tried(self, tools: Sequence[str]) -> int:
        return self._calls(tools, attempts=True)

    # Over the names a check watches (one or two, in a tuple: compiled code indexes it), not the
    # trace's tools.
    def _calls(self, tools: Sequence[str], *, attempts: bool) -> int:
        n = 0
        for name in tools:
            t = self.tools.get(name)
            if t is not None:
                n += t.tried if attempts else t.ok
        return n

    def first_ok(self, tools: Sequence[str]) -> tuple[bool, int]:
        """Whether ``tools`` have a successful call, and the earliest start of one."""
        found, first = False, 0
        for name in tools:
            t = self.tools.get(name)
            # Comparisons, not min(): this runs for every precedes invariant on every request.
            if t is not None and t.has_first and (not found or t.first_ok < first):
                found, first = True, t.first_ok
        return found, first


class Condition:
    """The necessary condition of a fail of one early invariant on a trace in flight (see the
    module docstring), asked of the trace's counters on every request that touches it: one
    class per kind of check, so that asking is a method call on counters read in place. This
    base says yes: a kind it does not know is checked every time."""

    __slots__ = ()

    def holds(self, s: EarlyState) -> bool:
        return True


class _Never(Condition):
    """A ``call_count`` with no maximum: no early failure."""

    __slots__ = ()

    def holds(self, s: EarlyState) -> bool:
        return False


class _CallsOver(Condition):
    """More calls of ``tools`` than ``high`` (a ``never_call``: more than none)."""

    __slots__ = ("attempts", "high", "tools")

    def __init__(self, tools: ck.Tools, high: int, attempts: bool) -> None:
        self.tools = tuple(sorted(tools))
        self.high = high
        self.attempts = attempts

    def holds(self, s: EarlyState) -> bool:
        return (s.tried(self.tools) if self.attempts else s.ok(self.tools)) > self.high


class _Precedes(Condition):
    """A successful ``then`` call with no successful ``first`` call started before it."""

    __slots__ = ("anywhere", "by_turn", "first", "then")

    def __init__(self, first: ck.Tools, then: ck.Tools, scoped: bool) -> None:
        self.first = tuple(sorted(first))
        self.then = tuple(sorted(then))
        # A scope cuts the ``first`` calls before its opening off; reordering may move them.
        self.anywhere = scoped or _handoff_named(first)
        # A handoff call is no tool step: the earliest ``then`` call may not be the one a fail names.
        self.by_turn = not _handoff_named(then)

    def holds(self, s: EarlyState) -> bool:
        if s.hidden_calls:
            # A call whose name was not captured may be the ``first`` call: unless a tool span in
            # its turn accounts for it, which spans still to come decide, the final verdict is
            # indeterminate (the trajectory is incomplete), so no fail is certain before it.
            return False
        found, at = s.first_ok(self.then)
        if not found:
            return False
        if self.anywhere or s.reordered:
            return True
        # In start order, the failing call is the earliest successful ``then`` call: its
        # failure stands once its turn is over.
        first_found, first_at = s.first_ok(self.first)
        return (not first_found or at <= first_at) and (not self.by_turn or s.turn_over(self.then, at))


class _Budget(Condition):
    """A budget crossed by the counts so far (a limit this does not know: always). The limits
    are read into fields once (no limit: infinity), as this runs on every request."""

    __slots__ = ("max_duration_ms", "max_llm_calls", "max_steps", "max_tokens", "max_tool_calls", "max_tool_errors",
                 "unknown")  # fmt: skip

    def __init__(self, limits: Mapping[str, float]) -> None:
        self.max_steps = float(limits.get("max_steps", math.inf))
        self.max_tool_calls = float(limits.get("max_tool_calls", math.inf))
        self.max_llm_calls = float(limits.get("max_llm_calls", math.inf))
        self.max_tool_errors = float(limits.get("max_tool_errors", math.inf))
        self.max_tokens = float(limits.get("max_tokens", math.inf))
        self.max_duration_ms = float(limits.get("max_duration_ms", math.inf))
        self.unknown = not _BUDGET_LIMITS.issuperset(limits)

    def holds(self, s: EarlyState) -> bool:
        return (
            self.unknown or s.spans > self.max_steps or s.tool_spans > self.max_tool_calls
            or s.llm_spans > self.max_llm_calls or s.tool_errors > self.max_tool_errors or s.tokens > self.max_tokens
            or (s.spans > 0 and (s.end - s.start) / 1e6 > self.max_duration_ms)
        )  # fmt: skip


_BUDGET_LIMITS: Final = frozenset(
    {"max_steps", "max_tool_calls", "max_llm_calls", "max_tool_errors", "max_tokens", "max_duration_ms"}
)


class _Scoped(Condition):
    """``inner``, where the invariant may apply: its ``applies_to`` globs hold whatever the root."""

    __slots__ = ("applies", "inner")

    def __init__(self, inner: Condition, applies: tuple[Glob, ...]) -> None:
        self.inner = inner
        self.applies = applies

    def holds(self, s: EarlyState) -> bool:
        if not self.inner.holds(s):
            return False
        for glob in self.applies:  # noqa: SIM110 (a loop: any() over a generator takes twice as long)
            if not glob.matches_in_flight(s.services):
                return False
        return True


@dataclass(frozen=True, slots=True)
class _Rule:
    key: tuple[str, str]  # (policy, invariant), as reported
    check: ck.Check
    may_fail: Condition
    applies: tuple[Glob, ...]  # the policy's and the invariant's applies_to


class EarlyWatch:
    """The early invariants of a set of policies, and when each may fail on a trace in flight."""

    __slots__ = ("_by_key", "rules", "watched")

    def __init__(self, policies: Sequence[CompiledPolicy]) -> None:
        self.rules = [
            _rule(p, inv) for p in policies for inv in p.early_invariants
        ]
        self._by_key = {rule.key: rule for rule in self.rules}
        self.watched = frozenset(
            name
            for rule in self.rules
            for attr in ("tools", "first", "then")
            for name in getattr(rule.check, attr, frozenset[str]())
        )

    def state(self, arrived: Container[str] | None = None) -> EarlyState:
        """Counters for a trace in flight; ``arrived``: the ids of its spans taken so far, kept
        up to date by their owner (the assembler's), if any."""
        return EarlyState(self.watched, arrived)

    def may_fail(
        self, state: EarlyState, reported: set[tuple[str, str]] | frozenset[tuple[str, str]]
    ) -> list[tuple[str, str]]:
        """The early invariants not yet reported for the trace that may fail on what it holds
        now, as (policy, invariant) keys: only those need checking on its partial trajectory."""
        out: list[tuple[str, str]] = []
        if state.unsettled:
            return out
        for rule in self.rules:  # one loop: this runs for every trace a request touches
            if (not reported or rule.key not in reported) and rule.may_fail.holds(state):
                out.append(rule.key)
        return out

    def stands(self, verdict: Verdict, partial: Trajectory, services: Collection[str]) -> bool:
        """Whether an early failure found on ``partial`` (of spans from ``services``) is certain
        now. Its ``applies_to`` globs must hold whatever the root (``Glob.matches_in_flight``). For
        ``precedes``, a ``first`` call started before the failing ``then`` call but running
        beside it (a turn of parallel calls) ends later, so it arrives later: the failure
        stands once the ``then`` call's turn is over, that is once the span its turn runs under
        has arrived (it ends after all its children) or a model call under that span started
        after the call ended (an agent asks the model again once its calls have returned). That
        span is the nearest above the call that model calls run under (a span between, as an
        HTTP client span around a remote tool's, ends with that one call), else its parent if
        that is an agent's; until it is known, the failure waits. O(steps), for a failure found."""
        rule = self._by_key.get((verdict.policy, verdict.invariant))
        if rule is None:
            return True  # no rule of these policies: nothing known against it
        if rule.applies and not all(g.matches_in_flight(services) for g in rule.applies):
            return False
        if not isinstance(rule.check, ck.Precedes):
            return True
        call = next((st for st in partial.steps if st.span_id == verdict.span_id and st.source == "span"), None)
        if call is None:
            return False
        turn = _turn_span(call, partial.steps)
        if turn is None:
            return False
        for st in partial.steps:
            if st.span_id == turn or (st.kind == "llm" and st.parent_span_id == turn and st.start_ns >= call.end_ns):
                return True
        return False


def _turn_span(call: Step, steps: list[Step]) -> str | None:
    """The id of the span ``call``'s turn runs under (see ``EarlyWatch.stands``), or None while
    the spans above it that would say have not arrived."""
    asking = {st.parent_span_id for st in steps if st.kind == "llm"}
    by_id = {st.span_id: st for st in steps if st.source == "span"}
    span_id = call.parent_span_id
    for _ in range(len(steps)):
        if span_id is None:
            break
        if span_id in asking:
            return span_id
        above = by_id.get(span_id)
        if above is None:
            break
        span_id = above.parent_span_id
    parent = by_id.get(call.parent_span_id or "")
    return parent.span_id if parent is not None and parent.kind == "agent" else None


def in_flight(partial: Trajectory) -> Trajectory:
    """``partial`` (a trajectory built from the spans of a trace in flight) less the steps and
    counts that spans still to come may change, so that its failures are the final verdict's:
    tool calls only a model's output shows (a tool span may still show one failed, or that the
    trace records its tool calls as spans: then requests are no steps), ``transfer_to_<agent>``
    calls not yet turned into handoffs (the agent may still arrive), and the tokens of a model
    call whose parent span has not arrived (a framework's span around it takes over its count).
    Changes ``partial`` in place and returns it."""
    arrived = {st.span_id for st in partial.steps}
    kept: list[Step] = []
    for st in partial.steps:
        if st.source != "span" or (st.kind == "tool" and st.name.startswith(TRANSFER_PREFIX)):
            continue
        if st.kind == "llm" and st.parent_span_id is not None and st.parent_span_id not in arrived:
            st.tokens = None
        st.index = len(kept)
        kept.append(st)
    partial.steps = kept
    return partial


def new_early_failures(
    policies: Sequence[CompiledPolicy], partial: Trajectory, reported: set[tuple[str, str]],
    only: frozenset[tuple[str, str]] | None, watch: EarlyWatch, services: Collection[str],
) -> list[Verdict]:
    """The early failures on ``partial`` (of spans from ``services``, of the invariants in
    ``only``) that stand and are not yet in ``reported``, added to it: each invariant is
    reported once per trace."""
    new: list[Verdict] = []
    for policy in policies:
        for v in policy.early_failures(partial, only):
            key = (v.policy, v.invariant)
            if key not in reported and watch.stands(v, partial, services):
                reported.add(key)
                new.append(v)
    return new


def _rule(policy: CompiledPolicy, inv: CompiledInvariant) -> _Rule:
    may_fail = _may_fail(inv.check, scoped=inv.scope is not None)
    applies = tuple(g for g in (policy.applies, inv.applies) if g is not None)
    if applies:  # only where it may apply: else the partial trajectory is built for nothing
        may_fail = _Scoped(may_fail, applies)
    return _Rule((policy.name, inv.id), inv.check, may_fail, applies)


def _handoff_named(tools: frozenset[str] | tuple[()]) -> bool:
    # The names build_trajectory may turn into agent steps (handoff tools, transfer_to_<agent>).
    return any(t in HANDOFF_TOOLS or t.startswith(TRANSFER_PREFIX) for t in tools)


def _may_fail(check: ck.Check, *, scoped: bool) -> Condition:
    """The necessary condition of a fail of ``check`` (see the module docstring), made once."""
    if isinstance(check, ck.NeverCall):
        return _CallsOver(check.tools, 0, check.attempts)
    if isinstance(check, ck.CallCount):
        return _Never() if check.high is None else _CallsOver(check.tools, check.high, False)
    if isinstance(check, ck.Precedes):
        return _Precedes(check.first, check.then, scoped)
    if isinstance(check, ck.Budget):
        return _Budget(check.limits)
    return Condition()
