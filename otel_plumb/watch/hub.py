"""An asyncio fan-out of decided trajectory records with bounded per-subscriber queues."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

Record = dict[str, Any]


class Subscription:
    """One subscriber. A slow subscriber loses its oldest records, counted in ``dropped``;
    it never slows the processor down."""

    def __init__(self, hub: VerdictHub, accept: Callable[[Record], bool], maxsize: int) -> None:
        self._hub = hub
        self._accept = accept
        self._queue: asyncio.Queue[Record | None] = asyncio.Queue(maxsize)
        self.dropped = 0

    def offer(self, record: Record) -> None:
        if not self._accept(record):
            return
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
        self._queue.put_nowait(record)

    def close(self) -> None:
        self._hub._subscribers.discard(self)
        if self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator[Record]:
        while True:
            record = await self._queue.get()
            if record is None:
                return
            yield record


class VerdictHub:
    def __init__(self) -> None:
        self._subscribers: set[Subscription] = set()

    @property
    def has_subscribers(self) -> bool:
        return bool(self._subscribers)

    def subscribe(self, accept: Callable[[Record], bool] = lambda _r: True, maxsize: int = 10_000) -> Subscription:
        sub = Subscription(self, accept, maxsize)
        self._subscribers.add(sub)
        return sub

    def publish(self, record: Record) -> None:
        for sub in list(self._subscribers):
            sub.offer(record)

    def close(self) -> None:
        for sub in list(self._subscribers):
            sub.close()
