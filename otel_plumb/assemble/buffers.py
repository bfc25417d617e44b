"""Per-trace buffers with bounded memory, and the rules that decide when a trace is done.

The caller passes ``now`` (seconds, any monotonic clock): replay drains at end of input, the
live processor calls ``due`` on a timer. Payloads are opaque to this module; the live
processor stores the original OTLP spans there so it can forward them unchanged, and says how
many bytes each one holds (``size``), so that memory can be bounded in bytes as well as spans.

A trace let go before it completed (evicted at ``max_traces``, or at ``max_wait``) is counted
per reason (``evictions``) and keeps a *tombstone* among the decided traces: its tool and agent
calls, names and outcomes only, so that spans of it arriving later can still be checked for the
failures they alone can prove (a forbidden call, one call too many). Eviction is fair between
services: the trace let go is the oldest of the service holding the most traces, so one
service's flood evicts its own traces, not another's.

Cost: ``add`` is O(1) per span. The timers are queues already in deadline order (every trace
has the same idle_timeout and max_wait, so activity order and first-seen order are deadline
order; a trace taken back to wait for late spans goes to the end of the first-seen order, its
max_wait passing at most one confirm wait late, and the waits are a heap, O(log n) each), so
``due`` walks only the traces that are due: O(traces due + traces newly idle) per tick, never
O(traces in flight). A trace idle without a root that is not one tree cannot
become ready until a span of it arrives, so once looked at it is parked out of the activity
queue (its max_wait still applies) and a span of it puts it back.
"""

from __future__ import annotations

import enum
import heapq
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

from otel_plumb.assemble.trajectory import build_trajectory, plain_trajectory
from otel_plumb.model.span import UNKNOWN_FINGERPRINT
from otel_plumb.model.trajectory import MISSING_PARENT, NormalisedSpan, Trajectory


@dataclass(frozen=True, slots=True)
class AssemblyLimits:
    idle_timeout_s: float = 2.0
    max_wait_s: float = 300.0
    max_traces: int = 10_000
    max_spans_per_trace: int = 5_000
    group_by: Literal["trace", "session"] = "trace"
    session_idle_timeout_s: float = 30.0
    # Decided traces are remembered (their span ids) so that a resend of one of their spans is
    # a duplicate, not a late span or a new trajectory: for this long (the Collector's exporter
    # retries for up to 5 minutes by default), and for at most this many traces and spans.
    decided_ttl_s: float = 300.0
    decided_max_traces: int = 100_000
    decided_max_spans: int = 1_000_000
    # How long a trace taken back by ``wait_for_late_spans`` waits (see there).
    confirm_wait_s: float = 0.0


# Calls a tombstone keeps; past this it says so, and checks that need every earlier call (an
# earlier call may be among those not kept) are no longer certain on it.
TOMBSTONE_MAX_CALLS: Final = 256
# Span kinds a tombstone keeps: what the checks that can fail on part of a trace read.
_TOMBSTONE_KINDS: Final = frozenset({"tool", "agent"})
# Evictions, by reason.
EVICTED_MAX_TRACES: Final = "max_traces"
EVICTED_MAX_WAIT: Final = "max_wait"


class AddOutcome(enum.Enum):
    ACCEPTED = "accepted"
    # The same span (trace id and span id) was taken already: OTLP delivery is at-least-once.
    DUPLICATE = "duplicate"
    # The same ids as a span taken already, with other content: the first copy is kept.
    CONFLICTING_DUPLICATE = "conflicting_duplicate"
    # The trace was decided already: the span is counted and forwarded, not assembled.
    LATE = "late"
    # Past max_spans_per_trace: forwarded, not assembled; the trajectory becomes incomplete.
    OVER_LIMIT = "over_limit"
    # Not normalised (the intake's outcome; the assembler never sees such a span): forwarded
    # unchecked, and its trajectory becomes incomplete.
    UNREADABLE = "unreadable"


@dataclass(slots=True, init=False)
class Finished:
    """A trace (or session) the assembler has let go of, with why."""

    key: str
    spans: list[NormalisedSpan]
    payloads: list[object]
    complete: bool
    incomplete_reason: str | None
    first_seen: float
    decided_at: float
    session_id: str | None = None
    trace_ids: list[str] = field(default_factory=list)
    # Bytes its payloads and spans hold (the sizes given to ``Assembler.add``).
    size: int = 0
    # It was taken back once to wait for late spans (``Assembler.wait_for_late_spans``).
    waited: bool = False
    # When its last span was taken: the decision latency starts there.
    last_span_at: float = 0.0

    def __init__(
        self, key: str, spans: list[NormalisedSpan], payloads: list[object], complete: bool,
        incomplete_reason: str | None, first_seen: float, decided_at: float, session_id: str | None = None,
        trace_ids: list[str] | None = None, size: int = 0, waited: bool = False, last_span_at: float = 0.0,
    ) -> None:  # fmt: skip
        self.key = key
        self.spans = spans
        self.payloads = payloads
        self.complete = complete
        self.incomplete_reason = incomplete_reason
        self.first_seen = first_seen
        self.decided_at = decided_at
        self.session_id = session_id
        self.trace_ids = [] if trace_ids is None else trace_ids
        self.size = size
        self.waited = waited
        self.last_span_at = last_span_at

    def trajectory(self, names_tool: Callable[[str], bool] | None = None) -> Trajectory:
        """Its trajectory. With ``names_tool``, a trace that is plainly no agent's run comes
        without its steps (``plain_trajectory``)."""
        if names_tool is not None and self.session_id is None and len(self.trace_ids) == 1:
            plain = plain_trajectory(
                self.key, self.spans, complete=self.complete, incomplete_reason=self.incomplete_reason,
                names_tool=names_tool,
            )  # fmt: skip
            if plain is not None:
                return plain
        return build_trajectory(
            self.key,
            self.spans,
            complete=self.complete,
            incomplete_reason=self.incomplete_reason,
            session_id=self.session_id,
        )


class _TraceBuffer:
    __slots__ = (
        "fingerprints", "first_seen", "has_root", "last_seen", "last_span_at", "orphans", "over_limit", "parent_ids",
        "payloads", "service", "session_id", "size", "spans", "tops", "trace_id", "wait_until",
    )  # fmt: skip

    def __init__(self, trace_id: str, now: float, service: str) -> None:
        self.trace_id = trace_id
        self.service = service
        self.size = 0
        self.spans: list[NormalisedSpan] = []
        self.payloads: list[object] = []
        # Every span id taken for this trace (over the limit too), with its content fingerprint.
        self.fingerprints: dict[str, int] = {}
        # One string per parent id: most spans of a trace share a few parents (the agent span,
        # a tool span), and each arrives with its own copy of the id.
        self.parent_ids: dict[str, str] = {}
        self.first_seen = now
        # Any span (over the limit too) keeps the trace from going idle; the decision latency
        # counts from the last span taken.
        self.last_seen = now
        self.last_span_at = now
        self.has_root = False
        self.over_limit = False
        self.session_id: str | None = None
        # Taken back to wait for late spans until then (``Assembler.wait_for_late_spans``).
        self.wait_until: float | None = None
        # The spans whose parent is not among the trace's spans (yet), and how many wait for each
        # missing parent: kept as spans arrive (``took``), so that ``single_tree`` costs nothing
        # however often the trace goes idle before its root comes.
        self.tops = 0
        self.orphans: dict[str, int] = {}

    def took(self, span: NormalisedSpan) -> None:
        """``span`` was added to ``spans`` (its id to ``fingerprints`` first)."""
        parent = span.parent_span_id
        if parent is None or parent not in self.fingerprints:
            self.tops += 1
            if parent is not None:
                self.orphans[parent] = self.orphans.get(parent, 0) + 1
        children = self.orphans.get(span.span_id)  # (get and del: pop with a default is a method call)
        if children is not None:
            del self.orphans[span.span_id]
            self.tops -= children

    def single_tree(self) -> bool:
        """True when the spans hang from one top span (a root whose parent is remote)."""
        if not self.over_limit:
            return self.tops == 1
        # Spans over the limit have ids (in ``fingerprints``) but are no spans: counted anew.
        ids = {s.span_id for s in self.spans}
        return sum(1 for s in self.spans if s.parent_span_id not in ids) == 1


class Tombstone:
    """What is remembered of a trace let go before it completed: its tool and agent calls
    (names, outcomes, times and parents; no arguments, results or payloads), at most
    ``TOMBSTONE_MAX_CALLS``, with the calls of its spans that arrived later, and the failures
    already reported for it (``reported``: (policy, invariant) pairs, filled by the caller), so
    that a later span is checked against what came before and each failure is reported once."""

    __slots__ = ("calls", "reason", "reported", "truncated")

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.calls: list[NormalisedSpan] = []
        self.truncated = False
        self.reported: set[tuple[str, str]] = set()

    def keep(self, span: NormalisedSpan) -> None:
        """Remember ``span`` if it is a call."""
        if span.kind not in _TOMBSTONE_KINDS:
            return
        if len(self.calls) >= TOMBSTONE_MAX_CALLS:
            self.truncated = True
            return
        self.calls.append(
            NormalisedSpan(
                trace_id=span.trace_id, span_id=span.span_id, parent_span_id=span.parent_span_id,
                span_name=span.span_name, start_ns=span.start_ns, end_ns=span.end_ns, kind=span.kind,
                name=span.name, convention=span.convention, error=span.error, agent=span.agent,
                tool_call_id=span.tool_call_id, session_id=span.session_id, outcome_recorded=span.outcome_recorded,
                cut=span.cut, span_kind=span.span_kind,
                # Who the trace belongs to (service, task key), as a trajectory reads it: once.
                attributes=dict(span.attributes) if not self.calls else {},
            )
        )  # fmt: skip

    def trajectory(self, key: str) -> Trajectory:
        """A partial trajectory of the calls kept, for the checks that can fail on part of a
        trace. When calls were not kept, a failure that needs an earlier call is not certain."""
        reason = MISSING_PARENT if self.truncated else self.reason
        return build_trajectory(key, self.calls, complete=False, incomplete_reason=reason)


class _DecidedTrace:
    # ``session``: the session (with ``group_by: session``) still open that holds the trace.
    __slots__ = ("at", "fingerprints", "session", "tombstone")

    def __init__(self, at: float, fingerprints: dict[str, int], tombstone: Tombstone | None = None) -> None:
        self.at = at
        self.fingerprints = fingerprints
        self.tombstone = tombstone
        self.session: str | None = None

    @property
    def weight(self) -> int:
        """Entries held: span ids, and the calls of a tombstone."""
        return len(self.fingerprints) + (len(self.tombstone.calls) if self.tombstone is not None else 0)


class _SessionBuffer:
    __slots__ = ("last_seen", "parts")

    def __init__(self, now: float) -> None:
        self.parts: list[Finished] = []
        self.last_seen = now


class _Services:
    """Traces in flight per service, oldest first, and which services hold the most: the one to
    evict from is found in constant time, however many services there are."""

    __slots__ = ("_buckets", "_max", "traces")

    def __init__(self) -> None:
        self.traces: dict[str, OrderedDict[str, None]] = {}
        # Services by how many traces they hold (each bucket in the order services entered it).
        self._buckets: dict[int, dict[str, None]] = {}
        self._max = 0

    def _move(self, service: str, old: int, new: int) -> None:
        if old:
            bucket = self._buckets[old]
            del bucket[service]
            if not bucket:
                del self._buckets[old]
                if self._max == old and new < old:
                    self._max = new
        if new:
            self._buckets.setdefault(new, {})[service] = None
            self._max = max(self._max, new)

    def add(self, service: str, trace_id: str) -> None:
        traces = self.traces.get(service)
        if traces is None:
            traces = self.traces[service] = OrderedDict()
        traces[trace_id] = None
        self._move(service, len(traces) - 1, len(traces))

    def remove(self, service: str, trace_id: str) -> None:
        traces = self.traces[service]
        del traces[trace_id]
        self._move(service, len(traces) + 1, len(traces))
        if not traces:
            del self.traces[service]

    def holds_most(self, service: str) -> bool:
        traces = self.traces.get(service)
        return traces is not None and len(traces) == self._max

    def oldest_of_largest(self) -> str:
        """The oldest trace of a service holding the most traces."""
        service = next(iter(self._buckets[self._max]))
        return next(iter(self.traces[service]))


class Assembler:
    def __init__(self, limits: AssemblyLimits | None = None) -> None:
        self.limits = limits or AssemblyLimits()
        self._traces: dict[str, _TraceBuffer] = {}  # insertion order = first seen
        self._by_activity: OrderedDict[str, None] = OrderedDict()  # least recently active first
        # Its move_to_end, bound once: this runs for every span, and compiled code would look the
        # method up by name at each call.
        self._to_last: Callable[[str], None] = self._by_activity.move_to_end
        # Idle, without a root and not one tree: not ready until a span of theirs arrives.
        self._parked: dict[str, None] = {}
        # Complete, idle, waiting for late spans until the time given (``wait_for_late_spans``),
        # and the same in deadline order (entries whose trace has left the wait are skipped).
        self._waiting: dict[str, float] = {}
        self._wait_order: list[tuple[float, str]] = []
        self._decided: OrderedDict[str, _DecidedTrace] = OrderedDict()  # oldest decision first
        self._decided_spans = 0
        self._sessions: OrderedDict[str, _SessionBuffer] = OrderedDict()  # least recently active first
        self._services = _Services()
        self.spans_buffered = 0
        # Bytes held by buffered spans (trace buffers and sessions not yet let go).
        self.bytes_buffered = 0
        # Traces let go before they completed, by reason (EVICTED_*): counts since the start.
        self.evictions: dict[str, int] = {}

    @property
    def traces_in_flight(self) -> int:
        return len(self._traces)

    @property
    def traces_waiting(self) -> int:
        """Complete traces taken back to wait for late spans (``wait_for_late_spans``)."""
        return len(self._waiting)

    def in_flight(self, trace_id: str) -> bool:
        return trace_id in self._traces

    def is_decided(self, trace_id: str) -> bool:
        return trace_id in self._decided

    def buffered_spans(self, trace_id: str) -> list[NormalisedSpan]:
        buf = self._traces.get(trace_id)
        return buf.spans if buf is not None else []

    def span_ids(self, trace_id: str) -> Container[str]:
        """The ids of the spans taken for a trace in flight (over its span limit too), kept up to
        date as spans arrive: the buffer's own index, not a copy."""
        buf = self._traces.get(trace_id)
        return buf.fingerprints if buf is not None else frozenset()

    @property
    def decided_remembered(self) -> tuple[int, int]:
        """Decided traces, and their spans, remembered for telling duplicates from new spans."""
        return len(self._decided), self._decided_spans

    def tombstone(self, trace_id: str) -> Tombstone | None:
        """The tombstone of a trace let go before it completed, while it is remembered."""
        decided = self._decided.get(trace_id)
        return decided.tombstone if decided is not None else None

    def has_span(self, trace_id: str, span_id: str) -> bool:
        """Was a span with these ids taken (in flight, or of a decided trace remembered)?"""
        buf = self._traces.get(trace_id)
        if buf is not None:
            return span_id in buf.fingerprints
        decided = self._decided.get(trace_id)
        return decided is not None and span_id in decided.fingerprints

    def seen(self, trace_id: str, span_id: str, fingerprint: int) -> AddOutcome | None:
        """What ``add`` would say of a span without taking it: a duplicate, a late span of a
        decided trace, or None for a span not seen before. Cheap: ask before normalising."""
        buf = self._traces.get(trace_id)
        if buf is not None:
            known = buf.fingerprints.get(span_id)
        else:
            decided = self._decided.get(trace_id)
            if decided is None:
                return None
            known = decided.fingerprints.get(span_id)
            if known is None:
                return AddOutcome.LATE
        if known is None:
            return None
        if known in (fingerprint, UNKNOWN_FINGERPRINT):
            return AddOutcome.DUPLICATE
        return AddOutcome.CONFLICTING_DUPLICATE

    def remember_decided(self, trace_id: str, span_ids: Iterable[str], at: float, now: float) -> None:
        """A trace decided before a restart (``at``: when, on the clock of ``now``),
        remembered as if decided here: a resent span of it is a duplicate, a new one a late span.
        Its spans' fingerprints did not survive the restart (``UNKNOWN_FINGERPRINT``): a resend
        with other content is a plain duplicate. Call oldest first, before any span is added."""
        if trace_id in self._traces or trace_id in self._decided:
            return
        entry = self._decided[trace_id] = _DecidedTrace(at, dict.fromkeys(span_ids, UNKNOWN_FINGERPRINT))
        self._decided_spans += entry.weight
        self._forget_decided(now)

    def add(
        self, span: NormalisedSpan, payload: object, now: float, fingerprint: int = 0, size: int = 0
    ) -> tuple[AddOutcome, list[Finished]]:
        """Buffer one span. Returns what happened to it and any trace evicted to make room.
        ``fingerprint`` tells a resent copy of the span from another span with the same ids;
        ``size``: the bytes it holds (its payload and values), counted until its trace is let go.
        A late span of a decided trace is remembered (its ids, so that a resend of it is a
        duplicate; and by the trace's tombstone, if it has one)."""
        return self.add_seen(span, payload, now, self.seen(span.trace_id, span.span_id, fingerprint), fingerprint, size)

    def add_seen(
        self, span: NormalisedSpan, payload: object, now: float, already: AddOutcome | None, fingerprint: int = 0,
        size: int = 0,
    ) -> tuple[AddOutcome, list[Finished]]:
        """``add`` for a span whose ``seen`` was asked just before (``already``), with nothing
        added in between: the intake asks before normalising, and is not asked twice."""
        tid = span.trace_id
        if already is AddOutcome.LATE and self._reopened(tid, now):
            already = None
        if already is not None:
            if already is AddOutcome.LATE:
                # Remembered, so that a resend of it is a duplicate, not forwarded again.
                decided = self._decided[tid]
                before = decided.weight
                decided.fingerprints[span.span_id] = fingerprint
                if decided.tombstone is not None:
                    decided.tombstone.keep(span)
                self._decided_spans += decided.weight - before
                self._forget_decided(now)
            return already, []
        evicted: list[Finished] = []
        buf = self._traces.get(tid)
        if buf is None:
            while len(self._traces) >= self.limits.max_traces:
                evicted.extend(self._evict(now))
            service = span.attributes.get("service.name")
            buf = self._traces[tid] = _TraceBuffer(tid, now, "" if service is None else str(service))
            self._by_activity[tid] = None  # a new trace: last in activity order already
            self._services.add(buf.service, tid)
        else:
            if tid in self._by_activity:
                # ``now`` never goes back: a trace that had a span at this very time already
                # stands behind every trace last active earlier (a request's spans share one
                # ``now``), which is all the activity order needs.
                if buf.last_seen != now:
                    self._to_last(tid)
            else:  # parked, or waiting for late spans: one came, so it is idle_timeout from done
                if self._parked.pop(tid, self) is self:
                    del self._waiting[tid]
                self._by_activity[tid] = None
            buf.last_seen = now
        buf.fingerprints[span.span_id] = fingerprint
        if len(buf.spans) >= self.limits.max_spans_per_trace:
            buf.over_limit = True
            return AddOutcome.OVER_LIMIT, evicted
        span.trace_id = buf.trace_id  # one string per trace, not one per buffered span
        parent = span.parent_span_id
        if parent is not None:
            span.parent_span_id = buf.parent_ids.setdefault(parent, parent)
        buf.spans.append(span)
        buf.took(span)
        buf.last_span_at = now
        buf.payloads.append(payload)
        buf.size += size
        self.bytes_buffered += size
        self.spans_buffered += 1
        if span.parent_span_id is None:
            buf.has_root = True
        if span.session_id and buf.session_id is None:
            buf.session_id = span.session_id
        return AddOutcome.ACCEPTED, evicted

    def due(self, now: float) -> list[Finished]:
        """Traces whose root has ended and that were idle for idle_timeout, and traces past max_wait.
        O(traces due + traces newly idle): see the module docstring."""
        out: list[Finished] = []
        idle = self.limits.idle_timeout_s
        # Both orders put the traces due first: walk them up to the first that is not, and
        # finish (or park) after walking.
        ready: list[_TraceBuffer] = []
        waiting: list[str] = []
        holding: list[_TraceBuffer] = []
        order = self._wait_order
        while order and order[0][0] <= now:
            until, tid = heapq.heappop(order)
            if self._waiting.get(tid) == until:
                del self._waiting[tid]
                ready.append(self._traces[tid])
        for tid in self._by_activity:
            buf = self._traces[tid]
            if now - buf.last_seen < idle:
                break
            if buf.wait_until is not None and buf.wait_until > now:
                holding.append(buf)  # a late span came in its wait: the wait goes on
            elif buf.has_root or buf.single_tree():
                ready.append(buf)
            else:
                waiting.append(tid)
        for tid in waiting:
            del self._by_activity[tid]
            self._parked[tid] = None
        for buf in holding:
            del self._by_activity[buf.trace_id]
            self._hold(buf)
        for buf in ready:
            out.extend(self._finish(buf.trace_id, now, complete=not buf.over_limit, reason="span_limit"))
        expired: list[str] = []
        for tid, buf in self._traces.items():
            if now - buf.first_seen < self.limits.max_wait_s:
                break
            expired.append(tid)
        for tid in expired:
            out.extend(self._finish(tid, now, complete=False, reason="max_wait", evicted=EVICTED_MAX_WAIT))
        out.extend(self._due_sessions(now))
        self._forget_decided(now)
        return out

    def drain(self, now: float) -> list[Finished]:
        """Let go of everything (end of input, shutdown). A trace with a root is complete."""
        out: list[Finished] = []
        for tid in list(self._traces):
            buf = self._traces[tid]
            out.extend(self._finish(tid, now, complete=not buf.over_limit, reason="span_limit"))
        for key in list(self._sessions):
            out.append(self._emit_session(key, now))
        return out

    def _evict(self, now: float) -> list[Finished]:
        """Let go of one trace to make room: one waiting for late spans if any (it is complete:
        its wait is cut short, it is not cut), else the oldest of the service holding the most
        traces (the oldest of all when its service is one of those)."""
        order = self._wait_order
        while order:
            until, tid = heapq.heappop(order)
            if self._waiting.get(tid) == until:
                del self._waiting[tid]
                return self._finish(tid, now, complete=True, reason="span_limit")
        oldest = next(iter(self._traces))
        services = self._services
        tid = oldest if services.holds_most(self._traces[oldest].service) else services.oldest_of_largest()
        return self._finish(tid, now, complete=False, reason="evicted", evicted=EVICTED_MAX_TRACES)

    def _finish(
        self, tid: str, now: float, *, complete: bool, reason: str, evicted: str | None = None
    ) -> list[Finished]:
        buf = self._traces.pop(tid)
        if self._by_activity.pop(tid, self) is self and self._parked.pop(tid, self) is self:
            self._waiting.pop(tid, None)
        self._services.remove(buf.service, tid)
        self.spans_buffered -= len(buf.spans)
        tombstone: Tombstone | None = None
        if evicted is not None:
            self.evictions[evicted] = self.evictions.get(evicted, 0) + 1
            tombstone = Tombstone(evicted)
            for span in buf.spans:
                tombstone.keep(span)
            tombstone.truncated = tombstone.truncated or buf.over_limit
        entry = self._decided[tid] = _DecidedTrace(now, buf.fingerprints, tombstone)
        self._decided_spans += entry.weight
        self._forget_decided(now)
        done = Finished(
            key=tid,
            spans=buf.spans,
            payloads=buf.payloads,
            complete=complete,
            incomplete_reason=None if complete else reason,
            first_seen=buf.first_seen,
            decided_at=now,
            session_id=buf.session_id,
            trace_ids=[tid],
            size=buf.size,
            waited=buf.wait_until is not None,
            last_span_at=buf.last_span_at,
        )
        if self.limits.group_by == "session" and buf.session_id:
            session = self._sessions.get(buf.session_id)
            if session is None:
                session = self._sessions[buf.session_id] = _SessionBuffer(now)
            session.parts.append(done)
            entry.session = buf.session_id
            session.last_seen = now
            self._sessions.move_to_end(buf.session_id)
            return []  # its bytes stay held until the session is let go
        self.bytes_buffered -= buf.size
        return [done]

    def wait_for_late_spans(self, done: Finished, now: float) -> bool:
        """Take back a complete trace just let go by ``due`` (``done``), undecided, for
        ``confirm_wait_s``: its verdict has a failure a span not yet seen could clear (one sent
        by another process's exporter, or resent after a lost acknowledgement, arrives after
        ``idle_timeout``). A span of it arriving in that time is taken in; it is let go again
        (``waited``) at the end of the wait, or idle_timeout after its last span if that is
        later, and not taken back a second time.
        Only for traces (not sessions), once each; False (and nothing taken back) when it is
        not one of those, or no longer remembered among the decided (its span ids are needed)."""
        decided = self._decided.get(done.key)
        if done.waited or not done.complete or self.limits.group_by != "trace" or decided is None:
            return False
        buf = self._take_back(done, decided, now)
        buf.has_root = True
        buf.wait_until = now + self.limits.confirm_wait_s
        self._hold(buf)
        self.bytes_buffered += buf.size
        return True

    def _reopened(self, tid: str, now: float) -> bool:
        """A span came for trace ``tid`` after it went idle (a tool that ran longer than
        idle_timeout, a batch resent late): if the trace is held by a session still open, it is
        taken back from it, in flight again, so that the span is in the session's verdict as in
        one delivery of them all. False (nothing done) for a trace that is not."""
        decided = self._decided[tid]
        key = decided.session
        if key is None or key not in self._sessions:
            return False
        session = self._sessions[key]
        part = next(p for p in session.parts if p.key == tid)
        session.parts.remove(part)
        if not session.parts:
            del self._sessions[key]
        self._by_activity[tid] = None
        self._take_back(part, decided, now)  # its bytes are counted: a session's stay held
        return True

    def _take_back(self, done: Finished, decided: _DecidedTrace, now: float) -> _TraceBuffer:
        """Trace ``done`` in flight again, as it was let go."""
        tid = done.key
        del self._decided[tid]
        self._decided_spans -= decided.weight
        service = done.spans[0].attributes.get("service.name") if done.spans else None
        buf = self._traces[tid] = _TraceBuffer(tid, done.first_seen, "" if service is None else str(service))
        buf.last_seen, buf.session_id = now, done.session_id
        buf.last_span_at = done.last_span_at  # taken back, not a span
        buf.spans, buf.payloads, buf.fingerprints, buf.size = done.spans, done.payloads, decided.fingerprints, done.size
        for span in buf.spans:
            buf.took(span)
            if span.parent_span_id is None:
                buf.has_root = True
        self._services.add(buf.service, tid)
        self.spans_buffered += len(buf.spans)
        return buf

    def _hold(self, buf: _TraceBuffer) -> None:
        assert buf.wait_until is not None
        self._waiting[buf.trace_id] = buf.wait_until
        heapq.heappush(self._wait_order, (buf.wait_until, buf.trace_id))

    def _forget_decided(self, now: float) -> None:
        """Past decided_ttl, or over the count bounds, the oldest decided traces are forgotten:
        a span of theirs arriving after that starts a new trajectory."""
        decided, limits = self._decided, self.limits
        while decided:
            oldest = next(iter(decided.values()))
            if (
                now - oldest.at < limits.decided_ttl_s
                and len(decided) <= limits.decided_max_traces
                and self._decided_spans <= limits.decided_max_spans
            ):
                return
            decided.popitem(last=False)
            self._decided_spans -= oldest.weight

    def _due_sessions(self, now: float) -> list[Finished]:
        timeout = self.limits.session_idle_timeout_s
        due: list[str] = []
        for key, session in self._sessions.items():  # least recently active first
            if now - session.last_seen < timeout:
                break
            due.append(key)
        return [self._emit_session(key, now) for key in due]

    def _emit_session(self, key: str, now: float) -> Finished:
        parts = self._sessions.pop(key).parts
        for p in parts:  # a span of theirs from now on is a late span
            decided = self._decided.get(p.key)
            if decided is not None:
                decided.session = None
        incomplete = [p for p in parts if not p.complete]
        size = sum(p.size for p in parts)
        self.bytes_buffered -= size
        return Finished(
            key=key,
            spans=[s for p in parts for s in p.spans],
            payloads=[x for p in parts for x in p.payloads],
            complete=not incomplete,
            incomplete_reason=incomplete[0].incomplete_reason if incomplete else None,
            first_seen=min(p.first_seen for p in parts),
            decided_at=now,
            session_id=key,
            trace_ids=[t for p in parts for t in p.trace_ids],
            size=size,
            last_span_at=max(p.last_span_at for p in parts),
        )
