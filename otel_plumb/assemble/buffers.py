"""Per-trace buffers with bounded memory, and the rules that decide when a trace is done.

The caller passes ``now`` (seconds, any monotonic clock): replay drains at end of input, the
live processor calls ``due`` on a timer. Payloads are opaque to this module; the live
processor stores the original OTLP spans there so it can forward them unchanged.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from otel_plumb.assemble.trajectory import build_trajectory
from otel_plumb.model.trajectory import NormalisedSpan, Trajectory


@dataclass(frozen=True, slots=True)
class AssemblyLimits:
    idle_timeout_s: float = 2.0
    max_wait_s: float = 300.0
    max_traces: int = 10_000
    max_spans_per_trace: int = 5_000
    decided_cache_size: int = 100_000
    group_by: Literal["trace", "session"] = "trace"
    session_idle_timeout_s: float = 30.0


class AddOutcome(enum.Enum):
    ACCEPTED = "accepted"
    # The trace was decided already: the span is counted and forwarded, not assembled.
    LATE = "late"
    # Past max_spans_per_trace: forwarded, not assembled; the trajectory becomes incomplete.
    OVER_LIMIT = "over_limit"


@dataclass(slots=True)
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

    def trajectory(self) -> Trajectory:
        return build_trajectory(
            self.key,
            self.spans,
            complete=self.complete,
            incomplete_reason=self.incomplete_reason,
            session_id=self.session_id,
        )


class _TraceBuffer:
    __slots__ = ("first_seen", "has_root", "last_seen", "over_limit", "payloads", "session_id", "spans", "trace_id")

    def __init__(self, trace_id: str, now: float) -> None:
        self.trace_id = trace_id
        self.spans: list[NormalisedSpan] = []
        self.payloads: list[object] = []
        self.first_seen = now
        self.last_seen = now
        self.has_root = False
        self.over_limit = False
        self.session_id: str | None = None

    def single_tree(self) -> bool:
        """True when the spans hang from one top span (a root whose parent is remote)."""
        ids = {s.span_id for s in self.spans}
        return sum(1 for s in self.spans if s.parent_span_id not in ids) == 1


class _SessionBuffer:
    __slots__ = ("last_seen", "parts")

    def __init__(self, now: float) -> None:
        self.parts: list[Finished] = []
        self.last_seen = now


class Assembler:
    def __init__(self, limits: AssemblyLimits | None = None) -> None:
        self.limits = limits or AssemblyLimits()
        self._traces: dict[str, _TraceBuffer] = {}  # insertion order = first seen
        self._by_activity: OrderedDict[str, None] = OrderedDict()  # least recently active first
        self._decided: OrderedDict[str, None] = OrderedDict()
        self._sessions: dict[str, _SessionBuffer] = {}
        self.spans_buffered = 0

    @property
    def traces_in_flight(self) -> int:
        return len(self._traces)

    def is_decided(self, trace_id: str) -> bool:
        return trace_id in self._decided

    def buffered_spans(self, trace_id: str) -> list[NormalisedSpan]:
        buf = self._traces.get(trace_id)
        return buf.spans if buf is not None else []

    def add(self, span: NormalisedSpan, payload: object, now: float) -> tuple[AddOutcome, list[Finished]]:
        """Buffer one span. Returns what happened to it and any trace evicted to make room."""
        tid = span.trace_id
        if tid in self._decided:
            return AddOutcome.LATE, []
        evicted: list[Finished] = []
        buf = self._traces.get(tid)
        if buf is None:
            while len(self._traces) >= self.limits.max_traces:
                oldest = next(iter(self._traces))
                evicted.extend(self._finish(oldest, now, complete=False, reason="evicted"))
            buf = self._traces[tid] = _TraceBuffer(tid, now)
            self._by_activity[tid] = None  # a new trace: last in activity order already
        else:
            buf.last_seen = now
            self._by_activity.move_to_end(tid)
        if len(buf.spans) >= self.limits.max_spans_per_trace:
            buf.over_limit = True
            return AddOutcome.OVER_LIMIT, evicted
        buf.spans.append(span)
        buf.payloads.append(payload)
        self.spans_buffered += 1
        if span.parent_span_id is None:
            buf.has_root = True
        if span.session_id and buf.session_id is None:
            buf.session_id = span.session_id
        return AddOutcome.ACCEPTED, evicted

    def due(self, now: float) -> list[Finished]:
        """Traces whose root has ended and that were idle for idle_timeout, and traces past max_wait."""
        out: list[Finished] = []
        idle = self.limits.idle_timeout_s
        # Both orders put the traces due first: walk them up to the first that is not, and
        # finish after walking (no copy of every buffered trace's id per call).
        ready: list[_TraceBuffer] = []
        for tid in self._by_activity:
            buf = self._traces[tid]
            if now - buf.last_seen < idle:
                break
            if buf.has_root or buf.single_tree():
                ready.append(buf)
        for buf in ready:
            out.extend(self._finish(buf.trace_id, now, complete=not buf.over_limit, reason="span_limit"))
        expired: list[str] = []
        for tid, buf in self._traces.items():
            if now - buf.first_seen < self.limits.max_wait_s:
                break
            expired.append(tid)
        for tid in expired:
            out.extend(self._finish(tid, now, complete=False, reason="max_wait"))
        out.extend(self._due_sessions(now))
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

    def _finish(self, tid: str, now: float, *, complete: bool, reason: str) -> list[Finished]:
        buf = self._traces.pop(tid)
        del self._by_activity[tid]
        self.spans_buffered -= len(buf.spans)
        self._decided[tid] = None
        if len(self._decided) > self.limits.decided_cache_size:
            self._decided.popitem(last=False)
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
        )
        if self.limits.group_by == "session" and buf.session_id:
            session = self._sessions.get(buf.session_id)
            if session is None:
                session = self._sessions[buf.session_id] = _SessionBuffer(now)
            session.parts.append(done)
            session.last_seen = now
            return []
        return [done]

    def _due_sessions(self, now: float) -> list[Finished]:
        timeout = self.limits.session_idle_timeout_s
        return [
            self._emit_session(key, now)
            for key in [k for k, s in self._sessions.items() if now - s.last_seen >= timeout]
        ]

    def _emit_session(self, key: str, now: float) -> Finished:
        parts = self._sessions.pop(key).parts
        incomplete = [p for p in parts if not p.complete]
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
        )
