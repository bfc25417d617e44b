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
from typing import Any

import grpc
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_plumb.assemble import AddOutcome, Assembler, AssemblyLimits, Finished, build_trajectory
from otel_plumb.check import CompiledPolicy, load_policies
from otel_plumb.export.annotate import Origin, Payload, annotate, encode_requests, verdict_span_request
from otel_plumb.export.metrics import Metrics, metrics_app
from otel_plumb.export.otlp import OtlpExporter
from otel_plumb.export.verdict_log import VerdictLog
from otel_plumb.model import Trajectory, Verdict, trajectory_status
from otel_plumb.normalise import normalise
from otel_plumb.processor.config import ProcessorConfig, parse_hostport
from otel_plumb.receive import grpc_server, http_server
from otel_plumb.receive.otlp import attributes, span_record
from otel_plumb.receive.sink import IngestResult, Throttled
from otel_plumb.report.records import trajectory_record
from otel_plumb.watch import VerdictHub

log = logging.getLogger("otel_plumb.processor")

DecidedCallback = Callable[[dict[str, Any], Trajectory, list[Verdict]], None]


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
        self.assembler = Assembler(
            AssemblyLimits(
                idle_timeout_s=a.idle_timeout,
                max_wait_s=a.max_wait,
                max_traces=a.max_traces,
                max_spans_per_trace=a.max_spans_per_trace,
                group_by=a.group_by,
                session_idle_timeout_s=a.session_idle_timeout,
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
        self._callbacks: list[DecidedCallback] = []
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
        """Call ``callback(record, trajectory, verdicts)`` for every decided trajectory; returns
        a function that removes it. Runs on the processor's loop: keep it quick."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback)

    async def start(self) -> None:
        cfg = self.config
        max_bytes = int(cfg.receivers.max_message_mib * 1024 * 1024)
        if self.exporter is not None:
            await self.exporter.start()
            if self._annotate:
                await self._replay_journal()
        if cfg.receivers.grpc.enabled:
            self._grpc = grpc_server.create_server(max_bytes)
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
                http_server.traces_app(self, max_bytes), cfg.receivers.http.endpoint, "OTLP/HTTP"
            )
        if cfg.metrics.endpoint:
            self.metrics_port = await self._serve(
                metrics_app(self.metrics, lambda: self.ready), cfg.metrics.endpoint, "metrics"
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

    async def _serve(self, app: web.Application, endpoint: str, what: str) -> int:
        host, port = parse_hostport(endpoint)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(f"cannot listen on {endpoint} for {what}: {exc.strerror}") from exc
        self._runners.append(runner)
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        return int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

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
            await self._decide(self.assembler.drain(time.monotonic()))
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
        log.warning("malformed OTLP request on %s: %s", receiver, reason)

    def _check_capacity(self) -> None:
        retry_after = self.config.receivers.retry_after
        if self._stopping or not self._started:
            raise Throttled(retry_after, "otel-plumb is shutting down", overloaded=False)
        if self.assembler.spans_buffered + self._incoming >= self.config.receivers.max_buffered_spans:
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
                    # Passthrough: forwarded as received before anything else; the verdict follows.
                    await self.exporter.submit([(raw or request.SerializeToString(), count)])
            return await self._take(request, receiver, journal_id)
        finally:
            self._incoming -= count

    async def _take(
        self,
        request: ExportTraceServiceRequest,
        receiver: str,
        journal_id: int,
        skip_traces: set[bytes] | frozenset[bytes] = frozenset(),
    ) -> IngestResult:
        """Normalise and buffer every span of a request (but those of ``skip_traces``)."""
        now = time.monotonic()
        accepted = rejected = 0
        # Forwarded unchecked: spans of decided traces (late), and spans of traces still in flight
        # (over the span limit, unreadable) whose other spans must still be replayable.
        late: list[Payload] = []
        unchecked: list[Payload] = []
        touched: dict[str, bool] = {}
        finished: list[Finished] = []
        early_checks = self._early_checks
        for rs in request.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                origin = Origin(rs, ss)
                scope_name = ss.scope.name
                for span in ss.spans:
                    if len(span.trace_id) != 16 or len(span.span_id) != 8:
                        rejected += 1
                        continue
                    if skip_traces and span.trace_id in skip_traces:
                        continue
                    accepted += 1
                    try:
                        normalised = normalise(span_record(span, resource, scope_name))
                    except Exception:  # a span nobody can read is still forwarded, never lost
                        log.exception("cannot read span %s; forwarding it unchecked", span.span_id.hex())
                        self.metrics.spans_unchecked.labels("unreadable").inc()
                        unchecked.append((span, origin, span.span_id.hex(), journal_id))
                        continue
                    payload: Payload = (span, origin, normalised.span_id, journal_id)
                    outcome, evicted = self.assembler.add(normalised, payload, now)
                    finished.extend(evicted)
                    if outcome is AddOutcome.ACCEPTED:
                        tid = normalised.trace_id
                        self._last_arrival[tid] = now
                        if normalised.parent_span_id is None:
                            self._rooted.add(tid)
                        if early_checks:
                            touched[tid] = touched.get(tid, False) or normalised.kind != "other"
                    else:
                        self.metrics.spans_unchecked.labels(outcome.value).inc()
                        (late if outcome is AddOutcome.LATE else unchecked).append(payload)
        if journal_id and accepted:  # counted per request, not per span
            self._journal_pending[journal_id] = self._journal_pending.get(journal_id, 0) + accepted
        if accepted:
            self.metrics.spans_received.labels(receiver).inc(accepted)
        if rejected:
            self.metrics.spans_dropped.labels("malformed").inc(rejected)
        self.metrics.traces_in_flight.set(self.assembler.traces_in_flight)
        if early_checks:
            for tid, has_steps in touched.items():
                # Once the root span (which ends last) is in, the full verdict is one idle_timeout
                # away: early checks are for trajectories still running.
                if has_steps and tid not in self._rooted and not self.assembler.is_decided(tid):
                    self._early_check(tid)
        if finished:
            async with self._decide_lock:
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

    def _early_check(self, trace_id: str) -> None:
        """Report certain failures (never_call, precedes, call_count max, budget) on a trace
        still in flight, once each; the full evaluation follows at completion."""
        spans = self.assembler.buffered_spans(trace_id)
        partial = build_trajectory(trace_id, spans, complete=False, incomplete_reason="in_flight")
        new: list[Verdict] = []
        reported = self._early.setdefault(trace_id, set())
        for policy in self.policies:
            if not policy.applies_to(partial):
                continue
            for v in policy.early_failures(partial):
                if (v.policy, v.invariant) not in reported:
                    reported.add((v.policy, v.invariant))
                    new.append(v)
        if not reported:
            del self._early[trace_id]
        if not new:
            return
        exemplar = {"trace_id": trace_id}
        for v in new:
            self.metrics.violations.labels(v.policy, v.invariant, v.severity).inc(exemplar=exemplar)
            log.info(
                "early verdict: trace %s violates %s/%s (%s) at step %s: %s",
                trace_id, v.policy, v.invariant, v.severity, v.step_index, v.message,
            )
        record = trajectory_record(partial, new, sorted({v.policy for v in new}))
        record["decision"] = "early"
        self.hub.publish(record)

    def _evaluate(self, trajectory: Trajectory) -> tuple[list[str], list[Verdict]]:
        names: list[str] = []
        verdicts: list[Verdict] = []
        for policy in self.policies:
            if policy.applies_to(trajectory):
                names.append(policy.name)
                verdicts.extend(policy.evaluate(trajectory))
        return names, verdicts

    async def _decide(self, finished: Iterable[Finished]) -> None:
        """Check, record and export each finished trajectory."""
        out: list[Payload] = []
        verdict_spans: list[ExportTraceServiceRequest] = []
        now = time.monotonic()
        for f in finished:
            trajectory = f.trajectory()
            names, verdicts = self._evaluate(trajectory)
            status = trajectory_status(trajectory, verdicts)
            last = max((self._last_arrival.pop(t, f.first_seen) for t in f.trace_ids), default=f.first_seen)
            early: set[tuple[str, str]] = set()
            for t in f.trace_ids:
                early |= self._early.pop(t, set())
                self._rooted.discard(t)
            new_failures = [v for v in verdicts if v.verdict == "fail" and (v.policy, v.invariant) not in early]
            self.metrics.record_trajectory(trajectory, new_failures, verdicts, status, names, now - last)
            self.trajectories_decided += 1
            # The record is built only when someone reads it (it costs as much as a check).
            # (VerdictHub has no public "anyone listening?": its subscriber set is read directly.)
            if self._verdict_log is not None or self._callbacks or self.hub.has_subscribers:
                record = trajectory_record(trajectory, verdicts, names)
                record["decision"] = "final"
                if self._verdict_log is not None:
                    self._verdict_log.write(record)
                self.hub.publish(record)
                for callback in list(self._callbacks):
                    try:
                        callback(record, trajectory, verdicts)
                    except Exception:
                        log.exception("on_decided callback failed")
            if status == "violating":
                failed = sorted({f"{v.policy}/{v.invariant}" for v in verdicts if v.verdict == "fail"})
                log.info("verdict: trace %s %s (%s)", trajectory.trace_id, status, ", ".join(failed))
            else:
                log.debug("verdict: trace %s %s", trajectory.trace_id, status)
            if self.exporter is None:
                continue
            if self._annotate:
                payloads: list[Payload] = f.payloads  # type: ignore[assignment]
                annotate(payloads, trajectory, status, names, verdicts)
                out.extend(payloads)
            elif trajectory.trace_id:
                verdict_spans.append(verdict_span_request(trajectory, status, names, verdicts))
        self.metrics.flush()
        if self._verdict_log is not None:
            self._verdict_log.flush()
        self.metrics.traces_in_flight.set(self.assembler.traces_in_flight)
        if out:
            await self._submit(out)
        if verdict_spans:
            assert self.exporter is not None
            await self.exporter.submit([(request.SerializeToString(), 1) for request in verdict_spans])

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
                finished = self.assembler.due(time.monotonic())
                if finished:
                    async with self._decide_lock:
                        await self._decide(finished)
            except Exception:
                log.exception("deciding trajectories failed")


def _span_count(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
