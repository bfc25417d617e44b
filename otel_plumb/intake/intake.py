"""The intake: decoded spans -> normalised, de-duplicated, buffered; due traces -> trajectories.

At-least-once delivery is the norm for OTLP (SDK exporters and the Collector resend a batch
whose acknowledgement was lost; the processor's journal replays requests after a crash), so a
span seen again, by (trace id, span id), is a duplicate: it is neither a second step nor
forwarded a second time. A trace whose data could not all be read (a span that could not be
normalised, an unreadable region of a file or request that held its spans) becomes an
incomplete trajectory with the reason, so checks that need what is missing say indeterminate.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Final

from otel_plumb.assemble import AddOutcome, Assembler, AssemblyLimits, Finished, Tombstone
from otel_plumb.model import NormalisedSpan, SpanRecord, Trajectory
from otel_plumb.model.span import fingerprint
from otel_plumb.model.trajectory import UNREADABLE_INPUT, UNREADABLE_SPAN
from otel_plumb.normalise import normalise

# Traces with marks kept at once; past this the oldest marks go (they belong to traces long
# decided: a mark is read when its trace is).
MAX_MARKED_TRACES: Final = 100_000
# Problem lines kept per trace.
MAX_PROBLEMS_PER_TRACE: Final = 20


class Source:
    """Where spans came from: a file, a request. When part of it cannot be read and nothing says
    which trace that part held, every trace it fed (before and after) is marked incomplete."""

    __slots__ = ("label", "trace_ids", "unreadable")

    def __init__(self, label: str) -> None:
        self.label = label
        self.trace_ids: set[str] = set()
        self.unreadable: str | None = None


@dataclass(slots=True)
class IntakeCounts:
    """Spans by what happened to them (duplicates are not lost: the first copy went on)."""

    accepted: int = 0
    duplicate: int = 0
    conflicting_duplicate: int = 0
    late: int = 0
    over_limit: int = 0
    unreadable: int = 0

    def count(self, outcome: AddOutcome) -> None:
        setattr(self, outcome.value, getattr(self, outcome.value) + 1)


class _Marks:
    __slots__ = ("problems", "reason")

    def __init__(self) -> None:
        self.reason: str | None = None
        self.problems: list[str] = []


class Intake:
    def __init__(self, limits: AssemblyLimits | None = None) -> None:
        self.assembler = Assembler(limits)
        self.counts = IntakeCounts()
        self._marks: OrderedDict[str, _Marks] = OrderedDict()
        self._ready: list[Finished] = []  # evicted to make room, not yet handed back
        self._evictions_reported: dict[str, int] = {}

    @property
    def traces_in_flight(self) -> int:
        return self.assembler.traces_in_flight

    @property
    def spans_buffered(self) -> int:
        return self.assembler.spans_buffered

    @property
    def bytes_buffered(self) -> int:
        """Bytes held by buffered spans, as the sizes given to ``add`` say."""
        return self.assembler.bytes_buffered

    def new_evictions(self) -> dict[str, int]:
        """Traces let go before they completed since the last call, by reason (``max_traces``,
        ``max_wait``); reasons with none are left out."""
        out: dict[str, int] = {}
        for reason, total in self.assembler.evictions.items():
            n = total - self._evictions_reported.get(reason, 0)
            if n:
                out[reason] = n
                self._evictions_reported[reason] = total
        return out

    def tombstone(self, trace_id: str) -> Tombstone | None:
        """What is kept of a trace let go before it completed (see ``assemble.Tombstone``)."""
        return self.assembler.tombstone(trace_id)

    def add(
        self, record: SpanRecord, payload: object, now: float, source: Source | None = None, size: int = 0,
        fp: int | None = None,
    ) -> tuple[AddOutcome, NormalisedSpan | None]:  # fmt: skip
        """Take one span: returns what happened to it, and the normalised span when it was taken
        (ACCEPTED) or is a late span of a decided trace (LATE) or over the trace's span limit.
        ``size``: the bytes the span and its payload hold while buffered (see ``bytes_buffered``);
        ``fp``: its ``fingerprint``, when the decoder worked it out already."""
        tid = record.trace_id
        if source is not None:
            source.trace_ids.add(tid)
            if source.unreadable is not None:
                self._mark(tid, UNREADABLE_INPUT, f"{source.label}: {source.unreadable}")
        if fp is None:
            fp = fingerprint(record)
        outcome = self.assembler.seen(tid, record.span_id, fp)
        if outcome is AddOutcome.DUPLICATE or outcome is AddOutcome.CONFLICTING_DUPLICATE:
            self.counts.count(outcome)
            if outcome is AddOutcome.CONFLICTING_DUPLICATE:
                self._mark(tid, None, f"span {record.span_id} ({record.name!r}) was received twice with different "
                           "content; the first copy is used")  # fmt: skip
            return outcome, None
        try:
            span = normalise(record)
        except Exception as exc:  # one span nobody can read must not stop the others
            self.counts.unreadable += 1
            self._mark(tid, UNREADABLE_SPAN, f"span {record.span_id} ({record.name!r}) could not be read: {exc}")
            return AddOutcome.UNREADABLE, None
        outcome, evicted = self.assembler.add_seen(span, payload, now, outcome, fp, size)
        if outcome is AddOutcome.ACCEPTED:
            self.counts.accepted += 1  # the usual outcome, without looking its counter up by name
        else:
            self.counts.count(outcome)
        if evicted:
            self._ready.extend(evicted)
        return outcome, span

    def remember_decided(self, trace_id: str, span_ids: Iterable[str], at: float, now: float) -> None:
        """A trace decided before a restart (see ``Assembler.remember_decided``)."""
        self.assembler.remember_decided(trace_id, span_ids, at, now)

    def unreadable(self, source: Source, message: str, trace_id: str | None = None) -> None:
        """Part of ``source`` could not be read. With ``trace_id`` only that trace is marked;
        without, every trace the source fed that is still being assembled, and every trace it
        feeds from now on. (A trace let go already was idle for ``idle_timeout``: a span of it
        that late would be a late span, left out, whatever the unreadable part held.)"""
        if trace_id is not None:
            self._mark(trace_id, UNREADABLE_INPUT, f"{source.label}: {message}")
            return
        if source.unreadable is not None:
            return  # its traces are marked already
        source.unreadable = message
        in_flight = self.assembler.in_flight
        for tid in source.trace_ids:
            if in_flight(tid):
                self._mark(tid, UNREADABLE_INPUT, f"{source.label}: {message}")

    def ready(self) -> list[Finished]:
        """Traces let go since the last call while others were added (evicted to make room)."""
        out, self._ready = self._ready, []
        return out

    def due(self, now: float) -> list[Finished]:
        return self.ready() + self.assembler.due(now)

    def drain(self, now: float) -> list[Finished]:
        return self.ready() + self.assembler.drain(now)

    def has_span(self, trace_id: str, span_id: str) -> bool:
        return self.assembler.has_span(trace_id, span_id)

    def is_decided(self, trace_id: str) -> bool:
        return self.assembler.is_decided(trace_id)

    def buffered_spans(self, trace_id: str) -> list[NormalisedSpan]:
        return self.assembler.buffered_spans(trace_id)

    def span_ids(self, trace_id: str) -> Container[str]:
        return self.assembler.span_ids(trace_id)

    def trajectory(
        self, finished: Finished, *, keep_marks: bool = False, names_tool: Callable[[str], bool] | None = None
    ) -> Trajectory:
        """The trajectory of a finished trace or session, with what the intake knows of its data
        (kept for a second look with ``keep_marks``, until ``forget_marks``). With ``names_tool``,
        a trace that is plainly no agent's run, of which all could be read, comes without its
        steps (``Finished.trajectory``)."""
        marked = [m for tid in finished.trace_ids if (m := self._marks.get(tid)) is not None] if self._marks else []
        trajectory = finished.trajectory(None if marked else names_tool)
        if marked and not keep_marks:
            for tid in finished.trace_ids:
                self._marks.pop(tid, None)
        for marks in marked:
            trajectory.problems.extend(marks.problems)
            if marks.reason is not None and trajectory.complete:
                trajectory.complete, trajectory.incomplete_reason = False, marks.reason
        return trajectory

    @property
    def traces_waiting(self) -> int:
        return self.assembler.traces_waiting

    def forget_marks(self, finished: Finished) -> None:
        for tid in finished.trace_ids:
            self._marks.pop(tid, None)

    def wait_for_late_spans(self, finished: Finished, now: float) -> bool:
        """Take a complete trace back, undecided, to wait for late spans (see
        ``Assembler.wait_for_late_spans``); its marks stay for its next trajectory."""
        return self.assembler.wait_for_late_spans(finished, now)

    def _mark(self, trace_id: str, reason: str | None, problem: str) -> None:
        marks = self._marks.get(trace_id)
        if marks is None:
            marks = self._marks[trace_id] = _Marks()
            if len(self._marks) > MAX_MARKED_TRACES:
                self._marks.popitem(last=False)
        if reason is not None and marks.reason is None:
            marks.reason = reason
        if len(marks.problems) < MAX_PROBLEMS_PER_TRACE and problem not in marks.problems:
            marks.problems.append(problem)
