"""Order the normalised spans of one trace or session into a trajectory of steps."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Final

from otel_plumb.model.span import SPAN_KIND_CLIENT, SPAN_KIND_SERVER
from otel_plumb.model.trajectory import (
    ATTRIBUTES_DROPPED,
    HANDOFF_TOOLS,
    MISSING_PARENT,
    TOOL_CALLS_NOT_CAPTURED,
    TRANSFER_PREFIX,
    UNRECOGNISED_SPANS,
    CaptureStatus,
    NormalisedSpan,
    RequestedCall,
    Step,
    Trajectory,
)
from otel_plumb.normalise.common import merge_tool_results
from otel_plumb.normalise.hints import CAPTURE_HINTS
from otel_plumb.normalise.values import Decoded

# Unrecognised spans named in the problem line, at most.
_NAMED: Final = 5


def build_trajectory(
    key: str,
    spans: Iterable[NormalisedSpan],
    *,
    complete: bool = True,
    incomplete_reason: str | None = None,
    session_id: str | None = None,
) -> Trajectory:
    spans = list(spans)
    by_id = {s.span_id: s for s in spans}
    # Parents start no later than their children; ties are broken by depth so a parent
    # always precedes its child, then by end time and id for a stable order. Start times are
    # usually all different: then they alone give that order, and the depths are worked out
    # only if requested calls need them.
    depth: dict[str, int] | None = None
    if _sort_by_start(spans):
        tied = depth = _depths(spans, by_id)
        spans.sort(key=lambda s: (s.start_ns, tied[s.span_id], s.end_ns, s.span_id))

    problems: list[str] = []
    # Each trace needs its own root (a session joins several traces, each with one).
    tops_by_trace: dict[str, list[NormalisedSpan]] = {}
    # Tool results given back to the model, by tool-call id: the value, or a Decoded for one not
    # captured (see normalise.values.given_result).
    results_by_call_id: dict[str, object] = {}
    # Span steps come in span order; steps for requested calls are merged in by their own key.
    steps: list[Step] = []
    tool_steps: list[Step] = []
    # Spans with tool calls the model asked for, and how many span steps are agents and models.
    asking: list[NormalisedSpan] = []
    agent_spans = llm_spans = 0
    # Model calls that asked for tools none of which were captured (content capture off).
    hidden: list[NormalisedSpan] = []
    # Spans that look like an agent's but follow no convention read here: tool calls may be in them.
    unrecognised: list[NormalisedSpan] = []
    # Spans the SDK dropped attributes or events from.
    cut = False
    # The traces in order of their first span, the last end, the first session named.
    trace_ids_seen: dict[str, None] = {}
    last_trace: str | None = None
    end_ns = 0
    first_session: str | None = None
    # One pass over the spans (this runs once per span): what later passes need is noted here,
    # so that a trace without model or tool calls (HTTP and database traffic) takes no other.
    # (Loops, not generators: this is compiled, where a generator costs a call per item.)
    for s in spans:
        if s.trace_id is not last_trace:  # a trace's spans share one string (the assembler's)
            last_trace = s.trace_id
            trace_ids_seen[last_trace] = None
        if s.end_ns > end_ns:
            end_ns = s.end_ns
        if first_session is None and s.session_id:
            first_session = s.session_id
        if s.problems:
            problems.extend(s.problems)
        # A top span: no parent, or a parent not in the trace (a parent in another trace of the
        # session is not this span's parent either).
        parent = by_id.get(s.parent_span_id or "")
        if parent is None or parent.trace_id != s.trace_id:
            tops_by_trace.setdefault(s.trace_id, []).append(s)
        if s.tool_results:
            merge_tool_results(results_by_call_id, s.tool_results)
        if s.requested_calls:
            asking.append(s)
        step = _span_step(s)
        steps.append(step)
        kind = step.kind
        if kind == "tool":
            tool_steps.append(step)
        elif kind == "llm":
            llm_spans += 1
        elif kind == "agent":
            agent_spans += 1
        if s.hidden_tool_calls:
            hidden.append(s)
        if s.convention == "unrecognised":
            unrecognised.append(s)
        if s.cut:
            cut = True
    trace_ids = list(trace_ids_seen)
    roots = [_root(tops) for tops in tops_by_trace.values()]
    root = roots[0] if roots else None
    # A trace with no top span at all is a loop of parent links: no root either.
    if complete and (not roots or len(roots) < len(trace_ids) or any(r is None for r in roots)):
        complete, incomplete_reason = False, "no_root"
    for r, tops in zip(roots, tops_by_trace.values(), strict=True):
        if r is None:
            continue
        if r.parent_span_id is not None:
            problems.append(f"root span {r.span_id} has a parent {r.parent_span_id} not in the trace")
        if len(tops) > 1:
            # Any other top span lost its parent: part of the trace is missing.
            problems.extend(_missing_parent_problems([s for s in tops if s is not r]))
            if complete:
                complete, incomplete_reason = False, MISSING_PARENT

    tool_steps_by_call_id: dict[str, Step] = {}
    without_id: dict[str, list[Step]] = {}
    for step in tool_steps:
        if step.tool_call_id:
            tool_steps_by_call_id[step.tool_call_id] = step
            if step.result_status == "absent" and step.tool_call_id in results_by_call_id:
                step.result, step.result_status = _given(results_by_call_id[step.tool_call_id])
        elif step.tool_call_id is None:
            without_id.setdefault(step.name, []).append(step)
    # Tool calls the model requested: matched to tool spans by tool-call id (never doubled), or,
    # for tool spans that record no id, by name to the request of the turn each span runs in
    # (``_match_by_name``); when the trace has no tool spans at all, they become steps of their own.
    turns: _Turns | None = None
    pending: list[tuple[NormalisedSpan, int, RequestedCall]] = []
    for s in asking:
        for n, call in enumerate(s.requested_calls):
            matched = tool_steps_by_call_id.get(call.tool_call_id or "")
            if matched is None:
                pending.append((s, n, call))
            elif _better_args(matched, call):
                matched.args, matched.args_status, matched.args_source = call.args, "captured", "llm_output"
    if pending and without_id:
        turns = _Turns(spans, by_id)
        pending = _match_by_name(pending, without_id, turns, problems)
    requested: list[tuple[tuple[int, int, int, str], Step]] = []
    for s, n, call in pending:
        if tool_steps:
            problems.append(f"tool call {call.name!r} requested in span {s.span_id} has no tool span")
            continue
        step = _requested_step(s, call, results_by_call_id)
        if depth is None:
            depth = _depths(spans, by_id)
        requested.append(((s.end_ns, depth[s.span_id] + 1, n, s.span_id), step))

    clocks = _clocks(steps, by_id)
    start_bounds = _start_bounds(steps, by_id, clocks, [r for r in roots if r is not None]) if clocks else {}
    # First: a span cut may be why another is hidden or unrecognised (its problem line says which).
    if cut and complete:
        complete, incomplete_reason = False, ATTRIBUTES_DROPPED
    if hidden:
        if turns is None:
            turns = _Turns(spans, by_id)
        uncovered = _uncovered_requests(hidden, tool_steps, spans, turns, clocks, start_bounds)
        if uncovered:
            problems.extend(_hidden_calls_problems(uncovered))
            if complete:
                complete, incomplete_reason = False, TOOL_CALLS_NOT_CAPTURED

    if unrecognised:
        problems = list(dict.fromkeys(problems))  # one line per unrecognised span shape, not per span
        problems.append(_unrecognised_problem(unrecognised))
        if complete:
            complete, incomplete_reason = False, UNRECOGNISED_SPANS

    if requested:
        assert depth is not None  # worked out for the first requested step
        drafts = [((s.start_ns, depth[s.span_id], s.end_ns, s.span_id), st) for s, st in zip(spans, steps, strict=True)]
        drafts.extend(requested)
        drafts.sort(key=lambda d: d[0])
        steps = [step for _, step in drafts]
    # Before anything else reads the order: the places of parallel calls, which nested records merge.
    if start_bounds:
        steps = _across_clocks(steps, clocks, start_bounds)
    if llm_spans:
        _merge_nested_model_calls(steps)
    if len(tool_steps) > 1:
        _merge_nested_tool_calls(steps, by_id)
    if len(tool_steps) > 1 or llm_spans > 1:
        _merge_calls_recorded_twice(steps, by_id)
    if asking:
        _order_parallel_calls(steps, asking, clocks)
    if tool_steps or requested:  # a handoff is a tool call, and may name the agent steps inherit
        _delegations_and_handoffs(steps, by_id)
        _assign_agents(steps, by_id)
    elif agent_spans:
        _assign_agents(steps, by_id)
    for i, step in enumerate(steps):
        step.index = i

    attributes: dict[str, object] = {}
    ordered = ([root] if root is not None else []) + [s for s in spans if s is not root]
    last: dict[str, object] | None = None
    for s in ordered:
        a = s.attributes
        if a is last:
            continue  # the usual case (one resource's attributes, shared by its spans): nothing new
        last = a
        # Key by key: a span keeps a few (a subset test of the keys costs more than the lookups).
        for k, v in a.items():
            if k not in attributes:
                attributes[k] = v
    agent = _agent_of(steps)
    service = attributes.get("service.name")
    return Trajectory(
        key=key,
        trace_ids=trace_ids,
        steps=steps,
        complete=complete,
        incomplete_reason=None if complete else incomplete_reason,
        root_span_id=root.span_id if root is not None else None,
        service=str(service) if service is not None else None,
        agent=agent,
        session_id=session_id or first_session,
        start_ns=spans[0].start_ns if spans else 0,  # sorted by start time
        end_ns=end_ns,
        span_count=len(spans),
        attributes=attributes,
        problems=problems,
        clocks=clocks,
        start_bounds=start_bounds,
    )


def _clocks(steps: list[Step], by_id: dict[str, NormalisedSpan]) -> dict[str, str]:
    """The clock of each step's span, by span id, when the steps were timed by more than one;
    else empty (the usual case, found in one pass that builds nothing). A clock is a host's (its
    ``host.name`` or ``host.id``); a process naming no host is taken to have a clock of its own
    (``service.name`` and ``service.instance.id``)."""
    spans = [span for st in steps if (span := by_id.get(st.span_id)) is not None]
    first: str | None = None
    last: object = None
    for span in spans:
        a = span.attributes
        if a is last:  # most steps share their resource's attributes
            continue
        last = a
        clock = _clock_of(a)
        if first is None:
            first = clock
        elif clock != first:
            break
    else:
        return {}
    return {span.span_id: _clock_of(span.attributes) for span in spans}


def _clock_of(attributes: dict[str, object]) -> str:
    """The clock that timed spans with these (resource) attributes, named for messages."""
    host = attributes.get("host.name") or attributes.get("host.id")
    if host:
        return f"host {host}"
    service = attributes.get("service.name") or "unknown_service"
    instance = attributes.get("service.instance.id")
    return f"{service} (instance {instance})" if instance else str(service)


def _start_bounds(
    steps: list[Step], by_id: dict[str, NormalisedSpan], clocks: dict[str, str], roots: list[NormalisedSpan]
) -> dict[str, tuple[int, int | None]]:
    """For the steps timed by another clock than their trace's agent's (the trace's root
    span's, else its first step's): when each started by the agent's clock, as far as the trace
    shows (``Trajectory.start_bounds``, ``_start_bound``), by span id. (The traces of a session
    are not bounded by one another: each by its own agent's clock.)"""
    clock_of: dict[int, str] = {}  # by the resource attributes the spans of a process share

    def clock(span: NormalisedSpan) -> str:
        found = clock_of.get(id(span.attributes))
        if found is None:
            found = clock_of[id(span.attributes)] = _clock_of(span.attributes)
        return found

    own = {r.trace_id: clock(r) for r in roots}
    bounds: dict[str, tuple[int, int | None]] = {}
    for st in steps:
        at = clocks[st.span_id]
        if own.setdefault(st.trace_id, at) != at and st.span_id not in bounds:
            bounds[st.span_id] = _start_bound(by_id[st.span_id], by_id, own[st.trace_id], clock)
    return bounds


def _across_clocks(steps: list[Step], clocks: dict[str, str], bounds: dict[str, tuple[int, int | None]]) -> list[Step]:
    """The steps in an order their ``bounds`` allow (``_start_bounds``: those of a step timed
    by another clock than its trace's agent's). The steps of a trace timed by another clock
    keep their order and are moved by the one shift closest to none that puts them all within
    their bounds (none when their times are within them already: then the order is left as it
    is), and merged with the others. The shift gives one order the trace allows, not the skew:
    a check whose verdict turns on the order tries the others (``check.checks.over_orders``)."""
    agents: list[Step] = []  # the steps each timed by its trace's agent's clock
    others: dict[tuple[str, str], list[Step]] = {}  # the others, by trace and clock
    for st in steps:
        if st.span_id in bounds:
            others.setdefault((st.trace_id, clocks[st.span_id]), []).append(st)
        else:
            agents.append(st)
    shifted = False
    keyed = [_in_order([(st.start_ns, st) for st in agents], 0)]
    for on_clock in others.values():
        shift = _shift(on_clock, bounds)
        keys: list[tuple[int, Step]] = []
        for st in on_clock:
            lo, hi = bounds[st.span_id]
            key = st.start_ns + shift
            key = max(key, lo + 1) if hi is None else min(max(key, lo + 1), hi - 1)
            shifted = shifted or key != st.start_ns
            keys.append((key, st))
        keyed.append(_in_order(keys, 1))
    if not shifted:
        return steps
    return [st for _, _, st in heapq.merge(*keyed, key=lambda k: (k[0], k[1]))]


def _in_order(keys: list[tuple[int, Step]], rank: int) -> list[tuple[int, int, Step]]:
    """Merge keys that keep the steps' order (a clock's steps stay in their own order), ranked
    after those of lower ``rank`` at the same time."""
    out: list[tuple[int, int, Step]] = []
    last = 0
    for key, st in keys:
        last = max(last, key)
        out.append((last, rank, st))
    return out


def _start_bound(
    span: NormalisedSpan, by_id: dict[str, NormalisedSpan], own: str, clock: Callable[[NormalisedSpan], str]
) -> tuple[int, int | None]:
    """When ``span`` started by the ``own`` clock: after the nearest span of that clock above it
    started, and, if every hop to it is a CLIENT span over a SERVER span (a call waited for),
    before that span ended; (0, None) when there is none."""
    waited = True
    cur = span
    for _ in range(len(by_id)):
        parent = by_id.get(cur.parent_span_id) if cur.parent_span_id is not None else None
        if parent is None:
            break
        if clock(parent) != clock(cur):
            waited = waited and cur.span_kind == SPAN_KIND_SERVER and parent.span_kind == SPAN_KIND_CLIENT
            if clock(parent) == own:
                return parent.start_ns, parent.end_ns if waited else None
        cur = parent
    return 0, None


def _shift(on_clock: list[Step], bounds: dict[str, tuple[int, int | None]]) -> int:
    """The shift closest to none that puts every step of one clock within its bounds (the
    smallest one above them all when none fits: the clock ran at another rate)."""
    least, most = -(1 << 62), 1 << 62
    for st in on_clock:
        lo, hi = bounds[st.span_id]
        least = max(least, lo + 1 - st.start_ns)
        if hi is not None:
            most = min(most, hi - 1 - st.start_ns)
    return least if least > 0 or least > most else min(0, most)


def _agent_of(steps: list[Step]) -> str | None:
    """The first agent step's name, else the first agent a step was assigned."""
    for step in steps:
        if step.kind == "agent":
            return step.name
    for step in steps:
        if step.agent:
            return step.agent
    return None


def _uncovered_requests(
    hidden: list[NormalisedSpan],
    tool_steps: list[Step],
    spans: list[NormalisedSpan],
    turns: _Turns,
    clocks: dict[str, str],
    bounds: dict[str, tuple[int, int | None]],
) -> list[NormalisedSpan]:
    """The hidden requests nothing in the trace accounts for: no tool span of its trace starts
    in the request's turn (once it ended, before the next model call under the same parent:
    a tool span after that may answer the later request, and this one's calls, any tools, be
    lost), and the model call is not recorded a second time (a framework's span around the
    client library's, parent or child) with the calls named. A tool span timed by another
    clock than the request's counts only if its ``bounds`` put its start in the turn for sure."""
    tool_starts: dict[tuple[str, str], list[int]] = {}  # by trace and clock
    bounded: dict[str, list[tuple[int, int | None]]] = {}  # by trace: the bounds of those of other clocks
    for step in tool_steps:  # in start order, on each clock
        tool_starts.setdefault((step.trace_id, clocks.get(step.span_id, "")), []).append(step.start_ns)
        b = bounds.get(step.span_id)
        if b is not None:
            bounded.setdefault(step.trace_id, []).append(b)
    late: list[NormalisedSpan] = []
    for s in hidden:
        after = turns.next_model_call(s)
        starts = tool_starts.get((s.trace_id, clocks.get(s.span_id, "")))
        i = bisect.bisect_left(starts, s.end_ns) if starts else 0
        if starts and i < len(starts) and (after is None or starts[i] < after):
            continue
        if s.span_id not in bounds and any(
            lo >= s.end_ns and (after is None or (hi is not None and hi <= after))
            for lo, hi in bounded.get(s.trace_id, ())
        ):  # fmt: skip
            continue
        late.append(s)
    if not late:
        return late
    named = {s.span_id for s in spans if s.kind == "llm" and s.requested_calls}
    named_parents = {turns.by_id[s].parent_span_id for s in named}
    return [s for s in late if s.parent_span_id not in named and s.span_id not in named_parents]


_MAX_NAMED: Final = 5


def _unrecognised_problem(spans: list[NormalisedSpan]) -> str:
    names = list(dict.fromkeys(s.span_name for s in spans))
    more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
    shown = ", ".join(repr(n) for n in names[:_NAMED]) + more
    return (
        f"{len(spans)} span(s) look like an agent framework's but follow no convention otel-plumb reads "
        f"({shown}): tool calls may be hidden in them, so checks on which tools were called are indeterminate"
    )


def _missing_parent_problems(orphans: list[NormalisedSpan]) -> list[str]:
    """One line per missing parent, naming (some of) the spans that point at it."""
    by_parent: dict[str | None, list[NormalisedSpan]] = {}
    for s in orphans:
        by_parent.setdefault(s.parent_span_id, []).append(s)
    lines = []
    for parent, group in by_parent.items():
        where = ", ".join(f"{s.span_id} ({s.span_name})" for s in group[:_MAX_NAMED])
        more = f" and {len(group) - _MAX_NAMED} more" if len(group) > _MAX_NAMED else ""
        noun = "spans" if len(group) > 1 else "span"
        lines.append(f"parent span {parent} of {noun} {where}{more} is not in the trace: part of the trace is missing")
    return lines


def _hidden_calls_problems(spans: list[NormalisedSpan]) -> list[str]:
    """One line per convention: which model calls asked for tools the trace does not show, and
    how to make that instrumentation record them."""
    by_convention: dict[str, list[NormalisedSpan]] = {}
    for s in spans:
        by_convention.setdefault(s.convention, []).append(s)
    lines = []
    for convention, group in by_convention.items():
        where = ", ".join(f"{s.span_id} ({s.span_name})" for s in group[:_MAX_NAMED])
        where += f" and {len(group) - _MAX_NAMED} more" if len(group) > _MAX_NAMED else ""
        hint = CAPTURE_HINTS.get(convention) or CAPTURE_HINTS["unknown"]
        lines.append(
            f"tool calls requested but not captured (no call names, no tool span in the request's turn) in "
            f"span{'s' if len(group) > 1 else ''} {where}; to capture them, {hint}"
        )
    return lines


_start: Final = attrgetter("start_ns")


def _sort_by_start(spans: list[NormalisedSpan]) -> bool:
    """Sorts ``spans`` by start time, in place and stable (as ``spans.sort(key=_start)``), and
    says whether two of them start at the same time. Spans come nearly in start order (each is
    sent when it ends: a parent after its children, a trace's root last), so an insertion sort
    moves few of them, comparing the times where they are (the list sort would box each as a
    Python int and compare those); past a budget of moves, linear in the spans, the list sort
    takes over."""
    budget = 4 * len(spans) + 16
    for i in range(1, len(spans)):
        span = spans[i]
        start = span.start_ns
        j = i
        while j > 0 and spans[j - 1].start_ns > start:
            j -= 1
        if j != i:
            budget -= i - j
            if budget < 0:
                spans.sort(key=_start)
                break
            del spans[i]
            spans.insert(j, span)
    for i in range(1, len(spans)):  # noqa: SIM110 (any() over a generator, compiled, is slower)
        if spans[i].start_ns == spans[i - 1].start_ns:
            return True
    return False


def _depths(spans: list[NormalisedSpan], by_id: dict[str, NormalisedSpan]) -> dict[str, int]:
    depth: dict[str, int] = {}
    for s in spans:
        # The usual cases first, without a chain: a top span, or a parent already placed.
        if s.span_id in depth:
            continue
        parent = s.parent_span_id
        if parent is None or parent not in by_id:
            depth[s.span_id] = 0
            continue
        parent_depth = depth.get(parent)
        if parent_depth is not None:
            depth[s.span_id] = parent_depth + 1
            continue
        chain: list[NormalisedSpan] = []
        cur: NormalisedSpan | None = s
        while cur is not None and cur.span_id not in depth and len(chain) <= len(by_id):
            chain.append(cur)
            cur = by_id.get(cur.parent_span_id) if cur.parent_span_id else None
        base = depth[cur.span_id] if cur is not None and cur.span_id in depth else -1
        for c in reversed(chain):
            base += 1
            depth[c.span_id] = base
    return depth


def plain_trajectory(
    key: str, spans: list[NormalisedSpan], *, complete: bool, incomplete_reason: str | None,
    names_tool: Callable[[str], bool],
) -> Trajectory | None:  # fmt: skip
    """The trajectory of one trace that is plainly no agent's run (HTTP, database and application
    spans, all with no problems, session or framework, under one root that names its service),
    without its steps or attributes; None for any other trace, which ``build_trajectory`` builds.
    ``names_tool``: whether a span name may name a tool some policy checks (such a span may hide
    that tool's call: the trace is built in full, so that the policy can say so).

    Every other field is the one ``build_trajectory`` gives (a property test holds them equal),
    and so is every decision on it: no policy applies to a trace with no agent span and no such
    name. Nothing reads a trajectory's steps or attributes when no policy applied (it is
    counted and forwarded as it came; redaction looks for its paths in captured arguments and
    results, which such spans have none of), and building them, for every HTTP and database span a
    gateway sees, was most of the cost of deciding its traces. O(spans)."""
    if not spans:
        return None
    root: NormalisedSpan | None = None
    span_ids: set[str] = set()
    start_ns, end_ns = spans[0].start_ns, 0
    for s in spans:
        if (
            s.kind != "other" or s.convention != "unknown" or s.framework is not None or s.problems
            or s.session_id is not None or names_tool(s.name)
        ):  # fmt: skip
            return None
        if s.parent_span_id is None:
            if root is not None:
                return None  # two roots: the problem lines say which
            root = s
        span_ids.add(s.span_id)
        if s.end_ns > end_ns:
            end_ns = s.end_ns
        if s.start_ns < start_ns:
            start_ns = s.start_ns
    if root is None:
        return None
    service = root.attributes.get("service.name")
    if service is None:
        return None  # then the first span in start order naming one names it
    for s in spans:
        if s is not root and s.parent_span_id not in span_ids:
            return None  # a missing parent: the problem lines say which
    return Trajectory(
        key=key,
        trace_ids=[root.trace_id],
        steps=[],
        complete=complete,
        incomplete_reason=None if complete else incomplete_reason,
        root_span_id=root.span_id,
        service=str(service),
        start_ns=start_ns,
        end_ns=end_ns,
        span_count=len(spans),
    )


def _root(tops: list[NormalisedSpan]) -> NormalisedSpan | None:
    """The trace's root: its parentless span, or a single top span whose parent is remote."""
    parentless = [s for s in tops if s.parent_span_id is None]
    if len(parentless) == 1:
        return parentless[0]
    if not parentless and len(tops) == 1:
        return tops[0]
    return None


def _span_step(s: NormalisedSpan) -> Step:
    # Positional (in Step's field order): this runs once per span.
    return Step(
        0,
        s.kind,
        s.name,
        s.span_id,
        s.parent_span_id,
        s.trace_id,
        s.start_ns,
        s.end_ns,
        s.convention,
        "span",
        s.args,
        s.args_status,
        s.args_source,
        s.result,
        s.result_status,
        s.error,
        s.agent,
        s.tool_call_id,
        s.tokens,
        s.framework,
        s.outcome_recorded,
    )


class _Turns:
    """The model calls of a trace by turn parent, in start order: an agent asks the model again
    once the tool calls of its previous turn have returned, so a model call under the same
    parent that starts after a request ended closes that request's turn. The turn parent is the
    span's parent, or for a model call recorded twice (a framework's span around the client
    library's), its outer record's parent."""

    def __init__(self, spans: list[NormalisedSpan], by_id: dict[str, NormalisedSpan]) -> None:
        self.by_id = by_id
        self.starts: dict[str | None, list[int]] = {}
        for s in spans:  # in start order
            if s.kind == "llm":
                self.starts.setdefault(self.parent(s), []).append(s.start_ns)

    def parent(self, s: NormalisedSpan) -> str | None:
        parent = s.parent_span_id
        hops = 0
        while parent is not None and hops <= len(self.by_id):
            p = self.by_id.get(parent)
            if p is None or p.kind != "llm":
                break
            parent = p.parent_span_id
            hops += 1
        return parent

    def next_model_call(self, s: NormalisedSpan) -> int | None:
        """When the first model call under ``s``'s turn parent that starts once ``s`` ended
        starts (not ``s`` itself, were it to last no time); None if there is none."""
        starts = self.starts.get(self.parent(s))
        if not starts:
            return None
        i = bisect.bisect_left(starts, s.end_ns)
        if s.kind == "llm" and s.start_ns == s.end_ns:
            i += 1  # s itself, at its own end
        return starts[i] if i < len(starts) else None


def _match_by_name(
    pending: list[tuple[NormalisedSpan, int, RequestedCall]],
    without_id: dict[str, list[Step]],
    turns: _Turns,
    problems: list[str],
) -> list[tuple[NormalisedSpan, int, RequestedCall]]:
    """Matches tool spans that record no tool-call id to the requests (not matched by id) of
    the same name, and returns the requests left unmatched, in their order. A span belongs to
    the latest request of its name that ended before it started: an earlier one's span, if it
    ran, ran in that earlier turn (and may be missing). The span takes that request's arguments
    only when no other request it could answer asked for different ones: one of several calls
    of that name in the turn (parallel calls start in any order), or of a request whose turn is
    not over (no model call under the same parent since: another agent's, running beside).
    Otherwise its arguments stay as the span has them, so argument checks are indeterminate
    rather than decided on a guess."""
    by_name: dict[str, list[int]] = {}
    for i, (_, _, call) in enumerate(pending):
        if call.name in without_id:
            by_name.setdefault(call.name, []).append(i)
    claimed: set[int] = set()
    contested: set[int] = set()
    for name, order in by_name.items():
        order.sort(key=lambda i: pending[i][0].end_ns)  # stable: request order within a span
        ends = [pending[i][0].end_ns for i in order]
        # Requests ended before the span at hand, neither claimed nor in a turn over before it
        # started: spans come in start order, so a request claimed or closed stays out, and each
        # request is looked at O(1) times in a sequence of turns (not once per later span).
        open_requests: list[int] = []
        added = 0
        for step in without_id[name]:  # in start order
            cut = bisect.bisect_right(ends, step.start_ns)
            if not cut:
                continue  # no request of that name ended before it started
            open_requests.extend(order[added:cut])
            added = max(added, cut)
            latest = pending[order[cut - 1]][0]
            own: list[int] = []
            rivals: list[int] = []
            still_open: list[int] = []
            for i in open_requests:
                if i in claimed:
                    continue
                s = pending[i][0]
                if s is latest:
                    own.append(i)
                    still_open.append(i)
                else:
                    after = turns.next_model_call(s)
                    if after is None or after > step.start_ns:
                        rivals.append(i)
                        still_open.append(i)
            open_requests = still_open
            if not own:
                continue  # the latest turn's calls of that name have their spans: one more
            claimed.add(own[0])
            call = pending[own[0]][2]
            others = [pending[i][2] for i in own[1:] + rivals]
            # A request an earlier span may have answered (contested) is no surer for this one.
            if own[0] in contested or any(c.args_status != call.args_status or c.args != call.args for c in others):
                contested.update(own)
                contested.update(rivals)
                where = ", ".join(sorted({pending[i][0].span_id for i in own + rivals}))
                problems.append(
                    f"tool span {step.span_id} ({name}) records no tool-call id and may answer more than one "
                    f"request (in span(s) {where}): its arguments are not taken from any"
                )
            elif _better_args(step, call):
                step.args, step.args_status, step.args_source = call.args, "captured", "llm_output"
    return [p for i, p in enumerate(pending) if i not in claimed]


def _better_args(step: Step, call: RequestedCall | Step) -> bool:
    """The model's request (or another record of the call) fills in a tool span's arguments when
    the span has none, or only a bare value (LangChain records a one-argument tool's input
    without its name)."""
    if call.args_status != "captured":
        return False
    if step.args_status != "captured":
        return True
    return not isinstance(step.args, dict) and isinstance(call.args, dict)


def _given(result: object) -> tuple[object, CaptureStatus]:
    """A result given back to the model -> the step's result and result_status: one not captured
    keeps its status (redacted, undecodable), so checks on it are indeterminate, not a null."""
    if type(result) is Decoded:
        return None, result.status
    return result, "captured"


def _requested_step(s: NormalisedSpan, call: RequestedCall, results: dict[str, object]) -> Step:
    result, result_status = (
        _given(results[call.tool_call_id])
        if call.tool_call_id is not None and call.tool_call_id in results
        else (None, "absent")
    )
    return Step(
        index=0,
        kind="tool",
        name=call.name,
        span_id=s.span_id,
        parent_span_id=s.span_id,
        trace_id=s.trace_id,
        start_ns=s.end_ns,
        end_ns=s.end_ns,
        convention=s.convention,
        source="llm_output",
        args=call.args,
        args_status=call.args_status,
        args_source="llm_output",
        result=result,
        result_status=result_status,
        agent=s.agent,
        tool_call_id=call.tool_call_id,
        framework=s.framework,
    )


def _merge_nested_model_calls(steps: list[Step]) -> None:
    """One model call recorded twice (a framework's span around the client library's, e.g. ADK's
    call_llm around generate_content, or LangChain's around OpenAI's) counts once: the inner span
    becomes an ``other`` step and its tokens go to the outer one when that has none."""
    llm_steps = {st.span_id: st for st in steps if st.kind == "llm" and st.source == "span"}
    for st in list(llm_steps.values()):
        outer = llm_steps.get(st.parent_span_id) if st.parent_span_id else None
        if outer is None:
            continue
        if outer.tokens is None:
            outer.tokens = st.tokens
        st.kind, st.tokens = "other", None


def _merge_nested_tool_calls(steps: list[Step], by_id: dict[str, NormalisedSpan]) -> None:
    """One tool call recorded again inside itself, by the MCP instrumentation (its ``tools/call``
    spans, client and server, under a framework's tool span such as Pydantic AI's ``running
    tool``, or the server's under the client's) counts once: an MCP tool step whose nearest tool
    ancestor is a tool step of the same name becomes an ``other`` step. The nearest tool
    ancestor is found walking up parent spans through spans that are neither tools nor agents,
    in the same trace; an agent span (the tool ran another agent) or a tool of another name
    stops the walk, and so does a missing parent. The outer step keeps its own outcome (the
    server's spans come from another process and may arrive after it: an outcome taken from
    them would undo an early verdict on it, see ``check.early.in_flight``), unless it records
    none (the MCP SDK's client span; until then the checks took it either way: ``Step.unsure``).
    Where its arguments (or result, or tool-call id, or outcome) are not recorded and those of
    the records merged into it are, it takes the latest-ending record's that has them. Nested
    several deep, inner records merge into their nearest outer first. A loop of parent links (a
    hostile trace) is cut, keeping one of its calls.

    Only removes tool calls, and changes no outcome a span records. Cost: O(spans + tool steps): each span
    between a tool and its nearest tool or agent ancestor is walked once, then remembered (a
    walk stops at a span met before, so loops end), and each merge link is followed once."""
    tools = {st.span_id: st for st in steps if st.kind == "tool" and st.source == "span"}
    if len(tools) < 2:
        return
    # The nearest stop (a tool step, or None: an agent span, a missing parent, the trace's top,
    # a loop) at or above each span walked through that is neither a tool nor an agent.
    stop_above: dict[str, Step | None] = {}
    # Inner call -> the outer call it is merged into, and each outer's inner calls.
    outer_of: dict[str, Step] = {}
    inners: dict[str, list[Step]] = {}
    for st in tools.values():
        path: list[str] = []
        on_path: set[str] = set()
        child_trace = st.trace_id
        cur = st.parent_span_id
        stop: Step | None = None
        while cur is not None:
            if cur in stop_above:
                stop = stop_above[cur]
                break
            span = by_id.get(cur)
            if span is None or span.trace_id != child_trace or span.kind == "agent" or cur in on_path:
                break
            if cur in tools:
                stop = tools[cur]
                break
            path.append(cur)
            on_path.add(cur)
            cur = span.parent_span_id
        for span_id in path:
            stop_above[span_id] = stop
        if stop is not None and stop is not st and stop.name == st.name and st.convention == "mcp":
            outer_of[st.span_id] = stop
            inners.setdefault(stop.span_id, []).append(st)
    if not outer_of:
        return
    # A loop of tool steps merged into one another (parent links in a cycle) is cut: the first
    # of its calls met keeps its own step. Each call is looked at once here.
    state: dict[str, int] = {}  # 1: on the current chain, 2: done
    for start in list(outer_of):
        chain: list[str] = []
        cur_id: str | None = start
        while cur_id is not None and cur_id not in state:
            state[cur_id] = 1
            chain.append(cur_id)
            nxt = outer_of.get(cur_id)
            cur_id = nxt.span_id if nxt is not None else None
        if cur_id is not None and state[cur_id] == 1:  # back on this chain: a loop
            cut = cur_id
            around = outer_of.pop(cut).span_id
            inners[around] = [st for st in inners[around] if st.span_id != cut]
        for span_id in chain:
            state[span_id] = 2
    # Inner calls before the calls they are merged into (a forest now): a call is ready once
    # all its inner calls are.
    waiting = {span_id: len(group) for span_id, group in inners.items() if group}
    ready = [tools[span_id] for span_id in outer_of if span_id not in waiting]
    while ready:
        st = ready.pop()
        group = inners.get(st.span_id)
        if group:
            _absorb(st, group)
        outer = outer_of.get(st.span_id)
        if outer is None:
            continue
        st.kind = "other"
        waiting[outer.span_id] -= 1
        if not waiting[outer.span_id]:
            ready.append(outer)


def _merge_calls_recorded_twice(steps: list[Step], by_id: dict[str, NormalisedSpan]) -> None:
    """One call recorded by two instrumentations at once counts once. OpenInference's and
    OpenLLMetry's LangChain instrumentations both on record every tool and model call, each in a
    subtree of its own (never one inside the other), in one trace, a fraction of a millisecond
    apart (their callbacks run one after the other).

    Two tool (or model) call steps of one name, trace and service, from different conventions,
    whose times overlap and whose tool-call ids do not differ, may be one call; of those pairs,
    the closest in time (start and end) are taken first, each step in one pair at most. The
    earlier-starting step of a pair is kept and takes what it lacks from the other (arguments
    as a mapping where it has a bare value, result, tool-call id, tokens), which becomes an
    ``other`` step. Steps of one convention are never paired: an instrumentation records a call
    once, so two overlapping steps of its own are two calls (parallel, or a retry).

    Cost: O(steps log steps): a sort per name, then each step is compared with at most
    ``_TWIN_SCAN`` steps that start after it while it runs."""
    # Recorded by one convention only (the usual case): nothing to pair, one cheap pass.
    first: str | None = None
    for st in steps:
        if (st.kind == "tool" or st.kind == "llm") and st.source == "span":
            if first is None:
                first = st.convention
            elif st.convention != first:
                break
    else:
        return
    groups: dict[tuple[str, str, str, object], list[Step]] = {}
    for st in steps:
        if (st.kind == "tool" or st.kind == "llm") and st.source == "span":
            span = by_id.get(st.span_id)
            service = span.attributes.get("service.name") if span is not None else None
            groups.setdefault((st.kind, st.name, st.trace_id, service), []).append(st)
    for group in groups.values():
        if len(group) < 2:
            continue
        group.sort(key=_times)
        pairs: list[tuple[int, int, int]] = []  # (distance, earlier, later) by position in group
        for i, st in enumerate(group):
            for j in range(i + 1, min(len(group), i + 1 + _TWIN_SCAN)):
                other = group[j]
                if other.start_ns > st.end_ns:
                    break
                if other.convention != st.convention and (
                    not st.tool_call_id or not other.tool_call_id or st.tool_call_id == other.tool_call_id
                ):
                    distance = other.start_ns - st.start_ns + abs(other.end_ns - st.end_ns)
                    pairs.append((distance, i, j))
        pairs.sort()
        paired: set[int] = set()
        for _, i, j in pairs:
            if i in paired or j in paired:
                continue
            paired.update((i, j))
            _take_twin(group[i], group[j])


# How many steps of one name starting while a step runs are looked at for its twin.
_TWIN_SCAN: Final = 8


def _times(st: Step) -> tuple[int, int]:
    return st.start_ns, st.end_ns


def _take_twin(kept: Step, dropped: Step) -> None:
    """``kept`` takes from ``dropped``, another record of its call, what it lacks."""
    if _better_args(kept, dropped):
        kept.args, kept.args_status, kept.args_source = dropped.args, "captured", dropped.args_source
    _absorb(kept, [dropped])
    if kept.tokens is None:
        kept.tokens = dropped.tokens
    dropped.kind, dropped.tokens = "other", None


def _absorb(outer: Step, group: list[Step]) -> None:
    """``outer`` takes from the inner records of its call what it lacks (see
    ``_merge_nested_tool_calls``)."""
    with_args: Step | None = None
    with_result: Step | None = None
    with_id: Step | None = None
    ended: Step | None = None
    for st in group:
        if st.outcome_recorded and (ended is None or st.end_ns >= ended.end_ns):
            ended = st
        if st.result_status == "captured" and (with_result is None or st.end_ns >= with_result.end_ns):
            with_result = st
        if st.args_status == "captured" and (with_args is None or st.end_ns >= with_args.end_ns):
            with_args = st
        if st.tool_call_id is not None and (with_id is None or st.end_ns >= with_id.end_ns):
            with_id = st
    if outer.tool_call_id is None and with_id is not None:
        outer.tool_call_id = with_id.tool_call_id
    if outer.args_status != "captured" and with_args is not None:
        outer.args, outer.args_status, outer.args_source = with_args.args, "captured", with_args.args_source
    if outer.result_status != "captured" and with_result is not None:
        outer.result, outer.result_status = with_result.result, "captured"
    if not outer.outcome_recorded and ended is not None:
        outer.error, outer.outcome_recorded = ended.error, True


def _order_parallel_calls(steps: list[Step], asking: list[NormalisedSpan], clocks: dict[str, str]) -> None:
    """Tool calls the model asked for in one turn run in the order it asked for them, whatever
    their start times say (they often start together, or in thread order): among their own
    places in the trajectory they are put in request order. ``asking``: the spans with requests.
    Among the places of the calls timed by one clock, that is: a call timed by another clock
    than the model call's has a place that is only one the trace allows (``_across_clocks``),
    which a call of another clock put there would take for sure."""
    turn_of: dict[str, tuple[str, int]] = {}
    for s in asking:
        if len(s.requested_calls) > 1:
            for n, call in enumerate(s.requested_calls):
                if call.tool_call_id:
                    turn_of[call.tool_call_id] = (s.span_id, n)
    if not turn_of:
        return
    turns: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for i, st in enumerate(steps):
        if st.kind == "tool" and st.source == "span" and st.tool_call_id in turn_of:
            turn, n = turn_of[st.tool_call_id]
            turns.setdefault((turn, clocks.get(st.span_id, "")), []).append((n, i))
    for calls in turns.values():
        if len(calls) > 1:
            places = sorted(i for _, i in calls)
            ordered = [steps[i] for _, i in sorted(calls)]
            for place, step in zip(places, ordered, strict=True):
                steps[place] = step


def _delegations_and_handoffs(steps: list[Step], by_id: dict[str, NormalisedSpan]) -> None:
    """A tool whose run is another agent's run (an agent used as a tool) is not a tool the agent
    ran: it becomes an ``other`` step, and the sub-agent's own agent step and tool steps tell
    what happened. A handoff (control passes to another agent) is an ``agent`` step naming the
    target agent, not a tool call."""
    agents = [st for st in steps if st.kind == "agent"]
    tool_of_span = {st.span_id: st for st in steps if st.kind == "tool" and st.source == "span"} if agents else {}
    for agent in agents:
        if agent.source != "span":
            continue
        span = by_id.get(agent.span_id)
        cur = by_id.get(span.parent_span_id) if span is not None and span.parent_span_id else None
        hops = 0
        while cur is not None and cur.kind != "agent" and hops <= len(by_id):
            tool = tool_of_span.get(cur.span_id)
            if tool is not None:
                tool.kind = "other"
                break
            cur = by_id.get(cur.parent_span_id) if cur.parent_span_id else None
            hops += 1
    names = {st.name for st in agents}
    for st in steps:
        if st.kind != "tool":
            continue
        target: str | None = None
        if st.name in HANDOFF_TOOLS and st.args_status == "captured" and isinstance(st.args, dict):
            value = st.args.get(HANDOFF_TOOLS[st.name])
            target = value if isinstance(value, str) and value else None
        elif st.name.startswith(TRANSFER_PREFIX) and st.name[len(TRANSFER_PREFIX) :] in names:
            target = st.name[len(TRANSFER_PREFIX) :]
        if target is not None:
            st.kind, st.name = "agent", target


def _assign_agents(steps: list[Step], by_id: dict[str, NormalisedSpan]) -> None:
    """A step without an agent name inherits the nearest enclosing agent span's name. An agent
    span's sibling of the same name is the agent's body (OpenLLMetry writes the agent's
    ``invoke_agent`` span beside the ``execute_task`` span its work hangs under)."""
    agent_of_span = {st.span_id: st.name for st in steps if st.kind == "agent" and st.source == "span"}
    if not agent_of_span:
        return  # no agent span to inherit from (HTTP and database traces, bare model calls)
    agents_by_parent = {(st.parent_span_id, st.name) for st in steps if st.span_id in agent_of_span}
    for st in steps:
        if st.kind == "other" and st.source == "span" and (st.parent_span_id, st.name) in agents_by_parent:
            agent_of_span[st.span_id] = st.name
    for st in steps:
        if st.agent:
            continue
        cur = by_id.get(st.parent_span_id) if st.parent_span_id else None
        seen = 0
        while cur is not None and seen <= len(by_id):
            if cur.span_id in agent_of_span:
                st.agent = agent_of_span[cur.span_id]
                break
            cur = by_id.get(cur.parent_span_id) if cur.parent_span_id else None
            seen += 1
