"""The on-disk export queue: serialised OTLP requests in SQLite (WAL), deleted only once the
backend has acknowledged them, so a backend outage or a restart loses nothing accepted.

All calls run on one dedicated thread (SQLite connections are not shared across threads, and
the event loop must not wait on disk).
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class DiskQueue:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="otel-plumb-queue")
        self._db: sqlite3.Connection | None = None

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _open(self) -> tuple[int, int, int]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a committed batch survives a process crash (SIGKILL); only an OS
        # crash or power loss can lose the last transactions.
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(
            "CREATE TABLE IF NOT EXISTS batches (id INTEGER PRIMARY KEY AUTOINCREMENT, spans INTEGER, body BLOB)"
        )
        self._db = db
        first, count, spans = db.execute("SELECT MIN(id), COUNT(*), COALESCE(SUM(spans), 0) FROM batches").fetchone()
        if first is None:
            row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'batches'").fetchone()
            first = (row[0] if row else 0) + 1
        return int(first), int(count), int(spans)

    async def open(self) -> tuple[int, int, int]:
        """Opens the file; returns (first id not yet acknowledged, batches waiting, spans waiting)."""
        result: tuple[int, int, int] = await self._run(self._open)
        return result

    def _put(self, body: bytes, spans: int) -> int:
        assert self._db is not None
        cur = self._db.execute("INSERT INTO batches (spans, body) VALUES (?, ?)", (spans, body))
        return int(cur.lastrowid or 0)

    async def put(self, body: bytes, spans: int) -> int:
        result: int = await self._run(self._put, body, spans)
        return result

    def _delete(self, batch_id: int) -> None:
        assert self._db is not None
        self._db.execute("DELETE FROM batches WHERE id = ?", (batch_id,))

    async def delete(self, batch_id: int) -> None:
        await self._run(self._delete, batch_id)

    def _load(self, after: int, limit_spans: int) -> list[tuple[int, bytes, int]]:
        assert self._db is not None
        rows: list[tuple[int, bytes, int]] = []
        total = 0
        for batch_id, body, spans in self._db.execute(
            "SELECT id, body, spans FROM batches WHERE id > ? ORDER BY id", (after,)
        ):
            rows.append((batch_id, body, spans))
            total += spans
            if total >= limit_spans:
                break
        return rows

    async def load(self, after: int, limit_spans: int) -> list[tuple[int, bytes, int]]:
        """Batches with id > ``after`` in order, up to about ``limit_spans`` spans."""
        result: list[tuple[int, bytes, int]] = await self._run(self._load, after, limit_spans)
        return result

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def close(self) -> None:
        await self._run(self._close)
        self._executor.shutdown(wait=True)
