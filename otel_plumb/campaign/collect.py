"""Trace collection: each trial's trajectory, matched by trace id or ``plumb.trial.id``.

Sources: ``embedded`` (the live processor in this process, OTLP/gRPC and OTLP/HTTP on free
127.0.0.1 ports, both handed to the agent), ``watch``
(the VerdictService.Watch stream of a running otel-plumb), or ``files`` recorded earlier. A
trial whose trajectory does not arrive within the deadline is an error, never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from otel_plumb.assemble import build_trajectory
from otel_plumb.model import Step, Trajectory
from otel_plumb.model.trajectory import ARM, CASE_ID, TRIAL_ID, VARIANT_ID

log = logging.getLogger("otel_plumb.campaign")


class TraceMissing(Exception):
    pass


class NoSpans(TraceMissing):
    """Not one span of the trial's trace reached the embedded receiver: the agent exported
    nothing, or elsewhere. ``hint`` says where it must export."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


class Matcher:
    """Hands decided trajectories to the trials waiting for them, by trace id or trial id.

    A trajectory that arrives before its trial asks is kept until asked for.
    """

    def __init__(self) -> None:
        self._by_trace: dict[str, Trajectory] = {}
        self._by_trial: dict[str, Trajectory] = {}
        self._waiting: dict[str, asyncio.Future[Trajectory]] = {}
        # Kept trajectories without a trial id, by trace id: when they were kept.
        self._unnamed: dict[str, float] = {}

    def offer(self, trajectory: Trajectory) -> None:
        keys = list(trajectory.trace_ids)
        trial = trajectory.trial_id
        for key in ([trial] if trial else []) + keys:
            fut = self._waiting.pop(key, None)
            if fut is not None and not fut.done():
                fut.set_result(trajectory)
                return
        for key in keys:
            self._by_trace[key] = trajectory
        if trial:
            self._by_trial[trial] = trajectory
        elif keys:
            self._unnamed[keys[0]] = time.monotonic()

    def take(self, trace_id: str, trial_id: str) -> Trajectory | None:
        found = self._by_trace.pop(trace_id, None) or self._by_trial.pop(trial_id, None)
        if found is not None:
            for key in found.trace_ids:
                self._by_trace.pop(key, None)
                self._unnamed.pop(key, None)
            if found.trial_id:
                self._by_trial.pop(found.trial_id, None)
        return found

    def strays(self, older_than_s: float) -> int:
        """Trajectories no trial has claimed for ``older_than_s``, in traces of their own and
        without a trial id: spans an agent exported outside the trial's trace context."""
        cutoff = time.monotonic() - older_than_s
        return sum(1 for at in self._unnamed.values() if at <= cutoff)

    async def wait(self, trace_id: str, trial_id: str, deadline_s: float) -> Trajectory:
        found = self.take(trace_id, trial_id)
        if found is not None:
            return found
        fut: asyncio.Future[Trajectory] = asyncio.get_running_loop().create_future()
        self._waiting[trace_id] = fut
        self._waiting[trial_id] = fut
        try:
            return await asyncio.wait_for(fut, deadline_s)
        except TimeoutError:
            raise TraceMissing(f"no trajectory for trace {trace_id} within {deadline_s:g}s") from None
        finally:
            self._waiting.pop(trace_id, None)
            self._waiting.pop(trial_id, None)


# OTLP protocols an agent may be told to use, with the names of OTEL_EXPORTER_OTLP_PROTOCOL.
GRPC, HTTP_PROTOBUF = "grpc", "http/protobuf"


@dataclass(frozen=True, slots=True)
class OtlpEndpoints:
    """Where agents export their spans: both OTLP receivers listen."""

    grpc: str  # http://host:port, as the OpenTelemetry SDK's gRPC exporter takes it (plaintext)
    http: str  # http://host:port, the base the HTTP exporter appends /v1/traces to

    def for_protocol(self, protocol: str) -> str:
        return self.grpc if protocol == GRPC else self.http

    def describe(self) -> str:
        return f"{self.grpc.removeprefix('http://')} (gRPC) or {self.http} (HTTP)"


class TraceSource:
    """Base: where trajectories come from. ``endpoints`` are given to agents (or None)."""

    endpoints: OtlpEndpoints | None = None
    # False for trace files recorded earlier: the agents ran then, not now.
    runs_agents = True

    def __init__(self) -> None:
        self.matcher = Matcher()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def trajectory(self, trace_id: str, trial_id: str, deadline_s: float) -> Trajectory:
        return await self.matcher.wait(trace_id, trial_id, deadline_s)


class EmbeddedReceiver(TraceSource):
    """The live processor embedded in the campaign: OTLP/gRPC and OTLP/HTTP on free loopback
    ports, the shared normalise and assemble stages, a callback per decided trajectory.

    Agents are given both addresses. A trace is decided once its root span has been
    quiet for ``idle_s`` (exporters send the root, which ends last, in the last batch).
    """

    def __init__(self, idle_s: float = 0.05, tick_s: float = 0.01) -> None:
        super().__init__()
        from otel_plumb.processor import Processor
        from otel_plumb.processor.config import load_config

        config = load_config(None, {
            "receivers.grpc.endpoint": "127.0.0.1:0",
            "receivers.http.endpoint": "127.0.0.1:0",
            "metrics.endpoint": "",
            "assembly.idle_timeout": idle_s,
            "assembly.tick": tick_s,
            "shutdown.grace_period": 1.0,
        })
        # The campaign checks trajectories itself, after adding the case's ground truth.
        self.processor = Processor(config, policies=[])
        self.processor.on_decided(lambda decided: self.matcher.offer(decided.trajectory))

    async def start(self) -> None:
        await self.processor.start()
        self.endpoints = OtlpEndpoints(f"http://127.0.0.1:{self.processor.grpc_port}",
                                       f"http://127.0.0.1:{self.processor.http_port}")

    async def trajectory(self, trace_id: str, trial_id: str, deadline_s: float) -> Trajectory:
        try:
            return await self.matcher.wait(trace_id, trial_id, deadline_s)
        except TraceMissing:
            spans = self.processor.intake.buffered_spans(trace_id)
            if not spans:
                assert self.endpoints is not None
                # A trial asks for its trajectory as soon as its agent answers: one left unclaimed
                # for a second is nobody's.
                strays = self.matcher.strays(1.0)
                if strays:
                    hint = (f"spans did arrive, but in traces of their own ({strays} so far): the agent must start "
                            "them in the trial's trace, under the traceparent it is sent")
                else:
                    hint = f"the agent must export OTLP to {self.endpoints.describe()}"
                raise NoSpans(f"no spans arrived for trace {trace_id} within {deadline_s:g}s ({hint})", hint) from None
            # Spans came but the trace never completed: an incomplete (indeterminate) trajectory.
            return build_trajectory(trace_id, list(spans), complete=False, incomplete_reason="max_wait")

    async def stop(self) -> None:
        if self.processor.ready:
            await self.processor.stop(grace=1.0)


class FileSource(TraceSource):
    """Trajectories from trace files recorded earlier (replay's reader, the shared core),
    matched to trials by ``plumb.trial.id`` (trial ids are stable for a campaign)."""

    runs_agents = False

    def __init__(self, paths: list[str]) -> None:
        super().__init__()
        self.paths = paths
        self.read_errors: list[str] = []

    async def start(self) -> None:
        from otel_plumb.replay import ReplayStats, iter_trajectories

        stats = ReplayStats()
        for trajectory in iter_trajectories(self.paths, stats):
            self.matcher.offer(trajectory)
        for error in stats.errors:
            self.read_errors.append(str(error))
            log.warning("unreadable trace data: %s", error)

    async def trajectory(self, trace_id: str, trial_id: str, deadline_s: float) -> Trajectory:
        found = self.matcher.take(trace_id, trial_id)
        if found is None:
            raise TraceMissing(f"no trajectory for trial {trial_id} (trace {trace_id}) in the trace files")
        return found


class WatchSource(TraceSource):
    """Decided trajectories from a running otel-plumb's VerdictService.Watch stream. The agent
    exports to that processor itself; the campaign re-checks each trajectory with its own policies."""

    def __init__(self, target: str, token: str | None = None, tls: dict[str, bytes] | None = None) -> None:
        """``target``: grpc:// or grpcs:// (TLS, with ``tls``'s PEM ``ca_file``, ``cert_file`` and
        ``key_file`` when given; the system CAs otherwise)."""
        super().__init__()
        self.secure = target.startswith("grpcs://")
        self.target = target.removeprefix("grpcs://").removeprefix("grpc://")
        self._tls = tls or {}
        # Sent as ``authorization: Bearer <token>`` when the processor's gRPC receiver has auth.
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel: Any = None
        self._task: asyncio.Task[None] | None = None
        self.error: str | None = None

    async def start(self) -> None:
        import grpc
        from google.protobuf import json_format

        from otel_plumb.proto_gen import watch_pb2, watch_pb2_grpc

        if self.secure:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=self._tls.get("ca_file"),
                private_key=self._tls.get("key_file"),
                certificate_chain=self._tls.get("cert_file"),
            )
            self._channel = grpc.aio.secure_channel(self.target, credentials)
        else:
            self._channel = grpc.aio.insecure_channel(self.target)
        stub: Any = watch_pb2_grpc.VerdictServiceStub(self._channel)  # type: ignore[no-untyped-call]
        call = stub.Watch(watch_pb2.WatchRequest(), metadata=self._metadata)
        # The server sends initial metadata once the subscription is in place.
        await asyncio.wait_for(call.initial_metadata(), 10)

        async def follow() -> None:
            try:
                async for message in call:
                    record = json_format.MessageToDict(message, preserving_proto_field_name=True)
                    self.matcher.offer(trajectory_from_record(record))
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.CANCELLED:
                    self.error = f"watch {self.target}: {e.code().name} {e.details()}"

        self._task = asyncio.create_task(follow())

    async def trajectory(self, trace_id: str, trial_id: str, deadline_s: float) -> Trajectory:
        try:
            return await self.matcher.wait(trace_id, trial_id, deadline_s)
        except TraceMissing as e:
            if self.error is not None:  # the stream broke: say so on every trial it costs
                raise TraceMissing(f"{e}; {self.error}") from None
            raise

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._channel is not None:
            await self._channel.close()


def trajectory_from_record(record: dict[str, Any]) -> Trajectory:
    """A stored or streamed trajectory record back into a Trajectory, for re-checking."""
    steps = [
        Step(
            index=int(s.get("index", i)),
            kind=s.get("kind", "other"),
            name=s.get("name", ""),
            span_id=s.get("span_id", ""),
            parent_span_id=s.get("parent_span_id") or None,
            trace_id=s.get("trace_id", record.get("trace_id", "")),
            start_ns=int(s.get("start_time_unix_nano") or 0),
            end_ns=int(s.get("end_time_unix_nano") or 0),
            convention=s.get("convention", "unknown"),
            source=s.get("source") or "span",
            args=s.get("args"),
            args_status=s.get("args_status") or ("captured" if s.get("args") is not None else "absent"),
            args_source=s.get("args_source"),
            result=s.get("result"),
            result_status=s.get("result_status") or ("captured" if s.get("result") is not None else "absent"),
            error=s.get("error") or None,
            agent=s.get("agent"),
            tool_call_id=s.get("tool_call_id"),
            tokens=s.get("tokens"),
            framework=s.get("framework"),
        )
        for i, s in enumerate(record.get("steps") or [])
    ]
    attributes = dict(record.get("attributes") or {})
    for key, field in ((CASE_ID, "case_id"), (VARIANT_ID, "variant_id"), (TRIAL_ID, "trial_id"), (ARM, "arm")):
        if record.get(field):
            attributes.setdefault(key, record[field])
    if record.get("service"):
        attributes.setdefault("service.name", record["service"])
    trace_ids = list(record.get("trace_ids") or ([record["trace_id"]] if record.get("trace_id") else []))
    return Trajectory(
        key=record.get("key") or (trace_ids[0] if trace_ids else ""),
        trace_ids=trace_ids,
        steps=steps,
        complete=bool(record.get("complete", True)),
        incomplete_reason=record.get("incomplete_reason"),
        root_span_id=record.get("root_span_id"),
        service=record.get("service"),
        agent=record.get("agent"),
        session_id=record.get("session_id"),
        start_ns=int(record.get("start_time_unix_nano") or 0),
        end_ns=int(record.get("end_time_unix_nano") or 0),
        span_count=int(record.get("span_count") or len(steps)),
        attributes=attributes,
        problems=list(record.get("problems") or []),
    )
