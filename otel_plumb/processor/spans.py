"""The live processor's per-span loop: a request's spans into the intake, with what the early
checks track of each trace in flight. No I/O, and compiled with the core (``setup.py``): this
runs once per span received. The processor counts, logs, checks and forwards what it returns."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Final, Protocol

from otel_plumb.assemble import AddOutcome
from otel_plumb.check.early import EarlyState, EarlyWatch
from otel_plumb.export.annotate import Forwarded, Origin, SpanIds
from otel_plumb.intake import Intake, Source
from otel_plumb.model import NormalisedSpan, SpanRecord


class UnreadSpan(SpanIds, Protocol):
    """A span the receiver could not read into a record (``receive.otlp.UnreadSpan``: the
    receivers are not imported here, the compiled core is built without their dependencies)."""

    @property
    def reason(self) -> str: ...


class TakenSpans:
    """What became of a request's spans. ``dropped`` and ``unchecked_by``: counts by
    ``AddOutcome`` value (the metrics' labels); ``touched``: the traces that gained a step, in
    order of arrival; ``tombstoned``: traces let go before they completed whose late spans hold
    steps; ``unread``: (span id, reason) of the spans nobody could decode."""

    __slots__ = (
        "dropped", "late", "rejected", "resent", "taken", "tombstoned", "touched", "unchecked", "unchecked_by",
        "unread",
    )  # fmt: skip

    def __init__(self) -> None:
        self.taken = 0
        self.rejected = 0
        self.resent = 0
        self.dropped: dict[str, int] = {}
        self.unchecked_by: dict[str, int] = {}
        # Forwarded unchecked: spans of decided traces (late), and spans of traces still in
        # flight (over the span limit, unreadable) whose other spans must still be replayable.
        self.late: list[Forwarded] = []
        self.unchecked: list[Forwarded] = []
        self.touched: dict[str, None] = {}
        self.tombstoned: dict[str, None] = {}
        self.unread: list[tuple[str, str]] = []


class PendingEarly:
    """Early failures found on a trace in flight, reported once they still hold at ``deadline``
    (``time.monotonic()``, with ``assembly.confirm_wait``): their (policy, invariant) keys."""

    __slots__ = ("deadline", "keys")

    def __init__(self, deadline: float, keys: set[tuple[str, str]]) -> None:
        self.deadline = deadline
        self.keys = keys


# The early invariants worth checking on a trace now: (trace id, its counters, their keys).
EarlyCheck = tuple[str, EarlyState, list[tuple[str, str]]]

_NONE_REPORTED: Final[frozenset[tuple[str, str]]] = frozenset()


class SpanTaker:
    """Feeds requests' spans to ``intake`` and keeps, per trace in flight, whether its root is
    in (``rooted``) and, with ``early_checks``, its early-check counters (``early_state``, made
    by ``watch``). O(spans) per request."""

    __slots__ = ("early_checks", "early_state", "intake", "rooted", "watch")

    def __init__(
        self, intake: Intake, early_checks: bool, watch: EarlyWatch, rooted: set[str],
        early_state: dict[str, EarlyState],
    ) -> None:  # fmt: skip
        self.intake = intake
        self.early_checks = early_checks
        self.watch = watch
        self.rooted = rooted
        self.early_state = early_state

    def early_checks_due(
        self, touched: Iterable[str], reported: dict[str, set[tuple[str, str]]],
        pending: dict[str, PendingEarly],
    ) -> list[EarlyCheck]:  # fmt: skip
        """Of the traces a request gave steps to, those still running (root not in, not decided)
        on which an early invariant not yet ``reported`` nor ``pending`` may fail now, as their
        counters say, and is worth checking (``EarlyState.worth_checking``). Asked after every
        request for each trace it touched: O(early invariants x tools they name) per trace."""
        out: list[EarlyCheck] = []
        rooted, early_state, watch, decided = self.rooted, self.early_state, self.watch, self.intake.is_decided
        for tid in touched:
            # Once the root span (which ends last) is in, the full verdict is one idle_timeout
            # away: early checks are for trajectories still running.
            if tid in rooted or decided(tid):
                continue
            state = early_state.get(tid)
            if state is None:
                continue
            known = reported.get(tid)
            done: set[tuple[str, str]] | frozenset[tuple[str, str]] = _NONE_REPORTED if known is None else known
            waiting = pending.get(tid)
            may_fail = watch.may_fail(state, done if waiting is None else done | waiting.keys)
            if may_fail and state.worth_checking(may_fail):
                out.append((tid, state, may_fail))
        return out

    def take(
        self, records: Sequence[SpanRecord | UnreadSpan], wires: Sequence[tuple[bytes, bytes, int, int]],
        origins: list[Origin], now: float, source: Source, journal_id: int, keep_bodies: bool,
        skip_traces: Collection[bytes],
    ) -> TakenSpans:  # fmt: skip
        """Every span of a request (but those of ``skip_traces``): the n-th record with the
        n-th wire span (``receive.otlp.SpanWire``: its bytes, its trace id's bytes, the index of
        its origin, its record's fingerprint); ``keep_bodies``: buffer each span's bytes to forward it later."""
        out = TakenSpans()
        intake = self.intake
        early_checks = self.early_checks
        rooted, early_state = self.rooted, self.early_state
        for record, (body, trace_id, origin_index, fp) in zip(records, wires, strict=True):
            span_id = record.span_id
            if len(trace_id) != 16 or len(span_id) != 16:
                out.rejected += 1
                # What else of its trace the rejected span held is unknown: the
                # trajectories it may belong to are incomplete.
                trace = trace_id.hex() if len(trace_id) == 16 else None
                intake.unreadable(source, "a span without a valid trace_id/span_id was rejected", trace)
                continue
            if skip_traces and trace_id in skip_traces:
                continue
            # Kept as bytes, so nothing of the parsed request outlives it; its ids are read from
            # the record until the span is normalised (below).
            payload = Forwarded(body if keep_bodies else b"", origins[origin_index], record, journal_id)
            normalised: NormalisedSpan | None
            if isinstance(record, SpanRecord):
                outcome, normalised = intake.add(record, payload, now, source, held_bytes(body), fp)
                if normalised is not None:
                    payload.ids = normalised  # the same ids and times; the record is let go
            else:  # a span nobody can decode is still forwarded, never lost
                out.unread.append((span_id, record.reason))
                intake.unreadable(source, f"span {span_id} could not be decoded: {record.reason}", trace_id.hex())
                outcome, normalised = AddOutcome.UNREADABLE, None
            if outcome is AddOutcome.ACCEPTED:
                out.taken += 1
                assert normalised is not None
                tid = normalised.trace_id  # the trace's one string
                if normalised.parent_span_id is None:
                    rooted.add(tid)
                # A trace's counters start at its first step that is not "other" (a trace of
                # HTTP and database spans never has any), from every span buffered by then,
                # this one too.
                if early_checks:
                    state = early_state.get(tid)
                    if state is not None:
                        state.add(normalised)
                    elif normalised.kind != "other":
                        state = early_state[tid] = self.watch.state(intake.span_ids(tid))
                        for buffered in intake.buffered_spans(tid):
                            state.add(buffered)
                    if normalised.kind != "other":
                        out.touched[tid] = None
            elif outcome is AddOutcome.DUPLICATE or outcome is AddOutcome.CONFLICTING_DUPLICATE:
                # Not lost: the first copy went on. Neither a second step nor sent twice.
                out.resent += 1
                out.dropped[outcome.value] = out.dropped.get(outcome.value, 0) + 1
            else:
                out.taken += 1
                out.unchecked_by[outcome.value] = out.unchecked_by.get(outcome.value, 0) + 1
                (out.late if outcome is AddOutcome.LATE else out.unchecked).append(payload)
                if (
                    early_checks and outcome is AddOutcome.LATE and normalised is not None
                    and normalised.kind != "other" and intake.tombstone(normalised.trace_id) is not None
                ):  # fmt: skip
                    out.tombstoned[normalised.trace_id] = None
        return out


def held_bytes(span: bytes) -> int:
    """What a buffered span holds, estimated: the received span (kept to be forwarded), its
    decoded values (about as much again) and the allocator's share (measured: an 8 MiB span
    held about 23 MiB of RSS), plus the objects around a small span."""
    return 3 * len(span) + 1024
