"""HTTP plumbing shared by the http and openai backends and the openai paraphraser (aiohttp).

Retries only what never reached the server or what the server asks to retry (connection
failures, 502/503/504), never follows redirects, and takes credentials from the environment.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any

import aiohttp
from yarl import URL

from otel_plumb.decision import DECGUARD_COMPAT_VERSION
from otel_plumb.decision.errors import BackendError, BackendTimeout, BackendUnavailable, ContractError, InvalidResponse

RETRYABLE_STATUS = frozenset({502, 503, 504})
SECRET_QUERY_KEYS = frozenset({"api_key", "apikey", "access_token", "token", "key", "signature", "auth", "password"})
USER_AGENT = f"otel-plumb-decision (decguard/{DECGUARD_COMPAT_VERSION} compatible)"


def check_url(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        url = URL(value)
    except (ValueError, TypeError) as exc:
        raise ValueError("invalid URL") from exc
    if url.scheme not in {"http", "https"} or not url.host:
        raise ValueError("must be an absolute http:// or https:// URL")
    if url.user or url.password:
        raise ValueError("must not embed credentials; use bearer_token_env or headers_from_env")
    secret = next((key for key in url.query if key.lower() in SECRET_QUERY_KEYS), None)
    if secret is not None:
        raise ValueError(
            f"query parameter {secret!r} looks like a credential; use an environment variable and a header"
        )
    return value


def redact_url(value: str) -> str:
    """Drop query and fragment, which may carry tokens."""
    return str(URL(value).with_query(None).with_fragment(None))


def env_value(variable: str, who: str) -> str:
    value = os.environ.get(variable)
    if not value:
        raise ContractError(f"{who}: environment variable {variable} is not set")
    return value


class HttpClient:
    """One aiohttp session per client, created lazily inside the running event loop."""

    def __init__(
        self,
        *,
        headers: Callable[[], dict[str, str]],
        timeout_s: float,
        max_retries: int,
        retry_backoff_s: float,
        who: str,
        retryable: frozenset[int] = RETRYABLE_STATUS,
    ) -> None:
        self.headers = headers
        """Called when the session opens, so a missing credential fails the run, not validation."""
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.who = who
        self.retryable = retryable
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers={"User-Agent": USER_AGENT, **self.headers()},
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            )
        return self._session

    async def send(self, method: str, url: str, body: Any = None) -> tuple[int, bytes, dict[str, str]]:
        """(status, body, headers) of the last attempt; a retryable status comes back after the last retry."""
        session = self._get_session()
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                async with session.request(method, url, json=body, allow_redirects=False) as response:
                    payload = await response.read()
                    if response.status not in self.retryable or last:
                        return response.status, payload, dict(response.headers)
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                # Nothing reached the server, so a retry is always safe.
                if last:
                    timed_out = isinstance(exc, aiohttp.ConnectionTimeoutError)
                    raise (BackendTimeout if timed_out else BackendUnavailable)(
                        f"cannot connect to {self.who}: {type(exc).__name__}"
                    ) from exc
            except TimeoutError as exc:
                raise BackendTimeout(f"{self.who} timed out after {self.timeout_s:g}s") from exc
            except aiohttp.ClientError as exc:
                raise BackendUnavailable(f"transport error from {self.who}: {type(exc).__name__}") from exc
            await asyncio.sleep(self.retry_backoff_s * (2**attempt))
        raise AssertionError("unreachable")

    async def post_json(self, url: str, body: Any) -> Any:
        return (await self.post(url, body))[0]

    async def post(self, url: str, body: Any) -> tuple[Any, dict[str, str]]:
        """The decoded JSON answer and the response headers; any non-2xx answer is a case error."""
        status, payload, headers = await self.send("POST", url, body)
        if status in self.retryable:
            raise BackendUnavailable(f"{self.who} returned HTTP {status}")
        if not 200 <= status < 300:
            # Bodies are untrusted and may echo credentials or private input: keep only the status.
            raise BackendError(f"{self.who} returned HTTP {status}")
        try:
            return json.loads(payload), headers
        except ValueError as exc:
            raise InvalidResponse(f"{self.who} returned invalid JSON") from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class ChatClient(HttpClient):
    """POST ``<base url>/chat/completions`` of an OpenAI-compatible server."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key_env: str | None,
        timeout_s: float,
        max_retries: int,
        retry_backoff_s: float,
        who: str,
    ) -> None:
        def headers() -> dict[str, str]:
            return {"Authorization": f"Bearer {env_value(api_key_env, who)}"} if api_key_env else {}

        super().__init__(
            headers=headers, timeout_s=timeout_s, max_retries=max_retries, retry_backoff_s=retry_backoff_s, who=who
        )
        self.url = base_url.rstrip("/") + "/chat/completions"

    async def complete(self, payload: dict[str, Any]) -> Any:
        return await self.post_json(self.url, payload)
