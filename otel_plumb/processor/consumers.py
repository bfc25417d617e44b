"""Where decided trajectories go: one small interface, one consumer per destination.

The processor hands every batch of decisions (final verdicts of finished trajectories, and
early failures of trajectories still in flight) to each consumer in turn: metrics, log lines,
the verdict log, the Watch hub, callbacks (campaigns, the demo, tests) and the OTLP export.
What leaves the process (log lines, the verdict log, Watch, the export) reads ``emitted``, the
decision after redaction; callbacks run in the process and get the real values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from otel_plumb.check import budget_exceeded
from otel_plumb.consistency import PathAgreement
from otel_plumb.export.annotate import Forwarded
from otel_plumb.export.counts import DecisionCounts
from otel_plumb.export.metrics import Metrics
from otel_plumb.export.verdict_log import VerdictLog
from otel_plumb.model import Decided, Verdict
from otel_plumb.redact import Scrub
from otel_plumb.report.records import decided_record
from otel_plumb.store import StoreWriter
from otel_plumb.watch import VerdictHub

log = logging.getLogger("otel_plumb.processor")

DecidedCallback = Callable[[Decided], None]


@dataclass(slots=True)
class Decision:
    """One decided trajectory as the processor hands it on."""

    decided: Decided
    # The received spans of the trajectory (forwarded by the export consumer); none when early.
    payloads: list[Forwarded] = field(default_factory=list)
    # From the trajectory's last span to its decision.
    latency_s: float = 0.0
    # Failures not already reported early (so each violation is counted once).
    new_failures: list[Verdict] = field(default_factory=list)
    # Late spans of the trajectory's traces from the request that let them go, forwarded with
    # the payloads, unannotated (``Processor._take``).
    late: list[Forwarded] = field(default_factory=list)
    # The decision as it may leave the process, and the replacements that made it (set by the
    # processor when redaction is configured; the export scrubs forwarded spans with the same).
    redacted: Decided | None = None
    scrub: Scrub | None = None
    _record: dict[str, Any] | None = None

    @property
    def emitted(self) -> Decided:
        return self.decided if self.redacted is None else self.redacted

    @property
    def record(self) -> dict[str, Any]:
        """The JSON record of ``emitted``, built once for every consumer that needs it (it costs
        as much as a check)."""
        if self._record is None:
            self._record = decided_record(self.emitted)
        return self._record

    @property
    def stored_record(self) -> dict[str, Any]:
        """The record for the trajectory store: ``record`` when built already, else one with its
        steps as a table (half the JSON)."""
        return self._record if self._record is not None else decided_record(self.emitted, steps_as_table=True)


class DecisionConsumer(Protocol):
    async def consume(self, decisions: Sequence[Decision]) -> None: ...


class MetricsConsumer:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.counts = DecisionCounts(budget_exceeded)

    async def consume(self, decisions: Sequence[Decision]) -> None:
        counts = self.counts
        for d in decisions:
            if d.decided.decision == "early":
                counts.early(d.decided)
            else:
                counts.final(d.decided, d.new_failures, d.latency_s)
        self.metrics.add(counts)


class LogConsumer:
    """A log line per violation (info) and per other verdict (debug), naming the task key."""

    async def consume(self, decisions: Sequence[Decision]) -> None:
        if not log.isEnabledFor(logging.INFO):
            return  # the usual level (warning): nothing to build the lines for
        for d in decisions:
            decided = d.emitted
            t = decided.trajectory
            who = t.trace_id if t.key == t.trace_id else f"{t.key} (trace {t.trace_id})"
            if decided.decision == "early":
                for v in decided.verdicts:
                    log.info("early verdict: %s violates %s/%s (%s) at span %s: %s",
                             who, v.policy, v.invariant, v.severity, v.span_id, v.message)  # fmt: skip
            elif decided.status == "violating":
                failed = sorted({f"{v.policy}/{v.invariant}" for v in decided.failures})
                log.info("verdict: %s violating (%s)", who, ", ".join(failed))
            else:
                log.debug("verdict: %s %s", who, decided.status)


class VerdictLogConsumer:
    def __init__(self, verdict_log: VerdictLog) -> None:
        self.verdict_log = verdict_log

    async def consume(self, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            if d.decided.decision == "final":
                self.verdict_log.write(d.record)
        self.verdict_log.flush()


class HubConsumer:
    def __init__(self, hub: VerdictHub) -> None:
        self.hub = hub

    async def consume(self, decisions: Sequence[Decision]) -> None:
        if not self.hub.has_subscribers:
            return
        for d in decisions:
            self.hub.publish(d.record)


class ConsistencyConsumer:
    """Final decisions into the path agreement windows; their shares and changes to metrics."""

    def __init__(self, agreement: PathAgreement, metrics: Metrics) -> None:
        self.agreement = agreement
        self.metrics = metrics

    async def consume(self, decisions: Sequence[Decision]) -> None:
        m = self.metrics
        for d in decisions:
            for a in self.agreement.add(d.decided):
                m.path_agreement.labels(a.policy, a.group).set(a.share)
                m.path_agreement_trajectories.labels(a.policy, a.group).set(a.trajectories)
                if a.changed:
                    m.path_changes.labels(a.policy, a.group).inc()


class StoreConsumer:
    """Final decisions, as emitted (redacted), to the console's trajectory store."""

    def __init__(self, writer: StoreWriter) -> None:
        self.writer = writer

    async def consume(self, decisions: Sequence[Decision]) -> None:
        records = [d.stored_record for d in decisions if d.decided.decision == "final"]
        if records:
            self.writer.offer(records)


class CallbackConsumer:
    """Calls each registered callback with every final decision; a failing callback is logged."""

    def __init__(self) -> None:
        self.callbacks: list[DecidedCallback] = []

    async def consume(self, decisions: Sequence[Decision]) -> None:
        if not self.callbacks:
            return
        for d in decisions:
            if d.decided.decision != "final":
                continue
            for callback in list(self.callbacks):
                try:
                    callback(d.decided)
                except Exception:
                    log.exception("on_decided callback failed")
