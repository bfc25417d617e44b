"""The on-disk export queue: serialised OTLP requests, deleted only once the backend has
acknowledged them, so a backend outage or a restart loses nothing accepted.

The same queue journals received requests whose spans are still being assembled: a request is
journaled before it is acknowledged to the client, and its journal entry is released in the same
transaction that queues its last span for export. ``journal_traces_done`` remembers which traces
of a journaled request were queued already, so a replay after a crash sends no span twice: one
row per journaled request and submit, its trace ids (16 bytes each) in one blob. (A row per
trace and request, as earlier versions wrote them, cost 1.35 CPU us per span against 0.52 with
traces finishing in another order than they came: ``bench/journal.py``.)

``decided_traces`` remembers, per trace whose spans were queued as a decided trace, its span ids
(in hex, in one text: as the intake holds them, nothing to convert) and when: written in the
transaction that queues them, read back at a restart, so that a resent span of a trace decided
before the restart (a client retrying a request whose acknowledgement was lost, a journaled
request replayed after a crash) is a duplicate, not the start of a second trajectory made of a
fragment.

The bytes of both, journaled requests and export batches, are in append-only segment files
(``segments.py``: one ``pwrite`` each, files reused) in ``<name>-segments/``; the SQLite file
(WAL) indexes them: where each is, its length and checksum (xxh3-64, ``checksum``), in the
transactions above. A body is only ever given back when its bytes match the length and checksum
its row recorded.

All calls run on one dedicated thread (SQLite connections are not shared across threads, and
the event loop must not wait on disk).

A file SQLite cannot read as a database (overwritten, truncated, a damaged page) is moved aside
as ``<name>.corrupt-<timestamp>`` (with its -wal and -shm files and its segments) and a fresh
queue is started; ``moved_aside`` says so, for the caller to log and count. A journaled request
or a batch whose bytes do not match their length and checksum (a segment damaged or lost, as an OS
crash can leave them) is dropped and listed in ``unreadable``, for the caller to log and count.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import xxhash

from otel_plumb.export.segments import Segments

T = TypeVar("T")

# SQLite's result codes for a file that is not (or no longer) a readable database.
_CORRUPT = frozenset({"SQLITE_CORRUPT", "SQLITE_NOTADB"})


def checksum(body: bytes) -> int:
    """xxh3-64 of ``body``, in the 63 bits an SQLite integer holds. Not CRC-32: it runs at memory
    speed (about 30 GB/s here against 6), and at 100 KB per model call zlib's CRC-32 took 7% of
    the processor's CPU."""
    return int(xxhash.xxh3_64_intdigest(body) >> 1)


def is_corrupt(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.DatabaseError) and (
        getattr(exc, "sqlite_errorname", "") in _CORRUPT or "malformed" in str(exc) or "not a database" in str(exc)
    )


@dataclass(slots=True)
class Unreadable:
    """A journaled request or export batch whose bytes could not be read back."""

    table: str  # "journal" or "batches"
    row_id: int
    spans: int  # of a batch (0 for a journaled request: its spans are not counted yet)
    length: int
    why: str


@dataclass(slots=True)
class _Bodies:
    """One kind of body in segment files, and the table indexing them."""

    name: str  # as ``Unreadable.table`` says it
    table: str
    files: Segments
    extra_columns: tuple[str, ...] = ()  # after segment, offset, length and checksum
    insert: str = field(init=False)

    def __post_init__(self) -> None:
        columns = ("id", "segment", "offset", "length", "checksum", *self.extra_columns)
        self.insert = f"INSERT INTO {self.table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


class DiskQueue:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="otel-plumb-queue")
        self._db: sqlite3.Connection | None = None
        segments = Path(f"{path}-segments")
        self._journal_bodies = _Bodies("journal", "journal_entries", Segments(segments / "journal"))
        self._batch_bodies = _Bodies("batches", "batch_entries", Segments(segments / "batches"), ("spans",))
        # (file moved aside, why) when the queue file was corrupt at open.
        self.moved_aside: tuple[Path, str] | None = None
        # What ``journaled`` and ``load`` could not read back (dropped), for the caller to report.
        self.unreadable: list[Unreadable] = []
        # Received requests waiting for the next journal write (``journal``), with their callers.
        self._journal_waiting: list[tuple[bytes, asyncio.Future[int]]] = []
        self._journal_writer: asyncio.Task[None] | None = None

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _open(self) -> tuple[int, int, int, int]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return self._connect()
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc):
                raise
            self._close()
            aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
            for suffix in ("", "-wal", "-shm", "-segments"):
                source = Path(f"{self.path}{suffix}")
                if source.exists():
                    shutil.move(source, Path(f"{aside}{suffix}"))
            self.moved_aside = (aside, str(exc))
            return self._connect()

    def _connect(self) -> tuple[int, int, int, int]:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db = db
        db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a committed batch survives a process crash (SIGKILL); only an OS
        # crash or power loss can lose the last transactions.
        db.execute("PRAGMA synchronous=NORMAL")
        where = "segment INTEGER NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL, checksum INTEGER NOT NULL"
        db.execute(
            "CREATE TABLE IF NOT EXISTS batch_entries"
            f" (id INTEGER PRIMARY KEY AUTOINCREMENT, spans INTEGER NOT NULL, {where})"
        )
        db.execute(f"CREATE TABLE IF NOT EXISTS journal_entries (id INTEGER PRIMARY KEY AUTOINCREMENT, {where})")
        db.execute("CREATE TABLE IF NOT EXISTS journal_traces_done (jid INTEGER NOT NULL, trace_ids BLOB NOT NULL)")
        db.execute("CREATE INDEX IF NOT EXISTS journal_traces_done_jid ON journal_traces_done (jid)")
        db.execute(
            "CREATE TABLE IF NOT EXISTS decided_traces"
            " (trace_id TEXT PRIMARY KEY, at REAL NOT NULL, span_ids TEXT NOT NULL)"
        )
        db.execute("CREATE INDEX IF NOT EXISTS decided_traces_at ON decided_traces (at)")
        db.execute("CREATE TABLE IF NOT EXISTS probe (body BLOB)")
        for bodies in (self._journal_bodies, self._batch_bodies):
            db.execute(f"CREATE INDEX IF NOT EXISTS {bodies.table}_segment ON {bodies.table} (segment)")
        # Damage past the first page only shows when it is read: look at every page once now,
        # rather than have the sender fail on it later.
        problem = db.execute("PRAGMA quick_check").fetchone()[0]
        if problem != "ok":
            raise sqlite3.DatabaseError(f"database disk image is malformed: {problem}")
        for bodies in (self._journal_bodies, self._batch_bodies):
            bodies.files.open(db.execute(f"SELECT segment, offset, length FROM {bodies.table}"))
        # Earlier versions kept the bodies in the rows: moved to segments, under the same ids
        # (journal_traces_done refers to journal ids, the sender's order to batch ids).
        moved = self._move_rows("journal", "id, body", self._journal_bodies)
        self._move_done_rows()
        if self._move_rows("batches", "id, body, spans", self._batch_bodies) or moved:
            db.execute("VACUUM")  # the file gives back the pages the bodies took
        first, count, spans, size = db.execute(
            "SELECT MIN(id), COUNT(*), COALESCE(SUM(spans), 0), COALESCE(SUM(length), 0) FROM batch_entries"
        ).fetchone()
        if first is None:
            row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'batch_entries'").fetchone()
            first = (row[0] if row else 0) + 1
        return int(first), int(count), int(spans), int(size)

    def _has_table(self, name: str) -> bool:
        assert self._db is not None
        found = self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
        return found.fetchone() is not None

    def _move_rows(self, old_table: str, columns: str, bodies: _Bodies) -> bool:
        """True when there was such a table."""
        assert self._db is not None
        db = self._db
        if not self._has_table(old_table):
            return False
        with self._transaction():
            added = [
                self._store(bodies, body, row_id, *extra)
                for row_id, body, *extra in db.execute(f"SELECT {columns} FROM {old_table}").fetchall()
            ]
            db.execute(f"DROP TABLE {old_table}")
        self._stored(bodies, added)
        return True

    def _move_done_rows(self) -> None:
        """Earlier versions kept a row per (journal id, trace id) in ``journal_done``: each is a
        row of one trace id now."""
        assert self._db is not None
        db = self._db
        if self._has_table("journal_done"):
            with self._transaction():
                db.execute("INSERT INTO journal_traces_done (jid, trace_ids) SELECT jid, trace_id FROM journal_done")
                db.execute("DROP TABLE journal_done")

    async def open(self) -> tuple[int, int, int, int]:
        """Opens the file; returns (first id not yet acknowledged, batches waiting, spans waiting,
        bytes waiting)."""
        result: tuple[int, int, int, int] = await self._run(self._open)
        return result

    # ---- bodies in segments, rows in the index --------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self) -> Any:
        assert self._db is not None
        db = self._db
        db.execute("BEGIN")
        try:
            yield
            db.execute("COMMIT")
        except BaseException:
            # A full disk or an I/O error may have rolled the transaction back already.
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise

    def _store(self, bodies: _Bodies, body: bytes, row_id: int | None = None, *extra: int) -> tuple[int, int, int]:
        """Writes ``body`` to a segment and inserts its row (``extra``: its ``extra_columns``);
        returns (segment, length, row id). ``_stored`` counts it in its segment once the row is
        committed."""
        assert self._db is not None
        segment, offset = bodies.files.write(body)
        cur = self._db.execute(bodies.insert, (row_id, segment, offset, len(body), checksum(body), *extra))
        return segment, len(body), int(cur.lastrowid or 0)

    def _stored(self, bodies: _Bodies, stored: list[tuple[int, int, int]]) -> None:
        for segment, length, _row_id in stored:
            bodies.files.add(segment, length)
        self._compact_sparse(bodies)  # a segment that stopped being written may be mostly empty

    def _read(
        self, bodies: _Bodies, row_id: int, spans: int, segment: int, offset: int, length: int, expected: int
    ) -> bytes | None:
        """A body as its row says it is, or None (listed in ``unreadable``)."""
        body = bodies.files.read(segment, offset, length)
        if body is not None and checksum(body) == expected:
            return body
        why = "missing or cut short" if body is None else "checksum mismatch"
        self.unreadable.append(
            Unreadable(bodies.name, row_id, spans, length, f"{length} bytes at {offset} of segment {segment}: {why}")
        )
        return None

    def _delete_rows(self, bodies: _Bodies, row_ids: list[int]) -> list[tuple[int, int]]:
        """Deletes rows (in the caller's transaction); returns their (segment, length) for
        ``_freed`` once committed."""
        assert self._db is not None
        sql = f"DELETE FROM {bodies.table} WHERE id = ? RETURNING segment, length"
        return [row for row_id in row_ids for row in self._db.execute(sql, (row_id,))]

    def _freed(self, bodies: _Bodies, freed: list[tuple[int, int]]) -> None:
        """Segment space of committed deletions; compacts the segments left mostly empty."""
        for segment, length in freed:
            bodies.files.remove(segment, length)
        self._compact_sparse(bodies)

    def _compact_sparse(self, bodies: _Bodies) -> None:
        for segment in bodies.files.take_sparse():
            self._compact(bodies, segment)

    def _compact(self, bodies: _Bodies, number: int) -> None:
        """Copies the live bodies of segment ``number`` to the current one and frees it; on a
        failure it is left as it is (and tried again once it is sparse again)."""
        assert self._db is not None
        db = self._db
        moved: list[tuple[int, int]] = []
        try:
            with self._transaction():
                rows = db.execute(
                    f"SELECT id, offset, length, checksum FROM {bodies.table} WHERE segment = ?", (number,)
                )
                for row_id, offset, length, expected in rows.fetchall():
                    body = bodies.files.read(number, offset, length)
                    if body is None or checksum(body) != expected:  # left for journaled/load to report
                        raise OSError(f"{bodies.name} row {row_id} in segment {number} cannot be read back")
                    segment, new_offset = bodies.files.write(body)
                    db.execute(
                        f"UPDATE {bodies.table} SET segment = ?, offset = ? WHERE id = ?", (segment, new_offset, row_id)
                    )
                    moved.append((segment, length))
        except (OSError, sqlite3.Error):
            return
        for segment, length in moved:
            bodies.files.add(segment, length)
        bodies.files.free(number)

    # ---- the queue and the journal --------------------------------------------------------------

    def _put(
        self, batches: list[tuple[bytes, int]], done: list[tuple[int, bytes]], released: list[int],
        decided: Sequence[tuple[str, float, str]] = (),
    ) -> list[int]:  # fmt: skip
        assert self._db is not None
        with self._transaction():
            stored = [self._store(self._batch_bodies, body, None, spans) for body, spans in batches]
            self._db.executemany("INSERT INTO journal_traces_done (jid, trace_ids) VALUES (?, ?)", done)
            # A trace's late spans add to its row; it keeps the time of its decision.
            self._db.executemany(
                "INSERT INTO decided_traces (trace_id, at, span_ids) VALUES (?, ?, ?)"
                " ON CONFLICT (trace_id) DO UPDATE SET span_ids = span_ids || excluded.span_ids",
                decided,
            )
            freed = self._delete_journal(released)
        self._stored(self._batch_bodies, stored)
        self._freed(self._journal_bodies, freed)
        return [row_id for _, _, row_id in stored]

    async def put(
        self, batches: list[tuple[bytes, int]], done: list[tuple[int, bytes]], released: list[int],
        decided: Sequence[tuple[str, float, str]] = (),
    ) -> list[int]:  # fmt: skip
        """Queue serialised requests; in the same transaction, mark traces of journaled requests
        as queued (``done``: journal id, and the trace ids, 16 bytes each, in one ``bytes``),
        drop the journal entries that have nothing left in flight, and remember the ``decided``
        traces queued (trace id, time of the decision as ``time.time()``, span ids)."""
        result: list[int] = await self._run(self._put, batches, done, released, decided)
        return result

    def _decided(self, since: float, limit: int) -> list[tuple[str, float, str]]:
        assert self._db is not None
        rows = self._db.execute(
            "SELECT trace_id, at, span_ids FROM decided_traces WHERE at >= ? ORDER BY at DESC LIMIT ?", (since, limit)
        ).fetchall()
        return [(str(t), float(at), str(ids)) for t, at, ids in reversed(rows)]

    async def decided(self, since: float, limit: int) -> list[tuple[str, float, str]]:
        """The ``limit`` traces decided last, at ``since`` or later, oldest first: (trace id, time
        of the decision, span ids, 16 hex characters each)."""
        result: list[tuple[str, float, str]] = await self._run(self._decided, since, limit)
        return result

    def _forget_decided(self, before: float, keep: int) -> None:
        assert self._db is not None
        with self._transaction():
            self._db.execute("DELETE FROM decided_traces WHERE at < ?", (before,))
            self._db.execute(
                "DELETE FROM decided_traces"
                " WHERE at < (SELECT at FROM decided_traces ORDER BY at DESC LIMIT 1 OFFSET ?)",
                (max(keep - 1, 0),),  # older than the keep-th decided last
            )

    async def forget_decided(self, before: float, keep: int) -> None:
        """Forget the traces decided before ``before``, and all but the ``keep`` decided last."""
        await self._run(self._forget_decided, before, keep)

    def _delete_journal(self, released: list[int]) -> list[tuple[int, int]]:
        assert self._db is not None
        self._db.executemany("DELETE FROM journal_traces_done WHERE jid = ?", [(jid,) for jid in released])
        return self._delete_rows(self._journal_bodies, released)

    def _release(self, released: list[int]) -> None:
        with self._transaction():
            freed = self._delete_journal(released)
        self._freed(self._journal_bodies, freed)

    async def release(self, released: list[int]) -> None:
        await self._run(self._release, released)

    def _journal(self, bodies: list[bytes]) -> list[int]:
        with self._transaction():
            stored = [self._store(self._journal_bodies, body) for body in bodies]
        self._stored(self._journal_bodies, stored)
        return [row_id for _, _, row_id in stored]

    async def journal(self, body: bytes) -> int:
        """Journal a received request (durable when this returns); returns its journal id.

        Group commit: the requests that arrive while a journal write is on the storage thread
        go in the next one, in one transaction. Under load that is one thread round trip and
        one commit for several requests (``bench/journal.py``: 113 CPU us per 600 KB request with
        many in flight, against 224 written one by one); alone, a request is written at once."""
        loop = asyncio.get_running_loop()
        written: asyncio.Future[int] = loop.create_future()
        self._journal_waiting.append((body, written))
        if self._journal_writer is None or self._journal_writer.done():
            self._journal_writer = loop.create_task(self._write_journal())
        return await written

    async def _write_journal(self) -> None:
        """Writes the waiting requests a group at a time until none is waiting. A failed write
        fails every request of its group (nothing of it was committed; their clients retry)."""
        while self._journal_waiting:
            group, self._journal_waiting = self._journal_waiting, []
            try:
                ids: list[int] = await self._run(self._journal, [body for body, _ in group])
            except Exception as exc:
                for _, written in group:
                    if not written.done():
                        written.set_exception(exc)
                continue
            for (_, written), journal_id in zip(group, ids, strict=True):
                if not written.done():  # a request whose client went away still is journaled
                    written.set_result(journal_id)

    def _journaled(self) -> list[tuple[int, bytes, set[bytes]]]:
        assert self._db is not None
        done: dict[int, set[bytes]] = {}
        for jid, trace_ids in self._db.execute("SELECT jid, trace_ids FROM journal_traces_done"):
            done.setdefault(jid, set()).update(trace_ids[i : i + 16] for i in range(0, len(trace_ids), 16))
        entries, lost = [], []
        for jid, *where in self._db.execute(
            "SELECT id, segment, offset, length, checksum FROM journal_entries ORDER BY id"
        ).fetchall():
            body = self._read(self._journal_bodies, jid, 0, *where)
            if body is None:
                lost.append(jid)
            else:
                entries.append((jid, body, done.get(jid, set())))
        if lost:
            self._release(lost)
        return entries

    async def journaled(self) -> list[tuple[int, bytes, set[bytes]]]:
        """Journaled requests left by a previous run: (journal id, body, trace ids already queued)."""
        result: list[tuple[int, bytes, set[bytes]]] = await self._run(self._journaled)
        return result

    def _delete(self, batch_ids: list[int]) -> None:
        with self._transaction():
            freed = self._delete_rows(self._batch_bodies, batch_ids)
        self._freed(self._batch_bodies, freed)

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
        lost: list[int] = []
        total = 0
        cursor = self._db.execute(
            "SELECT id, spans, segment, offset, length, checksum FROM batch_entries WHERE id > ? ORDER BY id", (after,)
        )
        for batch_id, spans, *where in cursor:
            body = self._read(self._batch_bodies, batch_id, spans, *where)
            if body is None:
                lost.append(batch_id)
                continue
            rows.append((batch_id, body, spans))
            total += spans
            if total >= limit_spans:
                break
        cursor.close()
        if lost:
            self._delete(lost)
        return rows

    async def load(self, after: int, limit_spans: int) -> list[tuple[int, bytes, int]]:
        """Batches with id > ``after`` in order, up to about ``limit_spans`` spans; those that
        cannot be read back are dropped and listed in ``unreadable``."""
        result: list[tuple[int, bytes, int]] = await self._run(self._load, after, limit_spans)
        return result

    def _close(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None
        self._journal_bodies.files.close()
        self._batch_bodies.files.close()

    async def close(self) -> None:
        await self._run(self._close)
        self._executor.shutdown(wait=True)
