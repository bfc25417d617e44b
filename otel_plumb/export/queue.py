"""The on-disk export queue: serialised OTLP requests in SQLite (WAL), deleted only once the
backend has acknowledged them, so a backend outage or a restart loses nothing accepted.

The same file journals received requests whose spans are still being assembled: a request is
journaled before it is acknowledged to the client, and its journal entry is released in the same
transaction that queues its last span for export. ``journal_done`` remembers which traces of a
journaled request were queued already, so a replay after a crash sends no span twice.

All calls run on one dedicated thread (SQLite connections are not shared across threads, and
the event loop must not wait on disk).

A file SQLite cannot read as a database (overwritten, truncated, a damaged page) is moved aside
as ``<name>.corrupt-<timestamp>`` (with its -wal and -shm files) and a fresh queue is started;
``moved_aside`` says so, for the caller to log and count.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# Page size of a new queue file. Bodies are whole requests (hundreds of KB at full load, when
# SDKs send full 512-span batches), stored as chains of overflow pages: at 16 KiB rather than
# SQLite's 4 KiB a third less CPU per byte goes on writing, checkpointing and deleting those
# chains. Small requests pay more (each commit writes whole pages), but they come at low load,
# when a batching exporter flushes on its timer (measured both: bench/export_queue.py). A file
# made with another page size keeps it (WAL mode fixes it).
PAGE_SIZE = 16384
# Bytes the WAL grows to before SQLite copies it back into the database.
WAL_CHECKPOINT_BYTES = 16 << 20
# Some builds of SQLite (Debian's among them) overwrite every deleted byte with zeros by default,
# which writes each request a second time, and checkpoints it, when its row is deleted. FAST
# still clears the b-tree pages (it costs no extra I/O) but leaves the freed overflow pages as
# they are until the next request reuses them: the file holds the spans still queued anyway,
# and the exporter makes its state directory its owner's alone (measured: bench/export_queue.py).
SECURE_DELETE = "FAST"

# SQLite's result codes for a file that is not (or no longer) a readable database.
_CORRUPT = frozenset({"SQLITE_CORRUPT", "SQLITE_NOTADB"})


def is_corrupt(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.DatabaseError) and (
        getattr(exc, "sqlite_errorname", "") in _CORRUPT or "malformed" in str(exc) or "not a database" in str(exc)
    )


class DiskQueue:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="otel-plumb-queue")
        self._db: sqlite3.Connection | None = None
        # (file moved aside, why) when the queue file was corrupt at open.
        self.moved_aside: tuple[Path, str] | None = None

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _open(self) -> tuple[int, int, int, int]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return self._connect()
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc):
                raise
            if self._db is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._db.close()
                self._db = None
            aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
            for suffix in ("", "-wal", "-shm"):
                source = Path(f"{self.path}{suffix}")
                if source.exists():
                    shutil.move(source, Path(f"{aside}{suffix}"))
            self.moved_aside = (aside, str(exc))
            return self._connect()

    def _connect(self) -> tuple[int, int, int, int]:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db = db
        db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # before WAL mode: applies to a new file only
        db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a committed batch survives a process crash (SIGKILL); only an OS
        # crash or power loss can lose the last transactions.
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(f"PRAGMA secure_delete={SECURE_DELETE}")
        # Every request is written twice (journaled, then queued as export batches) and deleted
        # soon after: with a WAL of 16 MiB rather than the default 4 MiB, more of those pages are
        # rewritten within one checkpoint and copied back once (bench/export_queue.py).
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        db.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_BYTES // page_size}")
        db.execute(
            "CREATE TABLE IF NOT EXISTS batches (id INTEGER PRIMARY KEY AUTOINCREMENT, spans INTEGER, body BLOB)"
        )
        db.execute("CREATE TABLE IF NOT EXISTS journal (id INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB)")
        db.execute(
            "CREATE TABLE IF NOT EXISTS journal_done (jid INTEGER, trace_id BLOB, PRIMARY KEY (jid, trace_id))"
            " WITHOUT ROWID"
        )
        db.execute("CREATE TABLE IF NOT EXISTS probe (body BLOB)")
        # Damage past the first page only shows when it is read: look at every page once now,
        # rather than have the sender fail on it later.
        problem = db.execute("PRAGMA quick_check").fetchone()[0]
        if problem != "ok":
            raise sqlite3.DatabaseError(f"database disk image is malformed: {problem}")
        first, count, spans, size = db.execute(
            "SELECT MIN(id), COUNT(*), COALESCE(SUM(spans), 0), COALESCE(SUM(LENGTH(body)), 0) FROM batches"
        ).fetchone()
        if first is None:
            row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'batches'").fetchone()
            first = (row[0] if row else 0) + 1
        return int(first), int(count), int(spans), int(size)

    async def open(self) -> tuple[int, int, int, int]:
        """Opens the file; returns (first id not yet acknowledged, batches waiting, spans waiting,
        bytes waiting)."""
        result: tuple[int, int, int, int] = await self._run(self._open)
        return result

    def _put(
        self, batches: list[tuple[bytes, int]], done: list[tuple[int, bytes]], released: list[int]
    ) -> list[int]:
        assert self._db is not None
        db = self._db
        ids = []
        db.execute("BEGIN")
        try:
            for body, spans in batches:
                cur = db.execute("INSERT INTO batches (spans, body) VALUES (?, ?)", (spans, body))
                ids.append(int(cur.lastrowid or 0))
            db.executemany("INSERT OR IGNORE INTO journal_done (jid, trace_id) VALUES (?, ?)", done)
            self._release(released)
            db.execute("COMMIT")
        except BaseException:
            # A full disk or an I/O error may have rolled the transaction back already.
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise
        return ids

    async def put(
        self, batches: list[tuple[bytes, int]], done: list[tuple[int, bytes]], released: list[int]
    ) -> list[int]:
        """Queue serialised requests; in the same transaction, mark (journal id, trace id) pairs
        as queued and drop the journal entries that have nothing left in flight."""
        result: list[int] = await self._run(self._put, batches, done, released)
        return result

    def _release(self, released: list[int]) -> None:
        assert self._db is not None
        params = [(jid,) for jid in released]
        self._db.executemany("DELETE FROM journal WHERE id = ?", params)
        self._db.executemany("DELETE FROM journal_done WHERE jid = ?", params)

    async def release(self, released: list[int]) -> None:
        await self._run(self._release, released)

    def _journal(self, body: bytes) -> int:
        assert self._db is not None
        cur = self._db.execute("INSERT INTO journal (body) VALUES (?)", (body,))
        return int(cur.lastrowid or 0)

    async def journal(self, body: bytes) -> int:
        """Journal a received request (durable when this returns); returns its journal id."""
        result: int = await self._run(self._journal, body)
        return result

    def _journaled(self) -> list[tuple[int, bytes, set[bytes]]]:
        assert self._db is not None
        done: dict[int, set[bytes]] = {}
        for jid, trace_id in self._db.execute("SELECT jid, trace_id FROM journal_done"):
            done.setdefault(jid, set()).add(trace_id)
        return [(jid, body, done.get(jid, set())) for jid, body in self._db.execute("SELECT id, body FROM journal")]

    async def journaled(self) -> list[tuple[int, bytes, set[bytes]]]:
        """Journaled requests left by a previous run: (journal id, body, trace ids already queued)."""
        result: list[tuple[int, bytes, set[bytes]]] = await self._run(self._journaled)
        return result

    def _delete(self, batch_ids: list[int]) -> None:
        assert self._db is not None
        self._db.executemany("DELETE FROM batches WHERE id = ?", [(i,) for i in batch_ids])

    async def delete(self, batch_ids: list[int]) -> None:
        await self._run(self._delete, batch_ids)

    def _probe(self, size: int, min_free: int) -> None:
        assert self._db is not None
        stat = os.statvfs(self.path.parent)
        free = stat.f_bavail * stat.f_frsize
        if free < min_free:
            raise OSError(28, f"{free} bytes free on the state directory's file system, less than {min_free}")
        self._db.execute("INSERT INTO probe (body) VALUES (randomblob(?))", (size,))
        self._db.execute("DELETE FROM probe")

    async def probe(self, size: int = 65536, min_free: int = 1 << 20) -> None:
        """A test write (``size`` bytes, then deleted); raises when it fails or when less than
        ``min_free`` bytes are free on the file system."""
        await self._run(self._probe, size, min_free)

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
