"""The live processor: receivers -> normalise -> assemble -> check -> metrics, verdict log,
Watch hub and annotated OTLP export, on one asyncio loop.

Embedding (campaigns, tests, the demo)::

    processor = Processor(load_config(None, {"receivers.grpc.endpoint": "127.0.0.1:0"}))
    await processor.start()
    processor.grpc_port, processor.http_port, processor.metrics_port   # real ports after start
    unsubscribe = processor.on_decided(lambda record, trajectory, verdicts: ...)
    ...
    await processor.stop()   # drain: decide everything buffered, flush the export queue
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence

import grpc
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_plumb.assemble import AddOutcome, AssemblyLimits, Finished, build_trajectory
from otel_plumb.check import CompiledPolicy, decide, load_policies
from otel_plumb.export.annotate import Origin, Payload, annotate, encode_requests, verdict_span_request
from otel_plumb.export.metrics import Metrics, metrics_app
from otel_plumb.export.otlp import OtlpExporter
from otel_plumb.export.verdict_log import VerdictLog
from otel_plumb.intake import Intake, Source
from otel_plumb.model import Decided, Verdict
from otel_plumb.processor.config import ProcessorConfig, parse_hostport
from otel_plumb.processor.consumers import (
    CallbackConsumer,
    DecidedCallback,
    Decision,
    DecisionConsumer,
    HubConsumer,
    LogConsumer,
    MetricsConsumer,
    VerdictLogConsumer,
)
from otel_plumb.ratelimit import RateLimitedLog
from otel_plumb.receive import connections, grpc_server, http_server
from otel_plumb.receive.otlp import attributes, span_record
from otel_plumb.receive.sink import IngestResult, Throttled
from otel_plumb.watch import VerdictHub

log = logging.getLogger("otel_plumb.processor")
_malformed_log = RateLimitedLog(log)
# The metrics endpoint's connections (scrapers, probes): few, and closed when idle.
METRICS_MAX_CONNECTIONS = 64
METRICS_IDLE_TIMEOUT = 60.0


def load_policy_files(paths: Sequence[str]) -> list[CompiledPolicy]:
    """Compile the policy files (raises ``PolicyError`` naming file and line)."""
    return load_policies(list(paths)) if paths else []


class Processor:
    def __init__(self, config: ProcessorConfig, policies: Sequence[CompiledPolicy] | None = None) -> None:
        self.config = config
        self.policies = list(policies) if policies is not None else load_policy_files(config.policies)
        # Early checks build a partial trajectory per touched trace: only worth it when some
        # invariant can fail early.
        self._early_checks = any(inv.early for p in self.policies for inv in p.invariants)
        a = config.assembly
        self.intake = Intake(
            AssemblyLimits(
                idle_timeout_s=a.idle_timeout,
                max_wait_s=a.max_wait,
                max_traces=a.max_traces,
                max_spans_per_trace=a.max_spans_per_trace,
                group_by=a.group_by,
                session_idle_timeout_s=a.session_idle_timeout,
                decided_ttl_s=a.decided_ttl,
                decided_max_traces=a.decided_max_traces,
                decided_max_spans=a.decided_max_spans,
            )
        )
        self.hub = VerdictHub()
        self.metrics = Metrics(config.metrics.max_label_values)
        self.exporter: OtlpExporter | None = (
            OtlpExporter(config.exporters.otlp, self.metrics) if config.exporters.otlp is not None else None
        )
        self._annotate = config.exporters.otlp is not None and config.exporters.otlp.mode == "annotate"
        self._batch_spans = config.exporters.otlp.queue.batch_spans if config.exporters.otlp else 2048
        self._verdict_log = VerdictLog(config.verdict_log.path) if config.verdict_log.path else None
        self._callbacks = CallbackConsumer()
        # Every decision goes to each of these, in order: counted, logged, recorded, streamed,
        # handed to callbacks, exported.
        self.consumers: list[DecisionConsumer] = [MetricsConsumer(self.metrics), LogConsumer()]
        if self._verdict_log is not None:
            self.consumers.append(VerdictLogConsumer(self._verdict_log))
        self.consumers += [HubConsumer(self.hub), self._callbacks]
        if self.exporter is not None:
            self.consumers.append(_ExportConsumer(self))
        # Per trace in flight: when its last span arrived (decision latency), and which
        # early failures were already reported (so they are reported and counted once).
        self._last_arrival: dict[str, float] = {}
        self._early: dict[str, set[tuple[str, str]]] = {}
        self._rooted: set[str] = set()
        self._incoming = 0  # spans of requests accepted but not yet buffered
        # Spans not yet queued for export, per journaled request.
        self._journal_pending: dict[int, int] = {}
        self._grpc: grpc.aio.Server | None = None
        self._runners: list[web.AppRunner] = []
        self._tick_task: asyncio.Task[None] | None = None
        self._decide_lock = asyncio.Lock()
        self._stopping = False
        self._started = False
        self._stopped = False
        self._flushed = False
        self.grpc_port: int | None = None
        self.http_port: int | None = None
        self.metrics_port: int | None = None
        self.trajectories_decided = 0

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._started and not self._stopping

    def on_decided(self, callback: DecidedCallback) -> Callable[[], None]:
        """Call ``callback(decided)`` for every final decision; returns a function that removes
        it. Runs on the processor's loop: keep it quick."""
        self._callbacks.callbacks.append(callback)
        return lambda: self._callbacks.callbacks.remove(callback)

    async def start(self) -> None:
        cfg = self.config
        max_bytes = int(cfg.receivers.max_message_mib * 1024 * 1024)
        if self.exporter is not None:
            await self.exporter.start()
            if self._annotate:
                await self._replay_journal()
        receivers = cfg.receivers
        wanted = {"metrics": METRICS_MAX_CONNECTIONS} if cfg.metrics.endpoint else {}
        if receivers.grpc.enabled:
            wanted["grpc"] = receivers.grpc.max_connections
        if receivers.http.enabled:
            wanted["http"] = receivers.http.max_connections
        caps = connections.connection_caps(wanted)
        if cfg.receivers.grpc.enabled:
            self._grpc = grpc_server.create_server(
                max_bytes,
                idle_timeout=receivers.grpc.idle_timeout,
                max_connections=caps["grpc"],
                max_concurrent_streams=receivers.grpc.max_concurrent_streams,
            )
            self._grpc.add_generic_rpc_handlers((grpc_server.trace_service_handler(self),))
            from otel_plumb.watch.service import add_verdict_service

            add_verdict_service(self._grpc, self.hub)
            host, port = parse_hostport(cfg.receivers.grpc.endpoint)
            try:
                self.grpc_port = self._grpc.add_insecure_port(f"{host}:{port}")
            except RuntimeError as exc:  # grpcio raises this when the address is taken
                raise OSError(f"cannot listen on {cfg.receivers.grpc.endpoint} for OTLP/gRPC: {exc}") from exc
            if self.grpc_port == 0:
                raise OSError(f"cannot listen on {cfg.receivers.grpc.endpoint} for OTLP/gRPC")
            await self._grpc.start()
        if cfg.receivers.http.enabled:
            self.http_port = await self._serve(
                http_server.traces_app(self, max_bytes, body_timeout=receivers.http.idle_timeout),
                cfg.receivers.http.endpoint,
                "OTLP/HTTP",
                caps["http"],
                receivers.http.idle_timeout,
                auto_decompress=False,  # the receiver inflates bodies itself, within the size limit
            )
        if cfg.metrics.endpoint:
            self.metrics_port = await self._serve(
                metrics_app(self.metrics, lambda: self.ready),
                cfg.metrics.endpoint,
                "metrics",
                caps["metrics"],
                METRICS_IDLE_TIMEOUT,
            )
        self._tick_task = asyncio.create_task(self._tick())
        self._started = True
        log.info(
            "otel-plumb listening: otlp grpc %s, otlp http %s, metrics %s; %d policies; export %s",
            self._addr(cfg.receivers.grpc.endpoint, self.grpc_port),
            self._addr(cfg.receivers.http.endpoint, self.http_port),
            self._addr(cfg.metrics.endpoint, self.metrics_port),
            len(self.policies),
            cfg.exporters.otlp.endpoint if cfg.exporters.otlp else "none",
        )

    @staticmethod
    def _addr(endpoint: str, port: int | None) -> str:
        return f"{parse_hostport(endpoint)[0]}:{port}" if port is not None else "off"

    async def _serve(
        self, app: web.Application, endpoint: str, what: str, max_connections: int, idle_timeout: float, **kwargs: bool
    ) -> int:
        """Serve ``app`` with bounded, idle-closing connections (``receive.connections``)."""
        host, port = parse_hostport(endpoint)
        try:
            runner, bound, _limiter = await connections.serve(
                app, host, port, what, max_connections, idle_timeout, **kwargs
            )
        except OSError as exc:
            raise OSError(f"cannot listen on {endpoint} for {what}: {exc.strerror}") from exc
        self._runners.append(runner)
        return bound

    async def stop(self, grace: float | None = None) -> bool:
        """Drain: refuse new requests (retryable), decide everything buffered, and wait up to
        ``grace`` seconds (default: config shutdown.grace_period) for the backend to take the
        export queue. Returns True when nothing was left waiting (what is left stays on disk).
        Calling it again does nothing."""
        if self._stopped:
            return self._flushed
        grace = self.config.shutdown.grace_period if grace is None else grace
        deadline = time.monotonic() + grace
        self._stopping = True
        if self._grpc is not None:
            # Lets in-flight Export calls finish; new ones are refused as retryable.
            await self._grpc.stop(min(1.0, grace))
        if self._tick_task is not None:
            self._tick_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tick_task
        async with self._decide_lock:
            await self._decide(self.intake.drain(time.monotonic()))
        flushed = True
        if self.exporter is not None:
            flushed = await self.exporter.flush(max(0.0, deadline - time.monotonic()))
            await self.exporter.stop()
        # The metrics endpoint goes last so the final values can still be scraped while draining.
        for runner in self._runners:
            await runner.cleanup()
        self._runners = []
        if self._verdict_log is not None:
            self._verdict_log.close()
        self.hub.close()
        self._started = False
        self._stopped, self._flushed = True, flushed
        return flushed

    # ---- receive -------------------------------------------------------------------------------

    def malformed(self, receiver: str, reason: str) -> None:
        self.metrics.spans_dropped.labels("malformed").inc()
        # A flood of bad requests logs a line per interval (with the count), not one each.
        _malformed_log.warning(f"malformed:{receiver}", "malformed OTLP request on %s: %s", receiver, reason)

    def _check_capacity(self) -> None:
        retry_after = self.config.receivers.retry_after
        if self._stopping or not self._started:
            raise Throttled(retry_after, "otel-plumb is shutting down", overloaded=False)
        if self.intake.spans_buffered + self._incoming >= self.config.receivers.max_buffered_spans:
            raise Throttled(retry_after, "otel-plumb is at its limit of buffered spans; retry later")
        if self.exporter is not None and self.exporter.full:
            raise Throttled(retry_after, "otel-plumb export queue is full; retry later")

    async def ingest(self, request: ExportTraceServiceRequest, receiver: str, raw: bytes | None = None) -> IngestResult:
        """Take a request's spans (see ``SpanSink.ingest``)."""
        self._check_capacity()
        # Requests between the capacity check and the buffers count against the limit, so that
        # many concurrent requests cannot all pass the check at once.
        count = _span_count(request)
        self._incoming += count
        try:
            journal_id = 0
            if self.exporter is not None:
                if self._annotate:
                    # Durable before the client hears "ok": replayed after a crash until its spans
                    # are queued for export.
                    journal_id = await self.exporter.journal(raw or request.SerializeToString())
                else:
                    # Passthrough: forwarded as received before anything else (resent spans left
                    # out); the verdict follows.
                    forward = self._without_resent(request)
                    if forward is not None:
                        await self.exporter.submit([(forward.SerializeToString(), _span_count(forward))])
                    else:
                        await self.exporter.submit([(raw or request.SerializeToString(), count)])
            return await self._take(request, receiver, journal_id)
        finally:
            self._incoming -= count

    def _without_resent(self, request: ExportTraceServiceRequest) -> ExportTraceServiceRequest | None:
        """A copy of the request without the spans taken before (or twice in it); None when
        there are none, the usual case."""
        seen: set[tuple[bytes, bytes]] = set()
        resent: list[tuple[int, int, int]] = []
        has_span = self.intake.has_span
        for i, rs in enumerate(request.resource_spans):
            for j, ss in enumerate(rs.scope_spans):
                for k, span in enumerate(ss.spans):
                    ids = (span.trace_id, span.span_id)
                    if ids in seen or has_span(span.trace_id.hex(), span.span_id.hex()):
                        resent.append((i, j, k))
                    seen.add(ids)
        if not resent:
            return None
        copy = ExportTraceServiceRequest()
        copy.CopyFrom(request)
        for i, j, k in reversed(resent):
            del copy.resource_spans[i].scope_spans[j].spans[k]
        return copy

    async def _take(
        self,
        request: ExportTraceServiceRequest,
        receiver: str,
        journal_id: int,
        skip_traces: set[bytes] | frozenset[bytes] = frozenset(),
    ) -> IngestResult:
        """Normalise and buffer every span of a request (but those of ``skip_traces``)."""
        now = time.monotonic()
        taken = rejected = resent = 0
        # Forwarded unchecked: spans of decided traces (late), and spans of traces still in flight
        # (over the span limit, unreadable) whose other spans must still be replayable.
        late: list[Payload] = []
        unchecked: list[Payload] = []
        touched: dict[str, bool] = {}
        early_checks = self._early_checks
        intake = self.intake
        source = Source(f"request on {receiver}")
        counted = self.metrics.spans_dropped
        for rs in request.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                origin = Origin(rs, ss)
                scope_name = ss.scope.name
                for span in ss.spans:
                    if len(span.trace_id) != 16 or len(span.span_id) != 8:
                        rejected += 1
                        # What else of its trace the rejected span held is unknown: the
                        # trajectories it may belong to are incomplete.
                        valid_trace = len(span.trace_id) == 16
                        intake.unreadable(
                            source, "a span without a valid trace_id/span_id was rejected",
                            span.trace_id.hex() if valid_trace else None,
                        )  # fmt: skip
                        continue
                    if skip_traces and span.trace_id in skip_traces:
                        continue
                    payload: Payload = (span, origin, span.span_id.hex(), journal_id)
                    try:
                        record = span_record(span, resource, scope_name)
                    except Exception as exc:  # a span nobody can decode is still forwarded, never lost
                        log.warning("cannot decode span %s; forwarding it unchecked: %s", payload[2], exc)
                        intake.unreadable(source, f"span {payload[2]} could not be decoded: {exc}", span.trace_id.hex())
                        outcome, normalised = AddOutcome.UNREADABLE, None
                    else:
                        outcome, normalised = intake.add(record, payload, now, source)
                    if outcome is AddOutcome.ACCEPTED:
                        taken += 1
                        assert normalised is not None
                        tid = normalised.trace_id
                        self._last_arrival[tid] = now
                        if normalised.parent_span_id is None:
                            self._rooted.add(tid)
                        if early_checks:
                            touched[tid] = touched.get(tid, False) or normalised.kind != "other"
                    elif outcome is AddOutcome.DUPLICATE or outcome is AddOutcome.CONFLICTING_DUPLICATE:
                        # Not lost: the first copy went on. Neither a second step nor sent twice.
                        resent += 1
                        counted.labels(outcome.value).inc()
                    else:
                        taken += 1
                        self.metrics.spans_unchecked.labels(outcome.value).inc()
                        (late if outcome is AddOutcome.LATE else unchecked).append(payload)
        if journal_id and taken:  # counted per request, not per span
            self._journal_pending[journal_id] = self._journal_pending.get(journal_id, 0) + taken
        if taken or resent:
            self.metrics.spans_received.labels(receiver).inc(taken + resent)
        if rejected:
            counted.labels("malformed").inc(rejected)
        self.metrics.traces_in_flight.set(intake.traces_in_flight)
        early: list[Decision] = []
        if early_checks:
            for tid, has_steps in touched.items():
                # Once the root span (which ends last) is in, the full verdict is one idle_timeout
                # away: early checks are for trajectories still running.
                if has_steps and tid not in self._rooted and not intake.is_decided(tid):
                    found = self._early_check(tid)
                    if found is not None:
                        early.append(found)
        finished = intake.ready()
        if early or finished:
            async with self._decide_lock:
                if early:
                    await self._consume(early)
                if finished:
                    await self._decide(finished)
        if late and self._annotate:
            await self._submit(late)
        if unchecked and self._annotate:
            await self._submit(unchecked, whole_traces=False)
        if journal_id and journal_id not in self._journal_pending and self.exporter is not None:
            await self.exporter.release([journal_id])  # nothing of it to export
        message = f"{rejected} spans without a valid trace_id/span_id" if rejected else ""
        return IngestResult(rejected, message)

    # ---- check ---------------------------------------------------------------------------------

    def _early_check(self, trace_id: str) -> Decision | None:
        """Failures already certain (never_call, precedes, call_count max, budget) on a trace
        still in flight, each reported once; the full evaluation follows at completion."""
        spans = self.intake.buffered_spans(trace_id)
        partial = build_trajectory(trace_id, spans, complete=False, incomplete_reason="in_flight")
        new: list[Verdict] = []
        reported = self._early.setdefault(trace_id, set())
        applied: list[str] = []
        # A tool call the model asked for may still arrive as a tool span (which may say it
        # failed, and a failed call did not happen): no early verdict rests on a request alone.
        requested_only = {s.span_id for s in partial.steps if s.source == "llm_output"}
        for policy in self.policies:
            if not policy.applies_to(partial):
                continue
            for v in policy.early_failures(partial):
                if v.span_id in requested_only:
                    continue
                if (v.policy, v.invariant) not in reported:
                    reported.add((v.policy, v.invariant))
                    new.append(v)
                    if policy.name not in applied:
                        applied.append(policy.name)
            task = policy.task_id(partial)
            if task is not None and partial.key == trace_id:
                partial.key = task
        if not reported:
            del self._early[trace_id]
        if not new:
            return None
        return Decision(Decided(partial, new, applied, "violating", "early"))

    async def _decide(self, finished: Iterable[Finished]) -> None:
        """Check each finished trajectory and hand the decisions to every consumer."""
        now = time.monotonic()
        decisions: list[Decision] = []
        for f in finished:
            decided = decide(self.policies, self.intake.trajectory(f))
            last = max((self._last_arrival.pop(t, f.first_seen) for t in f.trace_ids), default=f.first_seen)
            early: set[tuple[str, str]] = set()
            for t in f.trace_ids:
                early |= self._early.pop(t, set())
                self._rooted.discard(t)
            new_failures = [v for v in decided.failures if (v.policy, v.invariant) not in early]
            decisions.append(Decision(decided, f.payloads, now - last, new_failures))
        self.trajectories_decided += len(decisions)
        self.metrics.traces_in_flight.set(self.intake.traces_in_flight)
        await self._consume(decisions)

    async def _consume(self, decisions: list[Decision]) -> None:
        for consumer in self.consumers:
            await consumer.consume(decisions)

    async def _submit(self, payloads: list[Payload], whole_traces: bool = True) -> None:
        """Queue spans for export, and in the same transaction release the journaled requests
        whose last span this was. ``whole_traces``: the payloads hold every span their traces
        have in their journaled requests, so a replay can skip those traces."""
        if self.exporter is None:
            return
        done: set[tuple[int, bytes]] = set()
        released: list[int] = []
        pending = self._journal_pending
        for span, _, _, journal_id in payloads:
            if journal_id:
                if whole_traces:
                    done.add((journal_id, span.trace_id))
                left = pending[journal_id] - 1
                if left:
                    pending[journal_id] = left
                else:
                    del pending[journal_id]
                    released.append(journal_id)
        await self.exporter.submit(encode_requests(payloads, self._batch_spans), sorted(done), released)

    async def _replay_journal(self) -> None:
        """Requests acknowledged by a previous run that crashed before their spans were queued."""
        assert self.exporter is not None
        entries = await self.exporter.journaled()
        for journal_id, body, done in entries:
            await self._take(ExportTraceServiceRequest.FromString(body), "journal", journal_id, done)
        if entries:
            log.info("replayed %d journaled requests from a previous run", len(entries))

    async def _tick(self) -> None:
        interval = self.config.assembly.tick
        while True:
            await asyncio.sleep(interval)
            try:
                finished = self.intake.due(time.monotonic())
                if finished:
                    async with self._decide_lock:
                        await self._decide(finished)
            except Exception:
                log.exception("deciding trajectories failed")


class _ExportConsumer:
    """Annotate mode: the trajectory's spans go out with the verdict annotations. Passthrough:
    the spans went out as received; the verdict follows as one small span in the trace."""

    def __init__(self, processor: Processor) -> None:
        self.processor = processor

    async def consume(self, decisions: Sequence[Decision]) -> None:
        p = self.processor
        assert p.exporter is not None
        out: list[Payload] = []
        verdict_spans: list[ExportTraceServiceRequest] = []
        for d in decisions:
            decided = d.decided
            if decided.decision != "final":
                continue
            t = decided.trajectory
            if p._annotate:
                annotate(d.payloads, t, decided.status, decided.policies, decided.verdicts)
                out.extend(d.payloads)
            elif t.trace_id:
                verdict_spans.append(verdict_span_request(t, decided.status, decided.policies, decided.verdicts))
        if out:
            await p._submit(out)
        if verdict_spans:
            await p.exporter.submit([(request.SerializeToString(), 1) for request in verdict_spans])


def _span_count(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
