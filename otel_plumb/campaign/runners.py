"""Agent runners for the ``otel-plumb.agent/1`` protocol: HTTP, command, Python callable.

Each gets the same request dict and returns the agent's answer ``{output, state}``. Trace
context travels as W3C ``traceparent`` and ``baggage`` (headers, environment variables, or
extra keys of the dict for in-process callables).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp

from otel_plumb.campaign.config import Arm, CommandArm, HttpArm, PythonArm

PROTOCOL = "otel-plumb.agent/1"


class AgentError(Exception):
    """The agent did not give an answer (an error status, a crash, a timeout, bad JSON)."""


class TraceContext:
    __slots__ = ("baggage", "trace_id", "traceparent")

    def __init__(self, trace_id: str, span_id: str, entries: dict[str, str]) -> None:
        self.trace_id = trace_id
        self.traceparent = f"00-{trace_id}-{span_id}-01"
        self.baggage = ",".join(f"{k}={quote(v, safe='')}" for k, v in entries.items())


class Runner(Protocol):
    async def __call__(self, request: dict[str, Any], ctx: TraceContext) -> dict[str, Any]: ...

    async def close(self) -> None: ...


def _answer(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise AgentError(f"{where}: the answer is not a JSON object")
    return {"output": raw.get("output"), "state": raw.get("state")}


class HttpRunner:
    def __init__(self, spec: HttpArm) -> None:
        self.spec = spec
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, request: dict[str, Any], ctx: TraceContext) -> dict[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        headers = {**self.spec.headers, "traceparent": ctx.traceparent, "baggage": ctx.baggage}
        timeout = aiohttp.ClientTimeout(total=self.spec.timeout_s)
        attempt = 0
        while True:
            try:
                async with self._session.post(self.spec.url, json=request, headers=headers, timeout=timeout) as resp:
                    body = await resp.read()
                    if resp.status >= 300:
                        raise AgentError(f"HTTP {resp.status}: {body[:200].decode(errors='replace')}")
                    try:
                        return _answer(json.loads(body), self.spec.url)
                    except json.JSONDecodeError as e:
                        raise AgentError(f"{self.spec.url}: the answer is not JSON ({e.msg})") from None
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as e:
                # Only a failure to connect (or a dropped connection) is retried: a timeout or an
                # error status means the agent ran, and running it again would change the trial.
                if attempt >= self.spec.retries:
                    raise AgentError(f"{self.spec.url}: cannot connect ({e})") from None
                await asyncio.sleep(0.1 * 2**attempt)
                attempt += 1
            except TimeoutError:
                raise AgentError(f"{self.spec.url}: no answer within {self.spec.timeout_s}s") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class CommandRunner:
    def __init__(self, spec: CommandArm, folder: Path) -> None:
        self.spec = spec
        self.folder = folder

    async def __call__(self, request: dict[str, Any], ctx: TraceContext) -> dict[str, Any]:
        env = {**os.environ, **self.spec.env, "TRACEPARENT": ctx.traceparent, "BAGGAGE": ctx.baggage}
        endpoint, protocol = request.get("otlp_endpoint"), request.get("otlp_protocol")
        if endpoint and protocol:
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
            env["OTEL_EXPORTER_OTLP_PROTOCOL"] = protocol
            # The per-signal variables win over the general ones in every SDK: one left in the
            # environment would send the trial's spans elsewhere.
            for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
                env.pop(name, None)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.spec.argv, cwd=self.folder, env=env, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
        except OSError as e:
            raise AgentError(f"cannot start {self.spec.argv[0]}: {e.strerror or e}") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(json.dumps(request).encode()), self.spec.timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AgentError(f"{self.spec.argv[0]}: no answer within {self.spec.timeout_s}s") from None
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            raise AgentError(f"{self.spec.argv[0]} exited {proc.returncode}: {' | '.join(tail)}")
        text = out.decode(errors="replace").strip()
        try:
            return _answer(json.loads(text), self.spec.argv[0])
        except json.JSONDecodeError:
            # An agent may log to stdout: the answer is then its last line.
            last = text.splitlines()[-1] if text else ""
            try:
                return _answer(json.loads(last), self.spec.argv[0])
            except json.JSONDecodeError:
                raise AgentError(f"{self.spec.argv[0]}: stdout is not a JSON answer: {text[:120]!r}") from None

    async def close(self) -> None:
        return None


def import_callable(ref: str, folder: Path | None = None) -> Callable[..., Any]:
    module_name, _, attr = ref.partition(":")
    if folder is not None and str(folder) not in sys.path:
        sys.path.insert(0, str(folder))  # modules next to the campaign file
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{ref} is not callable")
    return target  # type: ignore[no-any-return]


class PythonRunner:
    """Calls ``module:function`` with the request dict (plus ``traceparent`` and ``baggage``).
    A coroutine function is awaited; a plain one runs in a worker thread."""

    def __init__(self, spec: PythonArm, folder: Path) -> None:
        self.fn = import_callable(spec.callable, folder)
        self.name = spec.callable
        self.is_async = inspect.iscoroutinefunction(self.fn)

    async def __call__(self, request: dict[str, Any], ctx: TraceContext) -> dict[str, Any]:
        payload = {**request, "traceparent": ctx.traceparent, "baggage": ctx.baggage}
        try:
            if self.is_async:
                raw = await self.fn(payload)
            else:
                raw = await asyncio.to_thread(self.fn, payload)
        except Exception as e:  # the agent's own failure is the trial's result
            raise AgentError(f"{self.name} raised {type(e).__name__}: {e}") from None
        return _answer(raw, self.name)

    async def close(self) -> None:
        return None


def make_runner(arm: Arm, folder: Path) -> Runner:
    if arm.http is not None:
        return HttpRunner(arm.http)
    if arm.command is not None:
        return CommandRunner(arm.command, folder)
    assert arm.python is not None
    return PythonRunner(arm.python, folder)


AnswerFn = Callable[[dict[str, Any], TraceContext], Awaitable[dict[str, Any]]]
