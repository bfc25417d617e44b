"""Bounded HTTP listeners: a cap on open connections, idle connections closed, and accept()
failures for lack of file descriptors logged at a rate limit (not a traceback each) while the
process keeps answering.

``serve`` starts an aiohttp application behind a ``ConnectionLimiter``. At the cap, a new
connection closes the connection idle the longest (no request in progress) and takes its
place; when every connection is busy the new one is answered ``503`` with ``Retry-After`` and
closed. Idle connections (before their first request or between requests) are closed after
``idle_timeout`` by aiohttp's keep-alive timer.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import ssl
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from otel_plumb.ratelimit import RateLimitedLog

log = logging.getLogger("otel_plumb.receive")
limited = RateLimitedLog(log)

_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 28\r\n\r\ntoo many connections, retry\n"
)
_EXHAUSTED = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))
# File descriptors kept free for everything but inbound connections (export connections,
# the queue database, log files, gRPC's own).
FD_RESERVE = 64
# Connections a listener accepts per wake-up (its backlog): a connection closed to make room
# gives its descriptor back only on the next turn of the loop, so each listener may briefly
# hold this many over its cap.
ACCEPT_BURST = 64


def open_file_limit() -> int | None:
    """The soft RLIMIT_NOFILE, raised to the hard limit first when that is possible (as the Go
    runtime does); None when unlimited."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return None if soft == resource.RLIM_INFINITY else int(soft)


def connection_budget(wanted: dict[str, int], fd_limit: int | None) -> dict[str, int]:
    """Per listener, its connection cap: as configured when the open-file limit allows them
    all at once plus ``FD_RESERVE`` and an accept burst per listener; otherwise lowered in
    proportion (at least 8 each), so that inbound connections alone cannot exhaust the
    descriptors."""
    if fd_limit is None or not wanted:
        return dict(wanted)
    available = max(8 * len(wanted), fd_limit - FD_RESERVE - ACCEPT_BURST * len(wanted))
    total = sum(wanted.values())
    if total <= available:
        return dict(wanted)
    return {name: max(8, n * available // total) for name, n in wanted.items()}


def connection_caps(wanted: dict[str, int]) -> dict[str, int]:
    """``connection_budget`` under this process's open-file limit, with a warning when lowered."""
    fd_limit = open_file_limit()
    caps = connection_budget(wanted, fd_limit)
    if caps != wanted:
        log.warning(
            "the open-file limit (%s) cannot hold %s connections at once; capped at %s "
            "(raise ulimit -n, or lower max_connections)",
            fd_limit,
            " + ".join(f"{n} {name}" for name, n in wanted.items()),
            ", ".join(f"{n} {name}" for name, n in caps.items()),
        )
    return caps


class _Refused(asyncio.Protocol):
    """A connection over the cap while every open one is busy: told to retry, then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(_REFUSED)
        transport.close()


class _Connection(asyncio.Protocol):
    """One accepted connection: forwards to aiohttp's handler and keeps the limiter's books."""

    __slots__ = ("busy", "closing", "handler", "limiter", "transport")

    def __init__(self, limiter: ConnectionLimiter, handler: asyncio.Protocol) -> None:
        self.limiter = limiter
        self.handler = handler
        self.transport: asyncio.BaseTransport | None = None
        self.busy = 0
        self.closing = False  # closed to make room: no longer counted as open

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.limiter._opened(self)
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self.handler.eof_received()

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.limiter._closed(self)
        self.handler.connection_lost(exc)

    def close(self) -> None:
        force_close = getattr(self.handler, "force_close", None)
        if force_close is not None:
            force_close()
        elif self.transport is not None:
            self.transport.close()


class ConnectionLimiter:
    """The open connections of one listener, at most ``max_connections``."""

    def __init__(self, what: str, max_connections: int) -> None:
        self.what = what
        self.max_connections = max_connections
        self.open = 0
        self.evicted = 0
        self.refused = 0
        # Idle connections, longest idle first; busy ones are not in it.
        self._idle: OrderedDict[_Connection, None] = OrderedDict()
        self._by_handler: dict[asyncio.Protocol, _Connection] = {}

    def factory(self, make_handler: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        def protocol() -> asyncio.Protocol:
            if self.open >= self.max_connections and not self._evict_one():
                self.refused += 1
                limited.warning(
                    f"refused:{self.what}",
                    "%s: %d connections open, all busy (max_connections); refusing new ones with 503",
                    self.what,
                    self.open,
                )
                return _Refused()
            return _Connection(self, make_handler())

        return protocol

    def _evict_one(self, quiet: bool = False) -> bool:
        while self._idle:
            conn, _ = self._idle.popitem(last=False)
            if conn.transport is None or conn.transport.is_closing():
                continue
            self.evicted += 1
            self.open -= 1
            conn.closing = True
            if not quiet:
                limited.warning(
                    f"evicted:{self.what}",
                    "%s: %d connections open (max_connections); closing the longest idle to take new ones",
                    self.what,
                    self.open + 1,
                )
            conn.close()
            return True
        return False

    def shed(self, fraction: float = 0.1) -> int:
        """Close the longest-idle tenth of the connections (the process ran out of descriptors)."""
        n = max(1, int(len(self._idle) * fraction)) if self._idle else 0
        closed = 0
        for _ in range(n):
            if not self._evict_one(quiet=True):
                break
            closed += 1
        return closed

    def _opened(self, conn: _Connection) -> None:
        self.open += 1
        self._idle[conn] = None
        self._by_handler[conn.handler] = conn

    def _closed(self, conn: _Connection) -> None:
        if not conn.closing:
            self.open -= 1
        self._idle.pop(conn, None)
        self._by_handler.pop(conn.handler, None)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Marks the connection busy while a request is in progress (so it is never evicted)."""
        conn = self._by_handler.get(request.protocol)
        if conn is None:
            return await handler(request)
        conn.busy += 1
        self._idle.pop(conn, None)
        try:
            return await handler(request)
        finally:
            conn.busy -= 1
            if not conn.busy and conn.transport is not None and not conn.transport.is_closing():
                self._idle[conn] = None


class _LimitedSite(web.BaseSite):
    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        limiter: ConnectionLimiter,
        ssl_context: ssl.SSLContext | None = None,
        handshake_timeout: float = 10.0,
    ) -> None:
        super().__init__(runner)
        self._host, self._port, self._limiter = host, port, limiter
        self._tls, self._handshake_timeout = ssl_context, handshake_timeout

    @property
    def name(self) -> str:
        return f"{'https' if self._tls is not None else 'http'}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._limiter.factory(server),
            self._host,
            self._port,
            reuse_address=True,
            backlog=ACCEPT_BURST,
            ssl=self._tls,
            ssl_handshake_timeout=self._handshake_timeout if self._tls is not None else None,
        )


# Limiters of the listeners running, per loop: shed when accept() runs out of descriptors.
_active: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[ConnectionLimiter]] = weakref.WeakKeyDictionary()


def _install_accept_handler(loop: asyncio.AbstractEventLoop) -> None:
    if loop in _active:
        return
    _active[loop] = set()
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _EXHAUSTED and "accept" in str(context.get("message", "")):
            closed = sum(limiter.shed() for limiter in _active.get(loop, ()))
            limited.error(
                "accept",
                "cannot accept connections: %s; closed %d idle connections, retrying in 1s "
                "(raise the open-file limit or lower max_connections)",
                exc.strerror,
                closed,
            )
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


async def serve(
    app: web.Application,
    host: str,
    port: int,
    what: str,
    max_connections: int,
    idle_timeout: float,
    ssl_context: ssl.SSLContext | None = None,
    **kwargs: Any,
) -> tuple[web.AppRunner, int, ConnectionLimiter]:
    """Start ``app`` on HOST:PORT behind a limiter, over TLS with ``ssl_context`` (a handshake
    not done in 10 s, or ``idle_timeout`` if shorter, is dropped); returns the runner, the bound
    port and the limiter. ``kwargs`` go to aiohttp's request handler (e.g. ``auto_decompress``)."""
    limiter = ConnectionLimiter(what, max_connections)
    loop = asyncio.get_running_loop()
    app.middlewares.insert(0, limiter.middleware)
    app.on_cleanup.append(lambda _app: _forget(loop, limiter))
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=idle_timeout, **kwargs)
    await runner.setup()
    handshake = min(10.0, idle_timeout) if idle_timeout > 0 else 10.0
    site = _LimitedSite(runner, host, port, limiter, ssl_context, handshake)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    _install_accept_handler(loop)
    _active[loop].add(limiter)
    server = site._server
    assert server is not None and server.sockets  # type: ignore[attr-defined]
    return runner, int(server.sockets[0].getsockname()[1]), limiter  # type: ignore[attr-defined]


async def _forget(loop: asyncio.AbstractEventLoop, limiter: ConnectionLimiter) -> None:
    _active.get(loop, set()).discard(limiter)
