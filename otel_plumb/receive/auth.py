"""Bearer-token authentication for the listeners, as the Collector's ``bearertokenauth`` does it.

One ``auth`` block, the same on ``receivers.grpc`` (OTLP Export and Watch), ``receivers.http`` and
``metrics``::

    auth:
      bearer_tokens:
        - token: ${env:PLUMB_TOKEN}
          tenant: team-a
        - token_file: /var/run/secrets/plumb/token   # re-read when it changes
      protect_health: false                          # metrics only: /healthz, /readyz open

Several tokens are accepted at once, so one can be rotated while the other is in use. A token
is compared in constant time against every configured token. A failed attempt is refused
(gRPC UNAUTHENTICATED, HTTP 401 with ``WWW-Authenticate: Bearer``), reported through
``on_failure(listener, reason)`` with reason ``missing`` or ``invalid``, and logged at a rate
limit with the listener and the peer, never with the token or the header.

The tenant of the matching token, when it has one, is set in :data:`TENANT` for the rest of
the request: the processor puts it on the request's spans as ``plumb.tenant``.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import grpc
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, model_validator

from otel_plumb.ratelimit import RateLimitedLog

log = logging.getLogger("otel_plumb.auth")
_failure_log = RateLimitedLog(log)

# The tenant of the request being handled: None when its listener has no auth, "" when the
# token has no tenant, else the tenant's name.
TENANT: ContextVar[str | None] = ContextVar("plumb_tenant", default=None)
TENANT_ATTRIBUTE = "plumb.tenant"

# A token file bigger than this is refused (a token is a line, not a document).
_MAX_TOKEN_FILE = 64 * 1024


class BearerToken(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The token itself (use ${env:NAME} to keep it out of the file), or a file holding it.
    token: str | None = Field(default=None, min_length=1, repr=False)
    token_file: str | None = None
    tenant: str | None = Field(default=None, min_length=1, max_length=128)

    @model_validator(mode="after")
    def _one_source(self) -> BearerToken:
        if (self.token is None) == (self.token_file is None):
            raise ValueError("each bearer token is exactly one of token or token_file")
        return self


class AuthConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bearer_tokens: list[BearerToken] = Field(min_length=1)
    # On the metrics listener: also require a token for /healthz and /readyz (probes then need it).
    protect_health: bool = False


class _FileToken:
    """A token read from a file, re-read when the file's mtime, size or inode changes."""

    __slots__ = ("_key", "_value", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._key: tuple[int, int, int] | None = None
        self._value: bytes | None = None

    def value(self) -> bytes | None:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            _failure_log.error(f"token_file:{self.path}", "cannot read token_file %s: %s", self.path, exc.strerror)
            self._key, self._value = None, None
            return None
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key != self._key:
            try:
                with open(self.path, "rb") as f:
                    data = f.read(_MAX_TOKEN_FILE + 1)
            except OSError as exc:
                _failure_log.error(f"token_file:{self.path}", "cannot read token_file %s: %s", self.path, exc.strerror)
                return None
            if len(data) > _MAX_TOKEN_FILE:
                _failure_log.error(f"token_file:{self.path}", "token_file %s is too big for a token", self.path)
                data = b""
            token = data.strip()
            self._key, self._value = key, token or None
        return self._value


class Authenticator:
    """Checks ``Authorization: Bearer <token>`` values for one listener."""

    def __init__(
        self, config: AuthConfig, listener: str, on_failure: Callable[[str, str], None] | None = None
    ) -> None:
        self.config = config
        self.listener = listener
        self._on_failure = on_failure
        self._entries: list[tuple[bytes | _FileToken, str]] = [
            (t.token.encode() if t.token is not None else _FileToken(str(t.token_file)), t.tenant or "")
            for t in config.bearer_tokens
        ]

    def tenant_of(self, header: str | None) -> str | None:
        """The tenant ("" for none) of the token in an Authorization header value; None when it
        is missing or matches no configured token."""
        if not header:
            return None
        scheme, _, credentials = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            return None
        given = credentials.strip().encode()
        found: str | None = None
        # Every token is compared, whatever matched, so the time taken says nothing about which.
        for source, tenant in self._entries:
            expected = source if isinstance(source, bytes) else source.value()
            if expected is None:
                continue
            if hmac.compare_digest(given, expected) and found is None:
                found = tenant
        return found

    def refused(self, header: str | None, peer: str | None) -> None:
        """Count and log (rate-limited) a refused attempt; the header is only looked at to say
        whether it was there."""
        reason = "missing" if not header else "invalid"
        if self._on_failure is not None:
            self._on_failure(self.listener, reason)
        _failure_log.warning(
            f"auth:{self.listener}:{reason}",
            "refused an unauthenticated request on %s from %s: %s bearer token",
            self.listener, peer or "unknown peer", reason,
        )  # fmt: skip


# ---- gRPC -------------------------------------------------------------------------------------


def _metadata_value(metadata: Any, key: str) -> str | None:
    for k, v in metadata or ():
        if k == key:
            return v if isinstance(v, str) else None
    return None


if TYPE_CHECKING:  # generic in the stubs only
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.aio.ServerInterceptor


class GrpcAuthInterceptor(_Interceptor):
    """Every method of the server (OTLP Export, Watch) requires the bearer token in the
    ``authorization`` metadata; without it the call ends UNAUTHENTICATED before the method runs."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        header = _metadata_value(handler_call_details.invocation_metadata, "authorization")
        tenant = self._auth.tenant_of(header)
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if tenant is None:
            return self._deny(handler, header)
        return _with_tenant(handler, tenant)

    def _deny(self, handler: grpc.RpcMethodHandler[Any, Any], header: str | None) -> grpc.RpcMethodHandler[Any, Any]:
        auth = self._auth

        async def abort(context: grpc.aio.ServicerContext[Any, Any]) -> None:
            auth.refused(header, context.peer())
            context.set_trailing_metadata((("www-authenticate", "Bearer"),))
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

        async def unary(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await abort(context)

        async def streaming(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await abort(context)
            yield  # pragma: no cover - never reached: abort raises

        # The request is not decoded: nothing of it is looked at.
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(streaming)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(unary)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(streaming)
        return grpc.unary_unary_rpc_method_handler(unary)


def _with_tenant(handler: grpc.RpcMethodHandler[Any, Any], tenant: str) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` with :data:`TENANT` set while its method runs."""
    des, ser = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            TENANT.set(tenant)
            return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, des, ser)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> Any:
            TENANT.set(tenant)
            stream: Any = inner_us(request, context)
            async for item in stream:
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, des, ser)
    return handler  # streaming requests: none served today; the token was checked all the same


# ---- HTTP -------------------------------------------------------------------------------------

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def http_middleware(authenticator: Authenticator, open_paths: frozenset[str] = frozenset()) -> Any:
    """An aiohttp middleware requiring ``Authorization: Bearer <token>`` on every path but
    ``open_paths``; refused requests get 401 with ``WWW-Authenticate: Bearer``."""

    @web.middleware
    async def authenticate(request: web.Request, handler: _Handler) -> web.StreamResponse:
        if request.path in open_paths:
            return await handler(request)
        header = request.headers.get("Authorization")
        tenant = authenticator.tenant_of(header)
        if tenant is None:
            authenticator.refused(header, request.remote)
            response = web.Response(
                status=401, text="missing or invalid bearer token\n", headers={"WWW-Authenticate": "Bearer"}
            )
            if request.can_read_body:  # the body is not read: close rather than drain it
                response.force_close()
            return response
        TENANT.set(tenant)
        return await handler(request)

    return authenticate
