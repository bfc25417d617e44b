"""Decided records written to the store off the hot path: the processor hands records to a
bounded queue (never waiting); one thread writes them in batches and applies retention."""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from otel_plumb.store.config import StoreConfig
from otel_plumb.store.db import TrajectoryStore

log = logging.getLogger("otel_plumb.store")

# Records per transaction, and how often retention runs.
BATCH = 500
EXPIRE_EVERY = 60.0

# outcome ("written", "dropped", "failed"), count
Outcome = Callable[[str, int], None]


class StoreWriter:
    def __init__(self, config: StoreConfig, outcome: Outcome | None = None) -> None:
        self.config = config
        self._outcome = outcome or (lambda _o, _n: None)
        self._queue: queue.Queue[Mapping[str, Any] | None] = queue.Queue(config.max_pending)
        self._thread: threading.Thread | None = None
        self._store: TrajectoryStore | None = None

    def start(self) -> None:
        """Open the store (errors surface here, at start) and start the writer thread."""
        try:
            self._store = TrajectoryStore(self.config.path)
            self._store.expire(self.config.max_age, self.config.max_bytes)
        except (sqlite3.Error, OSError) as exc:
            raise OSError(f"store.path: cannot open {self.config.path} as a trajectory store: {exc}") from None
        self._thread = threading.Thread(target=self._run, name="otel-plumb-store", daemon=True)
        self._thread.start()

    def offer(self, record: Mapping[str, Any]) -> bool:
        """Queue a record; False (and counted as dropped) when the queue is full."""
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._outcome("dropped", 1)
            return False
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued (for at most ``timeout``), then close the store."""
        if self._thread is None:
            return
        with contextlib.suppress(queue.Full):  # the thread is stuck: it stops with the process
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)
        self._thread = None
        if self._store is not None:
            self._store.close()

    def _run(self) -> None:
        next_expiry = time.monotonic() + EXPIRE_EVERY
        while True:
            batch, done = self._take()
            if batch:
                self._write(batch)
            if done:
                return
            if time.monotonic() >= next_expiry:
                next_expiry = time.monotonic() + EXPIRE_EVERY
                self._expire()

    def _take(self) -> tuple[list[Mapping[str, Any]], bool]:
        """The next batch: what is queued, waiting up to a second for the first record; True
        once the stop mark is reached."""
        batch: list[Mapping[str, Any]] = []
        try:
            item = self._queue.get(timeout=1.0)
        except queue.Empty:
            return batch, False
        while True:
            if item is None:
                return batch, True
            batch.append(item)
            if len(batch) >= BATCH:
                return batch, False
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, False

    def _write(self, batch: list[Mapping[str, Any]]) -> None:
        assert self._store is not None
        try:
            self._store.add(batch, "live")
        except Exception as exc:  # a full disk loses these records, never the processor
            log.error("cannot write %d trajectories to the store %s: %s", len(batch), self.config.path, exc)
            self._outcome("failed", len(batch))
        else:
            self._outcome("written", len(batch))

    def _expire(self) -> None:
        assert self._store is not None
        try:
            self._store.expire(self.config.max_age, self.config.max_bytes)
        except Exception as exc:
            log.error("store retention failed on %s: %s", self.config.path, exc)
