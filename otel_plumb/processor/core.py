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
import gc
import logging
import ssl
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, cast

import grpc
from aiohttp import web
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_plumb import tls
from otel_plumb.assemble import AssemblyLimits, Finished, build_trajectory
from otel_plumb.check import CompiledPolicy, ToolNames, decide, late_span_could_change, load_policies, redaction_for
from otel_plumb.check.early import EarlyState, EarlyWatch, in_flight, new_early_failures
from otel_plumb.configtypes import parse_hostport
from otel_plumb.consistency import PathAgreement
from otel_plumb.console import console_app
from otel_plumb.export.annotate import (
    Forwarded,
    JournalProgress,
    Origins,
    annotate,
    encode_requests,
    redact_forwarded,
    redact_span,
    span_ids_by_trace,
    verdict_span_request,
)
from otel_plumb.export.metrics import Metrics, metrics_app
from otel_plumb.export.otlp import OtlpExporter, StorageError
from otel_plumb.export.verdict_log import VerdictLog
from otel_plumb.intake import Intake, Source
from otel_plumb.model import Decided, SpanRecord, Trajectory
from otel_plumb.processor.config import ConfigError, ProcessorConfig, exposure_errors
from otel_plumb.processor.consumers import (
    CallbackConsumer,
    ConsistencyConsumer,
    DecidedCallback,
    Decision,
    DecisionConsumer,
    HubConsumer,
    LogConsumer,
    MetricsConsumer,
    StoreConsumer,
    VerdictLogConsumer,
)
from otel_plumb.processor.spans import PendingEarly, SpanTaker
from otel_plumb.ratelimit import RateLimitedLog
from otel_plumb.receive import auth, connections, grpc_server, http_server
from otel_plumb.receive.otlp import ReceivedRequest, UnreadSpan
from otel_plumb.receive.sink import IngestResult, Throttled
from otel_plumb.redact import Scrub
from otel_plumb.store import StoreWriter
from otel_plumb.tls import TLSServerConfig
from otel_plumb.watch import VerdictHub

log = logging.getLogger("otel_plumb.processor")
# Where the console is mounted on the metrics listener (with a console section).
CONSOLE_ROOT = "/console"
_malformed_log = RateLimitedLog(log)
# The metrics endpoint's connections (scrapers, probes): few, and closed when idle.
METRICS_MAX_CONNECTIONS = 64
METRICS_IDLE_TIMEOUT = 60.0

# At most one log line about evicted traces per this many seconds (with the count since the last).
EVICTION_LOG_INTERVAL = 10.0
# Cyclic garbage collection while running. The span path makes no reference cycles (a test
# holds it to that), but buffered spans are many small containers that every young collection
# walks (about 1 us each), and the collector counts allocations net of frees, so buffers filling
# up start one every GC_THRESHOLDS[0] objects: with 50,000, 3-5 us per span. So what start-up
# built is frozen out of the collector's sight, young collections wait for 500,000 net
# allocations, or GC_YOUNG_INTERVAL, whichever comes first (the few cycles the gRPC runtime
# makes per request are thus freed within a minute, and at most that many objects of them
# wait), and full ones come as Python paces them (when a quarter of the long-lived objects
# are new), which stays proportional to the spans taken.
GC_THRESHOLDS = (500_000, 50, 100)
GC_YOUNG_INTERVAL = 60.0
# How often the decided traces' memory on disk drops what it no longer holds.
DECIDED_FORGET_INTERVAL = 10.0


def load_policy_files(paths: Sequence[str]) -> list[CompiledPolicy]:
    """Compile the policy files (raises ``PolicyError`` naming file and line)."""
    return load_policies(list(paths)) if paths else []


def _verdict_of(decided: Decided) -> tuple[str, frozenset[tuple[str, str]]]:
    return decided.status, frozenset((v.policy, v.invariant) for v in decided.failures)


def _keys(decision: Decision | None) -> set[tuple[str, str]]:
    """The (policy, invariant) keys of an early decision's failures."""
    return set() if decision is None else {(v.policy, v.invariant) for v in decision.decided.verdicts}


class Processor:
    def __init__(self, config: ProcessorConfig, policies: Sequence[CompiledPolicy] | None = None) -> None:
        self.config = config
        self.policies = list(policies) if policies is not None else load_policy_files(config.policies)
        # Early checks keep counters per trace in flight (check.early): only worth it when some
        # invariant can fail early.
        self._early_checks = any(p.early_invariants for p in self.policies)
        self._early_watch = EarlyWatch(self.policies)
        self._early_state: dict[str, EarlyState] = {}
        a = config.assembly
        # Waiting for late spans is for traces: a session is decided long after its traces.
        self._confirm = a.confirm_wait > 0 and a.group_by == "trace"
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
                confirm_wait_s=a.confirm_wait,
            )
        )
        self.hub = VerdictHub()
        m = config.metrics
        self.metrics = Metrics(m.max_label_values, m.max_label_length, m.max_series)
        self.exporter: OtlpExporter | None = (
            OtlpExporter(config.exporters.otlp, self.metrics) if config.exporters.otlp is not None else None
        )
        self._annotate = config.exporters.otlp is not None and config.exporters.otlp.mode == "annotate"
        self._batch_spans = config.exporters.otlp.queue.batch_spans if config.exporters.otlp else 2048
        self._batch_bytes = config.exporters.otlp.queue.max_batch_bytes if config.exporters.otlp else None
        self._annotation_chars = config.exporters.otlp.max_annotation_chars if config.exporters.otlp else 1024
        self._verdict_log = VerdictLog(config.verdict_log.path) if config.verdict_log.path else None
        self.redaction = redaction_for(self.policies, config.redaction)
        # With redact_forwarded, the spans forwarded downstream are scrubbed too: those of a
        # decided trajectory with its rules, those forwarded before their trajectory is known
        # (passthrough, late, unchecked) with the global patterns only.
        forwarded = config.redaction is not None and config.redaction.redact_forwarded
        self._forward_redaction = self.redaction if forwarded else None
        self._forward_scrub = self._forward_redaction.redactor(()).scrub() if self._forward_redaction else None
        # A trace plainly no agent's run is decided without its steps (``plain_trajectory``).
        self._names_tool = ToolNames(self.policies)
        self._callbacks = CallbackConsumer()
        # Every decision goes to each of these, in order: counted, logged, recorded, streamed,
        # handed to callbacks, exported.
        self.consumers: list[DecisionConsumer] = [MetricsConsumer(self.metrics), LogConsumer()]
        if self._verdict_log is not None:
            self.consumers.append(VerdictLogConsumer(self._verdict_log))
        self.consumers += [HubConsumer(self.hub), self._callbacks]
        # The console's trajectory store: written on a thread of its own, never waited for.
        self._store = (
            StoreWriter(config.store, lambda outcome, n: self.metrics.store_records.labels(outcome).inc(n))
            if config.store is not None
            else None
        )
        if self._store is not None:
            self.consumers.append(StoreConsumer(self._store))
        if config.consistency is not None:
            self.consumers.append(ConsistencyConsumer(PathAgreement(config.consistency), self.metrics))
        if self.exporter is not None:
            self.consumers.append(_ExportConsumer(self))
        # Per trace in flight: which early failures were already reported (so they are reported
        # and counted once).
        self._early: dict[str, set[tuple[str, str]]] = {}
        # Early failures found, reported once they still hold confirm_wait later (a batch held
        # up by a retry may hold what undoes them): per trace, in deadline order.
        self._early_pending: dict[str, PendingEarly] = {}
        # Traces held for late spans (Assembler.wait_for_late_spans): the verdict they waited with.
        self._waited: dict[str, tuple[str, frozenset[tuple[str, str]]]] = {}
        self._rooted: set[str] = set()
        self._origins = Origins()
        self._spans = SpanTaker(self.intake, self._early_checks, self._early_watch, self._rooted, self._early_state)
        self._incoming = 0  # spans of requests accepted but not yet buffered
        self._incoming_bytes = 0  # and their bytes (the memory limiter counts them too)
        # Evictions not yet in a log line, and when the next line may be written.
        self._evicted_unlogged: dict[str, int] = {}
        self._eviction_log_at = 0.0
        # Spans not yet queued for export, per journaled request.
        self._journal_pending: dict[int, int] = {}
        # What could not be written while storage was failing, kept to be written later (in
        # order): spans of decided trajectories (with whole_traces), passthrough requests, and
        # journal entries to release. Submits go one at a time so the journal counts stay exact.
        self._held: list[tuple[list[Forwarded], bool]] = []
        self._held_requests: list[tuple[bytes, int]] = []
        self._held_decided: list[tuple[str, float, str]] = []  # passthrough's decided traces
        self._held_releases: list[int] = []
        self._submit_lock = asyncio.Lock()
        self._storage_log = RateLimitedLog(log)
        self._grpc: grpc.aio.Server | None = None
        self._runners: list[web.AppRunner] = []
        self._tick_task: asyncio.Task[None] | None = None
        # Set by stop: the tick ends after what it is doing (cancelled, it would drop the
        # decisions it was handing on).
        self._tick_stop = asyncio.Event()
        self._tls_tasks: list[asyncio.Task[None]] = []
        self._decide_lock = asyncio.Lock()
        self._stopping = False
        self._started = False
        self._gc_thresholds = gc.get_threshold()
        self._stopped = False
        self._flushed = False
        self.grpc_port: int | None = None
        self.http_port: int | None = None
        self.metrics_port: int | None = None
        self.trajectories_decided = 0

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Receivers listening, not shutting down, and the state directory writable."""
        storage_ok = self.exporter is None or self.exporter.storage_ok
        return self._started and not self._stopping and storage_ok

    def on_decided(self, callback: DecidedCallback) -> Callable[[], None]:
        """Call ``callback(decided)`` for every final decision; returns a function that removes
        it. Runs on the processor's loop: keep it quick."""
        self._callbacks.callbacks.append(callback)
        return lambda: self._callbacks.callbacks.remove(callback)

    async def start(self) -> None:
        cfg = self.config
        # Before anything binds: no listener open to the network without TLS or auth, unless asked.
        exposed = exposure_errors(cfg)
        if exposed:
            raise ConfigError("refusing to start: " + "\n".join(exposed))
        # TLS files are read (and refused, naming the key) before anything binds.
        grpc_tls = (
            tls.grpc_server_credentials(cfg.receivers.grpc.tls, "receivers.grpc.tls")
            if cfg.receivers.grpc.enabled and cfg.receivers.grpc.tls is not None
            else None
        )
        http = cfg.receivers.http
        http_tls = self._server_tls(http.tls, "receivers.http.tls") if http.enabled else None
        metrics_tls = self._server_tls(cfg.metrics.tls, "metrics.tls") if cfg.metrics.endpoint else None
        max_bytes = int(cfg.receivers.max_message_mib * 1024 * 1024)
        if self._store is not None:
            await asyncio.to_thread(self._store.start)  # the writer process opens the store
        if self.exporter is not None:
            await self.exporter.start()
            await self._remember_decided()
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
                self._grpc_interceptors(),
                idle_timeout=receivers.grpc.idle_timeout,
                max_connections=caps["grpc"],
                max_concurrent_streams=receivers.grpc.max_concurrent_streams,
            )
            self._grpc.add_generic_rpc_handlers((grpc_server.trace_service_handler(self),))
            from otel_plumb.watch.service import add_verdict_service

            add_verdict_service(self._grpc, self.hub)
            host, port = parse_hostport(cfg.receivers.grpc.endpoint)
            try:
                address = f"{host}:{port}"
                if grpc_tls is not None:
                    self.grpc_port = self._grpc.add_secure_port(address, grpc_tls)
                else:
                    self.grpc_port = self._grpc.add_insecure_port(address)
            except RuntimeError as exc:  # grpcio raises this when the address is taken
                raise OSError(f"cannot listen on {cfg.receivers.grpc.endpoint} for OTLP/gRPC: {exc}") from exc
            if self.grpc_port == 0:
                raise OSError(f"cannot listen on {cfg.receivers.grpc.endpoint} for OTLP/gRPC")
            await self._grpc.start()
        if cfg.receivers.http.enabled:
            self.http_port = await self._serve(
                http_server.traces_app(
                    self,
                    max_bytes,
                    body_timeout=receivers.http.idle_timeout,
                    middlewares=self._http_middlewares(receivers.http.auth, "http"),
                ),
                cfg.receivers.http.endpoint,
                "OTLP/HTTP",
                caps["http"],
                receivers.http.idle_timeout,
                ssl_context=http_tls,
                auto_decompress=False,  # the receiver inflates bodies itself, within the size limit
            )
        if cfg.metrics.endpoint:
            app = metrics_app(self.metrics, lambda: self.ready, self._metrics_middlewares())
            if cfg.console is not None and cfg.store is not None:
                # Behind the metrics listener's TLS and auth, over the store being written.
                app.add_subapp(CONSOLE_ROOT, console_app(cfg.store.path, cfg.console.trace_url, CONSOLE_ROOT))
            self.metrics_port = await self._serve(
                app,
                cfg.metrics.endpoint,
                "metrics",
                caps["metrics"],
                METRICS_IDLE_TIMEOUT,
                ssl_context=metrics_tls,
            )
        self._tick_task = asyncio.create_task(self._tick())
        self._started = True
        self._gc_thresholds = gc.get_threshold()
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        log.info(
            "otel-plumb listening: otlp grpc %s, otlp http %s, metrics %s; %d policies; export %s",
            self._addr(cfg.receivers.grpc.endpoint, self.grpc_port),
            self._addr(cfg.receivers.http.endpoint, self.http_port),
            self._addr(cfg.metrics.endpoint, self.metrics_port),
            len(self.policies),
            cfg.exporters.otlp.endpoint if cfg.exporters.otlp else "none",
        )

    def _auth_failed(self, listener: str, reason: str) -> None:
        self.metrics.auth_failures.labels(listener, reason).inc()

    def _metrics_middlewares(self) -> list[object]:
        config = self.config.metrics.auth
        # Probes reach /healthz and /readyz without a token unless auth.protect_health.
        probes = frozenset() if config is None or config.protect_health else frozenset(("/healthz", "/readyz"))
        return self._http_middlewares(config, "metrics", probes)

    def _grpc_interceptors(self) -> list[grpc.aio.ServerInterceptor[Any, Any]]:
        config = self.config.receivers.grpc.auth
        if config is None:
            return []
        return [auth.GrpcAuthInterceptor(auth.Authenticator(config, "grpc", self._auth_failed))]

    def _http_middlewares(
        self, config: auth.AuthConfig | None, listener: str, open_paths: frozenset[str] = frozenset()
    ) -> list[object]:
        if config is None:
            return []
        return [auth.http_middleware(auth.Authenticator(config, listener, self._auth_failed), open_paths)]

    @staticmethod
    def _addr(endpoint: str, port: int | None) -> str:
        return f"{parse_hostport(endpoint)[0]}:{port}" if port is not None else "off"

    def _server_tls(self, config: TLSServerConfig | None, key: str) -> ssl.SSLContext | None:
        """The listener's TLS context (none: plaintext), reloaded every ``reload_interval``."""
        if config is None:
            return None
        reloading = tls.ReloadingServerContext(config, key)
        if config.reload_interval > 0:
            self._tls_tasks.append(asyncio.create_task(reloading.run()))
        return reloading.context

    async def _serve(
        self,
        app: web.Application,
        endpoint: str,
        what: str,
        max_connections: int,
        idle_timeout: float,
        ssl_context: ssl.SSLContext | None = None,
        **kwargs: bool,
    ) -> int:
        """Serve ``app`` with bounded, idle-closing connections (``receive.connections``), over
        TLS with ``ssl_context``."""
        host, port = parse_hostport(endpoint)
        try:
            runner, bound, _limiter = await connections.serve(
                app, host, port, what, max_connections, idle_timeout, ssl_context=ssl_context, **kwargs
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
        for task in self._tls_tasks:
            await tls.stop_task(task)
        self._tls_tasks = []
        if self._tick_task is not None:
            self._tick_stop.set()  # within the grace period; cancelled past it
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._tick_task, max(1.0, deadline - time.monotonic()))
        async with self._decide_lock:
            await self._decide(self.intake.drain(time.monotonic()), confirm=False)
        flushed = True
        if self.exporter is not None:
            await self._retry_held()
            if self._held or self._held_requests:
                flushed = False
                held = sum(len(p) for p, _ in self._held) + sum(n for _, n in self._held_requests)
                log.error(
                    "storage still failing at shutdown: %d accepted spans could not be queued; "
                    "their journaled requests are replayed at the next start", held,
                )  # fmt: skip
            flushed = await self.exporter.flush(max(0.0, deadline - time.monotonic())) and flushed
            await self.exporter.stop()
        # The metrics endpoint goes last so the final values can still be scraped while draining.
        for runner in self._runners:
            await runner.cleanup()
        self._runners = []
        if self._verdict_log is not None:
            self._verdict_log.close()
        if self._store is not None:
            await asyncio.to_thread(self._store.stop)
        self.hub.close()
        if self._started:
            gc.set_threshold(*self._gc_thresholds)
            gc.unfreeze()
        self._started = False
        self._stopped, self._flushed = True, flushed
        return flushed

    # ---- receive -------------------------------------------------------------------------------

    def malformed(self, receiver: str, reason: str) -> None:
        self.metrics.spans_dropped.labels("malformed").inc()
        # A flood of bad requests logs a line per interval (with the count), not one each.
        _malformed_log.warning(f"malformed:{receiver}", "malformed OTLP request on %s: %s", receiver, reason)

    def admit(self) -> None:
        """Raise Throttled while shutting down or at a limit (see ``SpanSink.admit``)."""
        retry_after = self.config.receivers.retry_after
        if self._stopping or not self._started:
            raise Throttled(retry_after, "otel-plumb is shutting down", overloaded=False)
        if self.intake.spans_buffered + self._incoming >= self.config.receivers.max_buffered_spans:
            raise Throttled(retry_after, "otel-plumb is at its limit of buffered spans; retry later")
        # The memory limiter: a request is taken while the estimate is under the budget, so a
        # request larger than the budget still goes through once the buffers are empty.
        if self.intake.bytes_buffered + self._incoming_bytes >= self.config.assembly.max_buffered_bytes:
            raise Throttled(retry_after, "otel-plumb is at its memory limit for buffered spans; retry later")
        if self.exporter is not None and self.exporter.full:
            raise Throttled(retry_after, "otel-plumb export queue is full; retry later")

    async def ingest(self, request: ReceivedRequest, receiver: str) -> IngestResult:
        """Take a request's spans (see ``SpanSink.ingest``)."""
        self.admit()
        # Requests between the capacity check and the buffers count against the limit, so that
        # many concurrent requests cannot all pass the check at once.
        count = len(request.spans[0])
        self._incoming += count
        size = request.size
        self._incoming_bytes += size
        try:
            journal_id = 0
            if self.exporter is not None:
                try:
                    if self._annotate:
                        # Durable before the client hears "ok": replayed after a crash until its
                        # spans are queued for export.
                        journal_id = await self.exporter.journal(request.raw)
                    else:
                        # Passthrough: forwarded as received before anything else (resent spans
                        # left out); the verdict follows.
                        forward = self._without_resent(request)
                        if self._forward_scrub is not None:
                            forward = _redacted_request(forward or request.message, self._forward_scrub)
                        if forward is not None:
                            await self.exporter.submit([(forward.SerializeToString(), _span_count(forward))])
                        else:
                            await self.exporter.submit([(request.raw, count)])
                except StorageError as exc:
                    # Nothing of the request was taken: the client retries (UNAVAILABLE / 503).
                    raise Throttled(
                        self.config.receivers.retry_after, f"otel-plumb cannot write its state ({exc}); retry later",
                        overloaded=False,
                    ) from exc  # fmt: skip
            return await self._take(request, receiver, journal_id)
        finally:
            self._incoming -= count
            self._incoming_bytes -= size

    def _without_resent(self, request: ReceivedRequest) -> ExportTraceServiceRequest | None:
        """A copy of the request without the spans taken before (or twice in it); None when
        there are none, the usual case (and then the message is never parsed)."""
        seen: set[tuple[str, str]] = set()
        resent: set[int] = set()
        has_span = self.intake.has_span
        # Records come in the request's order: the n-th is the message's n-th span.
        for n, record in enumerate(request.spans[0]):
            ids = (record.trace_id, record.span_id)
            if ids in seen or has_span(*ids):
                resent.add(n)
            seen.add(ids)
        if not resent:
            return None
        copy = ExportTraceServiceRequest()
        copy.CopyFrom(request.message)
        n = 0
        for rs in copy.resource_spans:
            for ss in rs.scope_spans:
                kept = [span for k, span in enumerate(ss.spans, n) if k not in resent]
                n += len(ss.spans)
                del ss.spans[:]
                ss.spans.extend(kept)
        return copy

    async def _take(
        self,
        request: ReceivedRequest,
        receiver: str,
        journal_id: int,
        skip_traces: set[bytes] | frozenset[bytes] = frozenset(),
    ) -> IngestResult:
        """Normalise and buffer every span of a request (but those of ``skip_traces``), check
        the traces it gave steps to early, and decide those it completed."""
        intake = self.intake
        tenant = auth.TENANT.get()
        records, wires, origin_wires = request.spans
        if tenant is not None:  # None: the listener has no auth
            _set_tenant(records, tenant)
        # Only the annotate mode forwards buffered spans (passthrough forwarded the request).
        spans = self._spans.take(
            records, wires, self._origins.of(origin_wires), time.monotonic(), Source(f"request on {receiver}"),
            journal_id, self._annotate and self.exporter is not None, skip_traces,
        )  # fmt: skip
        for span_id, reason in spans.unread:
            log.warning("cannot decode span %s; forwarding it unchecked: %s", span_id, reason)
        taken, rejected, resent = spans.taken, spans.rejected, spans.resent
        counted = self.metrics.spans_dropped
        for outcome, n in spans.dropped.items():
            counted.labels(outcome).inc(n)
        for outcome, n in spans.unchecked_by.items():
            self.metrics.spans_unchecked.labels(outcome).inc(n)
        if journal_id and taken:  # counted per request, not per span
            self._journal_pending[journal_id] = self._journal_pending.get(journal_id, 0) + taken
        if taken or resent:
            self.metrics.spans_received.labels(receiver).inc(taken + resent)
            if tenant:
                self.metrics.tenant_spans_received.labels(tenant).inc(taken + resent)
        if rejected:
            counted.labels("malformed").inc(rejected)
        self.metrics.traces_in_flight.set(intake.traces_in_flight)
        self.metrics.traces_waiting.set(intake.traces_waiting)
        self.metrics.buffered_bytes.set(intake.bytes_buffered)
        self._note_evictions()
        early: list[Decision] = []
        if self._early_checks:
            for tid, state, may_fail in self._spans.early_checks_due(spans.touched, self._early, self._early_pending):
                found = self._early_check(tid, state, may_fail)
                if found is not None:
                    early.append(found)
            for tid in spans.tombstoned:
                found = self._tombstone_check(tid)
                if found is not None:
                    early.append(found)
        finished = intake.ready()
        if self._forward_scrub is not None and self._annotate:
            for payload in (*spans.late, *spans.unchecked):
                redact_forwarded(payload, self._forward_scrub.text)
        late, with_trace = _late_of(spans.late, finished) if self._annotate else (spans.late, {})
        if early or finished:
            async with self._decide_lock:
                if early:
                    await self._consume(early)
                if finished:
                    await self._decide(finished, late=with_trace)
        if late and self._annotate:
            await self._submit(late)
        if spans.unchecked and self._annotate:
            await self._submit(spans.unchecked, whole_traces=False)
        if journal_id and journal_id not in self._journal_pending and self.exporter is not None:
            await self._release([journal_id])  # nothing of it to export
        message = f"{rejected} spans without a valid trace_id/span_id" if rejected else ""
        return IngestResult(rejected, message)

    # ---- check ---------------------------------------------------------------------------------

    def _early_check(self, trace_id: str, state: EarlyState, may_fail: list[tuple[str, str]]) -> Decision | None:
        """Failures already certain (never_call, precedes, call_count max, budget) on a trace
        still in flight, each reported once; the full evaluation follows at completion. The
        trace's counters said that the invariants ``may_fail`` may now fail
        (``SpanTaker.early_checks_due``): the partial trajectory is built only then. With
        ``confirm_wait``, a failure found is reported once it still holds that much later
        (``_confirm_early``), while the trace is still in flight."""
        wait = self.config.assembly.confirm_wait
        if not wait:
            decision = self._report_early(trace_id, state, frozenset(may_fail))
            state.checked(may_fail, _keys(decision))
            return decision
        # Found now, reported (and added to ``reported``) only if it still holds at the deadline.
        reported = set(self._early.get(trace_id, ()))
        found = self._new_early_failures(trace_id, self._partial(trace_id), reported, state.services,
                                         frozenset(may_fail))  # fmt: skip
        state.checked(may_fail, _keys(found))
        if found is not None:
            # To the end of the deadline order: every failure pending for the trace waits from now.
            pending = self._early_pending.pop(trace_id, None)
            keys = pending.keys if pending is not None else set()
            keys.update(_keys(found))
            self._early_pending[trace_id] = PendingEarly(time.monotonic() + wait, keys)
        return None

    def _confirm_early(self, now: float) -> list[Decision]:
        """The early failures pending since ``confirm_wait`` ago that still hold on their trace,
        if it is still in flight (else its full evaluation decides). O(traces due)."""
        out: list[Decision] = []
        pending = self._early_pending
        while pending:
            trace_id, entry = next(iter(pending.items()))
            if entry.deadline > now:
                break
            del pending[trace_id]
            state = self._early_state.get(trace_id)
            if state is not None and trace_id not in self._rooted and not self.intake.is_decided(trace_id):
                found = self._report_early(trace_id, state, frozenset(entry.keys))
                stood = len(found.decided.verdicts) if found is not None else 0
                self.metrics.confirm_waits.labels("early", "stood").inc(stood)
                self.metrics.confirm_waits.labels("early", "cleared").inc(len(entry.keys) - stood)
                if found is not None:
                    out.append(found)
        return out

    def _partial(self, trace_id: str) -> Trajectory:
        spans = self.intake.buffered_spans(trace_id)
        return build_trajectory(trace_id, spans, complete=False, incomplete_reason="in_flight")

    def _report_early(self, trace_id: str, state: EarlyState, only: frozenset[tuple[str, str]]) -> Decision | None:
        reported = self._early.setdefault(trace_id, set())
        decision = self._new_early_failures(trace_id, self._partial(trace_id), reported, state.services, only)
        if not reported:
            del self._early[trace_id]
        return decision

    def _tombstone_check(self, trace_id: str) -> Decision | None:
        """Late spans of a trace let go before it completed (evicted, max_wait): the failures
        they prove with the calls its tombstone remembers, each reported once (with what the
        trace's own decision reported), so an eviction cannot hide a violation."""
        tombstone = self.intake.tombstone(trace_id)
        if tombstone is None:
            return None
        partial = tombstone.trajectory(trace_id)
        services = () if partial.service is None else (partial.service,)
        return self._new_early_failures(trace_id, partial, tombstone.reported, services)

    def _new_early_failures(
        self, trace_id: str, partial: Trajectory, reported: set[tuple[str, str]], services: Collection[str],
        only: frozenset[tuple[str, str]] | None = None,
    ) -> Decision | None:
        """Early failures on ``partial`` (of spans from ``services``) not yet in ``reported``
        (of the invariants in ``only``)."""
        new = new_early_failures(self.policies, in_flight(partial), reported, only, self._early_watch, services)
        if not new:
            return None
        applied = list(dict.fromkeys(v.policy for v in new))
        for policy in self.policies:
            task = policy.task_id(partial)
            if task is not None and partial.key == trace_id:
                partial.key = task
        return Decision(Decided(partial, new, applied, "violating", "early"))

    async def _decide(
        self, finished: Iterable[Finished], *, confirm: bool = True, late: dict[str, list[Forwarded]] | None = None
    ) -> None:
        """Check each finished trajectory and hand the decisions to every consumer. With
        ``confirm`` (not when draining), a complete trace whose verdict a late span could change
        (``late_span_could_change``) waits ``confirm_wait`` for one first
        (``Assembler.wait_for_late_spans``). ``late``: by trace, late spans of the same request
        (see ``_late_of``), forwarded with their trace's spans, unannotated."""
        now = time.monotonic()
        decisions: list[Decision] = []
        left: list[Forwarded] = []
        for f in finished:
            confirming = confirm and self._confirm and f.complete and not f.waited
            trajectory = self.intake.trajectory(f, keep_marks=confirming, names_tool=self._names_tool)
            decided = decide(self.policies, trajectory)
            with_it = [payload for t in f.trace_ids for payload in late.pop(t, ())] if late else []
            if confirming:
                if late_span_could_change(self.policies, decided) and self.intake.wait_for_late_spans(f, now):
                    self._waited[f.key] = _verdict_of(decided)
                    left += with_it  # forwarded now, as late spans are
                    continue  # undecided: nothing of it is counted, emitted or let go yet
                self.intake.forget_marks(f)
            elif f.waited:  # did a span in the wait change its verdict?
                before = self._waited.pop(f.key, None)
                outcome = "stood" if before == _verdict_of(decided) else "cleared"
                self.metrics.confirm_waits.labels("final", outcome).inc()
            early: set[tuple[str, str]] = set()
            for t in f.trace_ids:
                early |= self._early.pop(t, set())
                self._early_pending.pop(t, None)
                self._rooted.discard(t)
                self._early_state.pop(t, None)
            new_failures = [v for v in decided.failures if (v.policy, v.invariant) not in early]
            decisions.append(
                Decision(decided, cast("list[Forwarded]", f.payloads), now - f.last_span_at, new_failures, late=with_it)
            )
            for t in f.trace_ids:
                tombstone = self.intake.tombstone(t)
                if tombstone is not None:  # its late spans report only what this did not
                    tombstone.reported |= early
                    tombstone.reported.update((v.policy, v.invariant) for v in decided.failures)
        self.trajectories_decided += len(decisions)
        self.metrics.traces_in_flight.set(self.intake.traces_in_flight)
        self.metrics.traces_waiting.set(self.intake.traces_waiting)
        self.metrics.buffered_bytes.set(self.intake.bytes_buffered)
        self._note_evictions()
        await self._consume(decisions)
        if left:
            await self._submit(left)

    def _note_evictions(self) -> None:
        """Count the traces let go before they completed, and log them at most once per
        ``EVICTION_LOG_INTERVAL`` with the count since the last line."""
        for reason, n in self.intake.new_evictions().items():
            self.metrics.traces_evicted.labels(reason).inc(n)
            self._evicted_unlogged[reason] = self._evicted_unlogged.get(reason, 0) + n
        now = time.monotonic()
        if self._evicted_unlogged and now >= self._eviction_log_at:
            counts, self._evicted_unlogged = self._evicted_unlogged, {}
            self._eviction_log_at = now + EVICTION_LOG_INTERVAL
            log.warning(
                "%d traces let go before they completed since the last such line (%s): their trajectories are "
                "indeterminate where it matters; raise assembly.max_traces or max_wait if this is not a flood",
                sum(counts.values()), ", ".join(f"{reason}: {n}" for reason, n in sorted(counts.items())),
            )  # fmt: skip

    async def _consume(self, decisions: list[Decision]) -> None:
        if self.redaction is not None:
            for d in decisions:
                redactor = self.redaction.redactor(d.decided.policies)
                if redactor.active:  # an inactive one changes nothing
                    d.scrub = redactor.scrub(d.decided.trajectory)
                    d.redacted = redactor.decided(d.decided, d.scrub)
        # A trace with no agent span is counted (unchecked) and goes out to the backend, but is
        # no trajectory to log, store, stream or watch for consistency: a gateway's HTTP traffic
        # would bury the agents' in them.
        agent_runs = [d for d in decisions if d.decided.is_agent_run]
        # One failing consumer (the verdict log on a full disk) must not keep the decisions from
        # the others, the export above all: counted, logged at a bounded rate, and skipped.
        for consumer in self.consumers:
            batch = decisions if isinstance(consumer, (MetricsConsumer, _ExportConsumer)) else agent_runs
            if not batch:
                continue
            try:
                await consumer.consume(batch)
            except Exception as exc:
                name = "verdict_log" if isinstance(consumer, VerdictLogConsumer) else type(consumer).__name__
                if isinstance(exc, OSError):
                    self.metrics.storage_errors.labels(name).inc()
                self._storage_log.error(
                    f"consumer:{name}", "%s failed on %d decisions: %s: %s",
                    name, len(decisions), type(exc).__name__, exc,
                )  # fmt: skip

    async def _submit(self, payloads: list[Forwarded], whole_traces: bool = True) -> None:
        """Queue spans for export, and in the same transaction release the journaled requests
        whose last span this was. ``whole_traces``: the payloads hold every span their traces
        have in their journaled requests, so a replay can skip those traces.

        Never raises for storage: when the write fails, the spans are held in memory (counted
        in the queue gauge) and written by ``_retry_held`` once storage works again."""
        if self.exporter is None:
            return
        async with self._submit_lock:
            if self._held and not await self._write_held():
                self._hold(payloads, whole_traces)
                return
            if not await self._write(payloads, whole_traces):
                self._hold(payloads, whole_traces)

    def _hold(self, payloads: list[Forwarded], whole_traces: bool) -> None:
        assert self.exporter is not None
        self._held.append((payloads, whole_traces))
        self.exporter.hold(len(payloads))

    async def _write(self, payloads: list[Forwarded], whole_traces: bool) -> bool:
        """One submit; the journal counts change only once it is on disk. False: storage failed."""
        assert self.exporter is not None
        pending = self._journal_pending
        progress = JournalProgress(payloads, pending, whole_traces)
        batches = encode_requests(payloads, self._batch_spans, self._batch_bytes)
        # Whole traces are decided ones: remembered on disk with them, for after a restart.
        at = time.time()
        decided = [(tid, at, ids) for tid, ids in span_ids_by_trace(payloads)] if whole_traces else None
        try:
            await self.exporter.submit(batches, progress.done, progress.released, decided)
        except StorageError as exc:
            self._storage_log.error(
                "submit", "cannot queue %d spans for export (%s); kept in memory, retried every second",
                len(payloads), exc,
            )  # fmt: skip
            return False
        for journal_id, n in progress.taken.items():
            left = pending.get(journal_id, 0) - n
            if left > 0:
                pending[journal_id] = left
            else:
                pending.pop(journal_id, None)
        return True

    async def _write_held(self) -> bool:
        """Write what was held, oldest first (under ``_submit_lock``); False if storage still fails."""
        assert self.exporter is not None
        while self._held:
            payloads, whole_traces = self._held[0]
            if not await self._write(payloads, whole_traces):
                return False
            self._held.pop(0)
            self.exporter.hold(-len(payloads))
        return True

    async def _submit_requests(
        self, requests: list[tuple[bytes, int]], decided: list[tuple[str, float, str]] | None = None
    ) -> None:
        """Passthrough verdict spans, and the decided traces' memory of their trajectories (see
        ``DiskQueue.put``): queued, or held like ``_submit``'s spans when storage fails."""
        assert self.exporter is not None
        async with self._submit_lock:
            pending = [*self._held_requests, *requests]
            remembered = [*self._held_decided, *(decided or [])]
            try:
                await self.exporter.submit(pending, decided=remembered)
            except StorageError:
                if requests:
                    self.exporter.hold(sum(n for _, n in requests))
                self._held_requests, self._held_decided = pending, remembered
                return
            self.exporter.hold(-sum(n for _, n in self._held_requests))
            self._held_requests, self._held_decided = [], []

    async def _release(self, journal_ids: list[int]) -> None:
        """Drop journal entries with nothing left to export; kept for later when storage fails
        (until then a crash would replay them: their spans are duplicates then, dropped as such)."""
        assert self.exporter is not None
        ids = [*self._held_releases, *journal_ids]
        try:
            await self.exporter.release(ids)
        except StorageError:
            self._held_releases = ids
            return
        self._held_releases = []

    async def _retry_held(self) -> None:
        """Write what storage failures left in memory (from the tick, about once a second)."""
        if self.exporter is None:
            return
        if self._held:
            async with self._submit_lock:
                await self._write_held()
        if self._held_requests or self._held_decided:
            await self._submit_requests([])
        if self._held_releases:
            await self._release([])

    async def _remember_decided(self) -> None:
        """The traces decided by an earlier run, within ``decided_ttl``, back in the decided
        traces' memory before anything is taken: a resend of their spans (a client retrying
        a request whose acknowledgement was lost, a journaled request replayed) is a duplicate,
        not a second trajectory made of a fragment of the trace, forwarded a second time."""
        assert self.exporter is not None
        assembly = self.config.assembly
        now_wall, now = time.time(), time.monotonic()
        rows = await self.exporter.decided(now_wall - assembly.decided_ttl, assembly.decided_max_traces)
        for trace_id, at, span_ids in rows:
            spans = [span_ids[i : i + 16] for i in range(0, len(span_ids), 16)]
            self.intake.remember_decided(trace_id, spans, now - (now_wall - at), now)
        if rows:
            log.info("remembered %d traces decided by the previous run", len(rows))

    async def _forget_decided(self) -> None:
        """Drop from disk what the decided traces' memory no longer holds (past ``decided_ttl``,
        beyond ``decided_max_traces``)."""
        assert self.exporter is not None
        assembly = self.config.assembly
        await self.exporter.forget_decided(time.time() - assembly.decided_ttl, assembly.decided_max_traces)

    async def _replay_journal(self) -> None:
        """Requests acknowledged by a previous run that crashed before their spans were queued."""
        assert self.exporter is not None
        entries = await self.exporter.journaled()
        for journal_id, body, done in entries:
            try:
                request = ReceivedRequest.parse(body)
            except (DecodeError, RecursionError, MemoryError, ValueError) as exc:
                # Read back intact but not a request this version reads: reported and dropped
                # like a damaged body, not a failed start on every restart.
                self.metrics.storage_errors.labels("journal_read").inc()
                log.error("UNREADABLE JOURNAL %d (not an ExportTraceServiceRequest: %s) is dropped; "
                          "its spans cannot be replayed", journal_id, exc)  # fmt: skip
                await self._release([journal_id])
                continue
            await self._take(request, "journal", journal_id, done)
        if entries:
            log.info("replayed %d journaled requests from a previous run", len(entries))

    async def _tick(self) -> None:
        interval = self.config.assembly.tick
        held_retry = 0.0
        young_gc_at = time.monotonic() + GC_YOUNG_INTERVAL
        forget_decided_at = time.monotonic() + DECIDED_FORGET_INTERVAL
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._tick_stop.wait(), interval)
            if self._tick_stop.is_set():
                return
            if time.monotonic() >= young_gc_at:
                gc.collect(0)
                young_gc_at = time.monotonic() + GC_YOUNG_INTERVAL
            try:
                confirmed = self._confirm_early(time.monotonic())
                finished = self.intake.due(time.monotonic())
                self._note_evictions()
                if confirmed or finished:
                    async with self._decide_lock:
                        if confirmed:
                            await self._consume(confirmed)
                        if finished:
                            await self._decide(finished)
            except Exception:
                log.exception("deciding trajectories failed")
            if self.exporter is not None and time.monotonic() >= forget_decided_at:
                forget_decided_at = time.monotonic() + DECIDED_FORGET_INTERVAL
                with contextlib.suppress(StorageError):  # counted and logged; tried again next time
                    await self._forget_decided()
            held = self._held or self._held_requests or self._held_decided or self._held_releases
            if held and time.monotonic() >= held_retry:
                held_retry = time.monotonic() + 1.0
                try:
                    await self._retry_held()
                except Exception:
                    log.exception("writing held spans failed")


class _ExportConsumer:
    """Annotate mode: the trajectory's spans go out with the verdict annotations. Passthrough:
    the spans went out as received; the verdict follows as one small span in the trace."""

    def __init__(self, processor: Processor) -> None:
        self.processor = processor

    async def consume(self, decisions: Sequence[Decision]) -> None:
        p = self.processor
        assert p.exporter is not None
        out: list[Forwarded] = []
        verdict_spans: list[ExportTraceServiceRequest] = []
        forwarded: list[Forwarded] = []  # passthrough: the decided traces' spans, sent already
        for d in decisions:
            decided = d.emitted
            if decided.decision != "final":
                continue
            t = decided.trajectory
            if p._forward_redaction is not None and d.scrub is not None:
                for payload in d.payloads:
                    redact_forwarded(payload, d.scrub.text)
            if p._annotate:
                # A trace with no agent span goes out as it came: it is not a trajectory.
                if decided.is_agent_run:
                    annotate(d.payloads, t, decided.status, decided.policies, decided.verdicts, p._annotation_chars)
                out.extend(d.payloads)
                out.extend(d.late)
            else:
                forwarded.extend(d.payloads)
                if t.trace_id:
                    verdict_spans.append(
                        verdict_span_request(t, decided.status, decided.policies, decided.verdicts, p._annotation_chars)
                    )
        if out:
            await p._submit(out)
        if verdict_spans or forwarded:
            at = time.time()
            await p._submit_requests(
                [(request.SerializeToString(), 1) for request in verdict_spans],
                [(tid, at, ids) for tid, ids in span_ids_by_trace(forwarded)],
            )  # fmt: skip


def _late_of(
    late: list[Forwarded], finished: list[Finished]
) -> tuple[list[Forwarded], dict[str, list[Forwarded]]]:
    """``late`` split: the spans to forward on their own, and by trace those of traces let go
    earlier in the same request (evicted to make room). These go out in the same write as their
    trace: that write marks the trace done for the request, so a crash between two writes would
    leave them out of the queue and of the journal's replay alike."""
    if not late or not finished:
        return late, {}
    let_go = {tid for f in finished for tid in f.trace_ids}
    alone: list[Forwarded] = []
    with_trace: dict[str, list[Forwarded]] = {}
    for payload in late:
        if payload.trace_id in let_go:
            with_trace.setdefault(payload.trace_id, []).append(payload)
        else:
            alone.append(payload)
    return alone, with_trace


def _set_tenant(records: list[SpanRecord | UnreadSpan], tenant: str) -> None:
    """The tenant of the request's bearer token (receive.auth) replaces whatever plumb.tenant
    the client put on its resources (one dict per ResourceSpans, shared by its records)."""
    spans = [r for r in records if type(r) is SpanRecord]
    for resource in {id(r.resource): cast("dict[str, Any]", r.resource) for r in spans}.values():
        resource.pop(auth.TENANT_ATTRIBUTE, None)
        if tenant:
            resource[auth.TENANT_ATTRIBUTE] = tenant


def _redacted_request(request: ExportTraceServiceRequest, scrub: Scrub) -> ExportTraceServiceRequest:
    """A copy of ``request`` with every span's strings scrubbed (the received one is kept
    as it came: it is what the checks read)."""
    copy = ExportTraceServiceRequest()
    copy.CopyFrom(request)
    for rs in copy.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                redact_span(span, scrub.text)
    return copy


def _span_count(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
