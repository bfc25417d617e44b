"""Authentication for the listeners: bearer tokens, as the Collector's ``bearertokenauth`` does
it, and client-certificate identities on mTLS listeners.

One ``auth`` block, the same on ``receivers.grpc`` (OTLP Export and Watch), ``receivers.http`` and
``metrics``::

    auth:
      bearer_tokens:
        - token: ${env:PLUMB_TOKEN}
          tenant: team-a
        - token_file: /var/run/secrets/plumb/token   # re-read when it changes
      client_certificates:                           # needs the listener's tls.client_ca_file
        - uri: spiffe://example.org/ns/team-b/*
          tenant: team-b
      protect_health: false                          # metrics only: /healthz, /readyz open

Several tokens are accepted at once, so one can be rotated while the other is in use. A token
is compared in constant time against every configured token. A request that carries no token
(or whose listener takes no tokens) is accepted when its TLS client certificate, already
verified against ``client_ca_file`` in the handshake, matches a ``client_certificates`` entry.
A failed attempt is refused (gRPC UNAUTHENTICATED, HTTP 401 with ``WWW-Authenticate: Bearer``),
reported through ``on_failure(listener, reason)`` with reason ``missing``, ``invalid`` (a token
matching none) or ``certificate`` (no token, and a certificate matching no entry), and logged at
a rate limit with the listener and the peer, never with the token or the header.

The tenant of the matching token or certificate entry, when it has one, is set in
:data:`TENANT` for the rest of the request: the processor puts it on the request's spans as
``plumb.tenant``.
"""

from __future__ import annotations

import fnmatch
import hmac
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, model_validator

from otel_plumb.configtypes import FilePath
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
    token_file: FilePath | None = None
    tenant: str | None = Field(default=None, min_length=1, max_length=128)

    @model_validator(mode="after")
    def _one_source(self) -> BearerToken:
        if (self.token is None) == (self.token_file is None):
            raise ValueError("each bearer token is exactly one of token or token_file")
        return self


class ClientCertificate(BaseModel):
    """Verified client certificates this entry accepts: every pattern given must match (globs:
    ``*`` any run of characters, dots and slashes included, ``?`` one, ``[...]`` a set)."""

    model_config = ConfigDict(extra="forbid")

    # The subject's common name (case-sensitive).
    common_name: str | None = Field(default=None, min_length=1)
    # One of the DNS names of the subjectAltName (case-insensitive, as DNS is).
    dns_name: str | None = Field(default=None, min_length=1)
    # One of the URIs of the subjectAltName, e.g. a SPIFFE ID (case-sensitive).
    uri: str | None = Field(default=None, min_length=1)
    tenant: str | None = Field(default=None, min_length=1, max_length=128)

    @model_validator(mode="after")
    def _some_pattern(self) -> ClientCertificate:
        if self.common_name is None and self.dns_name is None and self.uri is None:
            raise ValueError("each client certificate entry needs common_name, dns_name or uri")
        return self

    def matches(self, peer: PeerIdentity) -> bool:
        if self.common_name is not None and not _any_match(peer.common_names, self.common_name):
            return False
        if self.dns_name is not None and not _any_match((n.lower() for n in peer.dns_names), self.dns_name.lower()):
            return False
        return self.uri is None or _any_match(peer.uris, self.uri)


def _any_match(names: Iterable[str], pattern: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for name in names)


class AuthConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bearer_tokens: list[BearerToken] = Field(default_factory=list)
    # Client-certificate identities accepted without a token; the listener needs tls.client_ca_file.
    client_certificates: list[ClientCertificate] = Field(default_factory=list)
    # On the metrics listener: also require a token for /healthz and /readyz (probes then need it).
    protect_health: bool = False

    @model_validator(mode="after")
    def _some_credential(self) -> AuthConfig:
        if not self.bearer_tokens and not self.client_certificates:
            raise ValueError("auth needs bearer_tokens, client_certificates or both")
        return self


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    """The names of a TLS client's verified certificate."""

    common_names: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    uris: tuple[str, ...] = ()


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
    """Checks ``Authorization: Bearer <token>`` values and client certificates for one listener."""

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

    def _token_counts(self, header: str | None) -> bool:
        """Whether the request is judged by its token: it has one and the listener takes tokens.
        A listener taking only certificates ignores an Authorization header meant for elsewhere."""
        return bool(header) and bool(self._entries)

    def authenticate(self, header: str | None, peer: Callable[[], PeerIdentity | None]) -> str | None:
        """The tenant ("" for none) of the request's token or, without one, of the first
        ``client_certificates`` entry its verified certificate (``peer()``, read only when
        entries are configured) matches; None: refuse."""
        if self._token_counts(header):
            return self.tenant_of(header)
        identity = peer() if self.config.client_certificates else None
        if identity is not None:
            for entry in self.config.client_certificates:
                if entry.matches(identity):
                    return entry.tenant or ""
        return None

    def refused(self, header: str | None, peer: str | None) -> None:
        """Count and log (rate-limited) a refused attempt; the header is only looked at to say
        whether it was there."""
        if self._token_counts(header):
            reason, what = "invalid", "invalid bearer token"
        elif self.config.client_certificates:
            reason, what = "certificate", "no bearer token, and a client certificate matching no allowed identity"
        else:
            reason, what = "missing", "missing bearer token"
        if self._on_failure is not None:
            self._on_failure(self.listener, reason)
        _failure_log.warning(
            f"auth:{self.listener}:{reason}",
            "refused an unauthenticated request on %s from %s: %s",
            self.listener, peer or "unknown peer", what,
        )  # fmt: skip


# ---- gRPC -------------------------------------------------------------------------------------


def _metadata_value(metadata: Any, key: str) -> str | None:
    for k, v in metadata or ():
        if k == key:
            return v if isinstance(v, str) else None
    return None


def grpc_peer(context: grpc.aio.ServicerContext[Any, Any]) -> PeerIdentity | None:
    """The verified client certificate's names from the call's auth context (gRPC puts them
    there only for a certificate that passed the handshake); None without one."""
    props = context.auth_context()

    def names(key: str) -> tuple[str, ...]:
        return tuple(v.decode("utf-8", "replace") for v in props.get(key, ()))

    common_names = names("x509_common_name")
    if not common_names and "x509_subject" not in props:
        return None
    return PeerIdentity(common_names, names("peer_dns"), names("peer_uri"))


if TYPE_CHECKING:  # generic in the stubs only
    _Interceptor: TypeAlias = grpc.aio.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.aio.ServerInterceptor


class GrpcAuthInterceptor(_Interceptor):
    """Every method of the server (OTLP Export, Watch) requires the bearer token in the
    ``authorization`` metadata or an accepted client certificate; otherwise the call ends
    UNAUTHENTICATED before the method runs."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        header = _metadata_value(handler_call_details.invocation_metadata, "authorization")
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return _guarded(handler, self._auth, header)


def _guarded(
    handler: grpc.RpcMethodHandler[Any, Any], auth: Authenticator, header: str | None
) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` behind the credential check, which needs the call's context (the peer's
    certificate is not in the call details); :data:`TENANT` set while the method runs. A single
    request is taken as bytes and decoded only once the call is admitted."""

    async def admit(context: grpc.aio.ServicerContext[Any, Any]) -> None:
        tenant = auth.authenticate(header, lambda: grpc_peer(context))
        if tenant is None:
            auth.refused(header, context.peer())
            context.set_trailing_metadata((("www-authenticate", "Bearer"),))
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid credentials")
        TENANT.set(tenant)

    des, ser = handler.request_deserializer, handler.response_serializer

    def decode(raw: Any) -> Any:
        return des(raw) if des is not None else raw

    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(raw: Any, context: Any) -> Any:
            await admit(context)
            return await inner_uu(decode(raw), context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, None, ser)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(raw: Any, context: Any) -> Any:
            await admit(context)
            stream: Any = inner_us(decode(raw), context)
            async for item in stream:
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, None, ser)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: Any) -> Any:
            await admit(context)  # before the first message is read
            return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, des, ser)
    inner_ss = handler.stream_stream
    assert inner_ss is not None  # a handler has exactly one of the four

    async def stream_stream(requests: Any, context: Any) -> Any:
        await admit(context)
        stream: Any = inner_ss(requests, context)
        async for item in stream:
            yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, des, ser)


# ---- HTTP -------------------------------------------------------------------------------------

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def http_peer(request: web.Request) -> PeerIdentity | None:
    """The verified client certificate's names (``ssl`` reports a certificate only once it
    passed verification); None on plaintext or without one."""
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return None
    common_names = tuple(value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName")
    alt = cert.get("subjectAltName", ())
    return PeerIdentity(
        common_names,
        tuple(value for kind, value in alt if kind == "DNS"),
        tuple(value for kind, value in alt if kind == "URI"),
    )


def http_middleware(authenticator: Authenticator, open_paths: frozenset[str] = frozenset()) -> Any:
    """An aiohttp middleware requiring ``Authorization: Bearer <token>`` or an accepted client
    certificate on every path but ``open_paths``; refused requests get 401 with
    ``WWW-Authenticate: Bearer``."""

    @web.middleware
    async def authenticate(request: web.Request, handler: _Handler) -> web.StreamResponse:
        if request.path in open_paths:
            return await handler(request)
        header = request.headers.get("Authorization")
        tenant = authenticator.authenticate(header, lambda: http_peer(request))
        if tenant is None:
            authenticator.refused(header, request.remote)
            response = web.Response(
                status=401, text="missing or invalid credentials\n", headers={"WWW-Authenticate": "Bearer"}
            )
            if request.can_read_body:  # the body is not read: close rather than drain it
                response.force_close()
            return response
        TENANT.set(tenant)
        return await handler(request)

    return authenticate
