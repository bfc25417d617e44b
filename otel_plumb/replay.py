"""Offline replay: trace files -> spans -> normalised spans -> trajectories.

The same intake (normalise, de-duplicate, assemble) as the live processor, driven by the
files instead of the network. Only normalised spans are buffered, and a trace is assembled once its root has
been read and ``window_spans`` further spans went by without one of its own: files are
written as traces end, so memory stays bounded by the window, not by the file. Nothing is
printed here; the commands, campaigns and reports call it.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final, Literal

from otel_plumb.assemble import AddOutcome, AssemblyLimits
from otel_plumb.intake import Intake, Source
from otel_plumb.model import SpanRecord, Trajectory
from otel_plumb.receive.files import ReadError, read_batches

GroupBy = Literal["trace", "session"]
# How many later spans a trace waits, after its last span, for stragglers (other services,
# late exporters) before it is assembled.
DEFAULT_WINDOW_SPANS: Final = 50_000
# Errors kept with their location; past this only the count grows.
MAX_ERRORS_KEPT: Final = 1_000
_DUE_EVERY: Final = 1_024


@dataclass(slots=True)
class FileStats:
    path: str
    spans: int = 0
    errors: int = 0


@dataclass(slots=True)
class ReplayStats:
    """What reading produced, besides the trajectories."""

    files: list[FileStats] = field(default_factory=list)
    spans: int = 0
    # Spans of a trace already assembled (arrived more than the window later), left out.
    late_spans: int = 0
    # Spans past the per-trace limit, left out (the trajectory is then incomplete).
    over_limit_spans: int = 0
    # Spans read a second time (same trace and span id), counted once.
    duplicate_spans: int = 0
    errors: list[ReadError] = field(default_factory=list)
    errors_total: int = 0

    def add_error(self, error: ReadError) -> None:
        self.errors_total += 1
        if len(self.errors) < MAX_ERRORS_KEPT:
            self.errors.append(error)


@dataclass(slots=True)
class ReplayResult:
    trajectories: list[Trajectory]
    stats: ReplayStats

    @property
    def errors(self) -> list[ReadError]:
        return self.stats.errors


def replay_limits(group_by: GroupBy = "trace", window_spans: int = DEFAULT_WINDOW_SPANS) -> AssemblyLimits:
    """Assembly limits for replay. Time is counted in spans read, so "idle" means "no span of
    this trace among the last ``window_spans`` spans"; nothing is cut short by wall-clock.
    Sessions are held to the end of the input: a conversation may span the whole file."""
    return AssemblyLimits(
        idle_timeout_s=float(window_spans),
        max_wait_s=float("inf"),
        max_traces=1_000_000,
        max_spans_per_trace=100_000,
        group_by=group_by,
        session_idle_timeout_s=float("inf"),
        # A span read again anywhere in the input is a duplicate (bounded by the span count).
        decided_ttl_s=float("inf"),
    )


def iter_trajectories(
    paths: Iterable[str | os.PathLike[str]],
    stats: ReplayStats,
    *,
    group_by: GroupBy = "trace",
    window_spans: int = DEFAULT_WINDOW_SPANS,
) -> Iterator[Trajectory]:
    """Trajectories as they are assembled (streaming); ``stats`` is filled in along the way.

    An unreadable line or record of a file marks every trajectory of that file still being
    assembled, and every one the file feeds after it, incomplete: nothing says which trace it
    held. Trajectories let go before it (no span of theirs for ``window_spans`` spans) are not
    marked: a span of theirs that far on would have been left out as late anyway.

    Exhaust the iterator or ``close()`` it: Python's cyclic garbage collector is paused until then.
    """
    intake = Intake(replay_limits(group_by, window_spans))
    add, due = intake.add, intake.due
    clock = 0
    due_every = max(1, min(_DUE_EVERY, window_spans // 4))
    next_due = due_every
    # The pipeline makes no reference cycles, and cyclic collection passes over the
    # growing set of buffered spans cost a fifth of replay time: paused while reading.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for path in paths:
            file_stats = FileStats(os.fspath(path))
            stats.files.append(file_stats)
            source = Source(file_stats.path)
            for batch in read_batches(path):
                for item in batch:
                    if not isinstance(item, SpanRecord):
                        file_stats.errors += 1
                        stats.add_error(item)
                        intake.unreadable(source, f"{item.location}: {item.message}", item.trace_id)
                        continue
                    clock += 1
                    outcome, _ = add(item, None, float(clock), source)
                    if outcome is AddOutcome.ACCEPTED:
                        continue
                    if outcome is AddOutcome.DUPLICATE or outcome is AddOutcome.CONFLICTING_DUPLICATE:
                        stats.duplicate_spans += 1
                    elif outcome is AddOutcome.LATE:
                        stats.late_spans += 1
                    elif outcome is AddOutcome.OVER_LIMIT:
                        stats.over_limit_spans += 1
                    else:
                        file_stats.errors += 1
                        message = f"span {item.span_id} ({item.name!r}): could not be read"
                        stats.add_error(ReadError(file_stats.path, message, trace_id=item.trace_id))
                file_stats.spans = clock - stats.spans
                if clock >= next_due:
                    next_due = clock + due_every
                    for done in due(float(clock)):
                        yield intake.trajectory(done)
            stats.spans = clock
        for done in intake.drain(float(clock)):
            yield intake.trajectory(done)
    finally:
        if gc_was_enabled:
            gc.enable()


def replay(
    paths: Iterable[str | os.PathLike[str]],
    *,
    group_by: GroupBy = "trace",
    window_spans: int = DEFAULT_WINDOW_SPANS,
) -> ReplayResult:
    """All trajectories of the files, in order of start time."""
    stats = ReplayStats()
    trajectories = list(iter_trajectories(paths, stats, group_by=group_by, window_spans=window_spans))
    trajectories.sort(key=lambda t: (t.start_ns, t.key))
    return ReplayResult(trajectories, stats)
