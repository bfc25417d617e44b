"""The trajectory store: decided records (the report shape, ``report.records.decided_record``)
in SQLite, from the live processor, ``replay --store`` and campaigns, side by side with a
campaign store's tables when both use one file.

One row per decided trajectory (the columns the console filters on, and the record as
zstd-compressed JSON, its steps either a list of records or a table, ``{"keys": [...], "rows":
[[...], ...]}``, which reads back as the list) and one row per verdict (to find trajectories by
policy, invariant and severity). Lists are keyset paginated newest first, so a page costs the
same at any depth; every filter has an index.
"""

from __future__ import annotations

import base64
import contextlib
import heapq
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import orjson
import zstandard

from otel_plumb.model import SEVERITIES
from otel_plumb.model.text import record_json

SOURCES = ("live", "replay", "campaign")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS decided (
  id INTEGER PRIMARY KEY, source TEXT NOT NULL, run_id TEXT, trial_id TEXT, decided_at REAL NOT NULL,
  trace_id TEXT NOT NULL, key TEXT NOT NULL, agent TEXT, service TEXT, status TEXT NOT NULL,
  failed INTEGER NOT NULL, worst TEXT, record BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS decided_by_time ON decided (decided_at, id);
CREATE INDEX IF NOT EXISTS decided_by_status ON decided (status, decided_at, id);
CREATE INDEX IF NOT EXISTS decided_by_agent ON decided (agent, decided_at, id);
CREATE INDEX IF NOT EXISTS decided_by_service ON decided (service, decided_at, id);
CREATE INDEX IF NOT EXISTS decided_by_trace ON decided (trace_id);
CREATE INDEX IF NOT EXISTS decided_by_key ON decided (key);
CREATE INDEX IF NOT EXISTS decided_by_run ON decided (run_id, trial_id);
CREATE TABLE IF NOT EXISTS decided_verdicts (
  decided_id INTEGER NOT NULL, decided_at REAL NOT NULL, policy TEXT, invariant TEXT NOT NULL,
  verdict TEXT NOT NULL, severity TEXT NOT NULL, step_index INTEGER
);
CREATE INDEX IF NOT EXISTS verdicts_by_invariant ON decided_verdicts (invariant, verdict, decided_at, decided_id);
CREATE INDEX IF NOT EXISTS verdicts_by_policy ON decided_verdicts (policy, decided_at, decided_id);
CREATE INDEX IF NOT EXISTS verdicts_by_severity ON decided_verdicts (verdict, severity, decided_at, decided_id);
CREATE INDEX IF NOT EXISTS verdicts_by_trajectory ON decided_verdicts (decided_id);
"""

# A record is repetitive JSON (field names, ids, tool names): zstd at level 1 makes it about a
# seventh the size, and SQLite writes the smaller row (no overflow pages, a seventh of the WAL
# and checkpoint traffic) for far less than the compression costs (bench/store.py). Records
# stored uncompressed by earlier versions still read: JSON never starts with zstd's magic.
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_LEVEL = 1


def _unpack(blob: bytes) -> dict[str, Any]:
    record: dict[str, Any] = orjson.loads(zstandard.decompress(blob) if blob[:4] == _ZSTD_MAGIC else blob)
    steps = record.get("steps")
    if isinstance(steps, dict):  # kept as a table: the keys once, a row per step
        keys = steps["keys"]
        record["steps"] = [dict(zip(keys, row, strict=True)) for row in steps["rows"]]
    return record


# Page sizes: the default, and the most one page may hold.
PAGE = 50
MAX_PAGE = 500


class QueryError(ValueError):
    """A filter or cursor that cannot be used; the message says which."""


@dataclass(slots=True)
class Filters:
    """What a list of trajectories is narrowed to (all optional; all must hold)."""

    policy: str | None = None
    invariant: str | None = None
    # A failed verdict of at least this severity.
    severity: str | None = None
    status: str | None = None
    agent: str | None = None
    service: str | None = None
    key: str | None = None
    trace_id: str | None = None
    source: str | None = None
    run_id: str | None = None
    since: float | None = None
    until: float | None = None


def _worst(failed: Iterable[Mapping[str, Any]]) -> str | None:
    """The highest severity of these failed verdicts."""
    severities = [v.get("severity") for v in failed]
    return min(severities, key=lambda s: SEVERITIES.index(s) if s in SEVERITIES else len(SEVERITIES), default=None)


def _cursor(decided_at: float, row_id: int) -> str:
    return base64.urlsafe_b64encode(f"{decided_at!r}:{row_id}".encode()).decode()


def _parse_cursor(cursor: str) -> tuple[float, int]:
    try:
        at, _, row_id = base64.urlsafe_b64decode(cursor.encode()).decode().partition(":")
        return float(at), int(row_id)
    except (ValueError, UnicodeDecodeError) as exc:
        raise QueryError(f"cursor {cursor!r} is not one this store gave out") from exc


class TrajectoryStore:
    """One SQLite file. ``readonly`` for the console: it never writes, even by mistake."""

    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = Path(path)
        if readonly:
            if not self.path.exists():
                raise FileNotFoundError(f"{self.path}: no such store")
            self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            # Deleted records give their pages back to the file (retention by size).
            self.db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
        self.readonly = readonly
        # One compressor per store: a store is written by one thread at a time.
        self._compressor = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)

    def close(self) -> None:
        self.db.close()

    # ---- writing ---------------------------------------------------------------------------

    def add(self, records: Sequence[Mapping[str, Any]], source: str, run_id: str | None = None,
            decided_at: float | None = None) -> None:  # fmt: skip
        """Store decided records (``decided_record`` shape) in one transaction. Each record may
        carry ``trial_id``; ``decided_at`` defaults to now."""
        if source not in SOURCES:
            raise ValueError(f"source {source!r} is not one of {', '.join(SOURCES)}")
        if not records:
            return
        at = time.time() if decided_at is None else decided_at
        db = self.db
        blobs = self._compress([record_json(r) for r in records])
        with self._transaction():
            if run_id is not None:  # a trial stored again (a resumed run) replaces its row
                for trial in {r.get("trial_id") for r in records} - {None}:
                    self._delete_rows("run_id = ? AND trial_id = ?", (run_id, trial))
            # Ids given here, so both tables are written with one statement each.
            first = (db.execute("SELECT MAX(id) FROM decided").fetchone()[0] or 0) + 1
            rows, verdict_rows = [], []
            for row_id, record, blob in zip(range(first, first + len(records)), records, blobs, strict=True):
                verdicts = record.get("verdicts") or ()
                failed = [v for v in verdicts if v.get("verdict") == "fail"]
                trace_id = record.get("trace_id") or ""
                rows.append((
                    row_id, source, run_id, record.get("trial_id"), at, trace_id, record.get("key") or trace_id,
                    record.get("agent"), record.get("service"), record.get("status") or "unchecked", len(failed),
                    _worst(failed) if failed else None, blob,
                ))  # fmt: skip
                verdict_rows += [(row_id, at, v.get("policy"), v.get("invariant") or "", v.get("verdict") or "",
                                  v.get("severity") or "", v.get("step_index")) for v in verdicts]  # fmt: skip
            self._insert("decided", 13, rows)
            self._insert("decided_verdicts", 7, verdict_rows)

    def _compress(self, blobs: list[bytes | bytearray | memoryview]) -> list[bytes]:
        # One call for the batch: the compressor lets go of the interpreter lock once, not once
        # per record (each time it is taken back the event loop's thread is made to wait).
        out = self._compressor.multi_compress_to_buffer(blobs)
        return [out[i].tobytes() for i in range(len(out))]

    def _insert(self, table: str, width: int, rows: list[tuple[Any, ...]]) -> None:
        """Rows in as few multi-row INSERTs as SQLite's variable limit allows: executemany runs a
        statement per row, and lets go of the interpreter lock and takes it back for each."""
        per = max(1, self.db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width)
        values = "(" + ",".join("?" * width) + ")"
        for start in range(0, len(rows), per):
            chunk = rows[start:start + per]
            self.db.execute(f"INSERT INTO {table} VALUES {','.join([values] * len(chunk))}",
                            list(chain.from_iterable(chunk)))  # fmt: skip

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def bytes_used(self) -> int:
        pages = self.db.execute("PRAGMA page_count").fetchone()[0]
        free = self.db.execute("PRAGMA freelist_count").fetchone()[0]
        size = self.db.execute("PRAGMA page_size").fetchone()[0]
        return int((pages - free) * size)

    def expire(self, max_age: float, max_bytes: int, now: float | None = None) -> int:
        """Delete records older than ``max_age`` seconds, then the oldest until the store's
        pages hold at most ``max_bytes``; returns how many were deleted."""
        cutoff = (time.time() if now is None else now) - max_age
        deleted = self._delete_where("decided_at < ?", (cutoff,))
        while self.bytes_used() > max_bytes:
            row = self.db.execute("SELECT COUNT(*), MIN(id) FROM decided").fetchone()
            if not row[0]:
                break
            # A tenth at a time (at least one): sizes are in pages, not records.
            step = max(1, row[0] // 10)
            (upto,) = self.db.execute("SELECT id FROM decided ORDER BY id LIMIT 1 OFFSET ?", (step - 1,)).fetchone()
            deleted += self._delete_where("id <= ?", (upto,))
        if deleted:
            self.db.execute("PRAGMA incremental_vacuum")
        return deleted

    def _delete_where(self, where: str, args: tuple[Any, ...]) -> int:
        with self._transaction():
            return self._delete_rows(where, args)

    def _delete_rows(self, where: str, args: tuple[Any, ...]) -> int:
        ids = f"SELECT id FROM decided WHERE {where}"
        self.db.execute(f"DELETE FROM decided_verdicts WHERE decided_id IN ({ids})", args)
        return int(self.db.execute(f"DELETE FROM decided WHERE {where}", args).rowcount)

    # ---- reading ---------------------------------------------------------------------------

    def find(
        self, filters: Filters, limit: int = PAGE, cursor: str | None = None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of trajectory summaries, newest first, and the cursor of the next page (None:
        the last page)."""
        if not 1 <= limit <= MAX_PAGE:
            raise QueryError(f"limit must be between 1 and {MAX_PAGE}")
        if filters.severity is not None and filters.severity not in SEVERITIES:
            raise QueryError(f"severity must be one of {', '.join(SEVERITIES)}")
        where: list[str] = ["1"]
        args: list[Any] = []
        for column in ("status", "agent", "service", "key", "trace_id", "source", "run_id"):
            value = getattr(filters, column)
            if value is not None:
                where.append(f"d.{column} = ?")
                args.append(value)
        if filters.since is not None:
            where.append("d.decided_at >= ?")
            args.append(filters.since)
        if filters.until is not None:
            where.append("d.decided_at < ?")
            args.append(filters.until)
        if cursor is not None:
            at, row_id = _parse_cursor(cursor)
            where.append("(d.decided_at < ? OR (d.decided_at = ? AND d.id < ?))")
            args += [at, at, row_id]
        if filters.policy is None and filters.invariant is None and filters.severity is None:
            rows = self.db.execute(
                f"SELECT {_COLUMNS} FROM decided d WHERE {' AND '.join(where)}"
                " ORDER BY d.decided_at DESC, d.id DESC LIMIT ?",
                (*args, limit + 1),
            ).fetchall()
        else:
            rows = self._by_verdicts(filters, where, args, limit + 1)
        items = [_summary(r) for r in rows[:limit]]
        more = len(rows) > limit
        return items, (_cursor(rows[limit - 1][4], rows[limit - 1][0]) if more else None)

    def _by_verdicts(self, f: Filters, where: list[str], args: list[Any], want: int) -> list[tuple[Any, ...]]:
        """Trajectories with a verdict matching the policy/invariant/severity filters, newest
        first: walked in the order of a verdict index (one walk per severity, merged), so the
        cost is that of the page, not of the whole store."""
        terms, values = [], []
        if f.policy is not None:
            terms.append("v.policy = ?")
            values.append(f.policy)
        if f.invariant is not None:
            terms.append("v.invariant = ?")
            values.append(f.invariant)
        if f.invariant is not None or f.severity is not None:
            terms.append("v.verdict = 'fail'")
        severities: list[str | None] = [None]
        if f.severity is not None:
            severities = list(SEVERITIES[: SEVERITIES.index(f.severity) + 1])
        walks = []
        for severity in severities:
            extra = ["v.severity = ?"] if severity is not None else []
            walks.append(self._walk(
                " AND ".join([*terms, *extra, *(_on_verdicts(w) for w in where)]),
                [*values, *([severity] if severity is not None else []), *args],
            ))  # fmt: skip
        out: list[tuple[Any, ...]] = []
        seen: set[int] = set()
        for row in heapq.merge(*walks, key=lambda r: (r[4], r[0]), reverse=True):
            if row[0] in seen:  # two matching verdicts of one trajectory
                continue
            seen.add(row[0])
            out.append(row)
            if len(out) == want:
                break
        return out

    def _walk(self, where: str, args: list[Any], chunk: int = 256) -> Iterator[tuple[Any, ...]]:
        """Rows of trajectories whose verdict rows match ``where``, newest first, fetched a chunk
        at a time along the verdict index."""
        after: tuple[float, int] | None = None
        while True:
            cond, extra = where, list(args)
            if after is not None:
                cond += " AND (v.decided_at < ? OR (v.decided_at = ? AND v.decided_id < ?))"
                extra += [after[0], after[0], after[1]]
            rows = self.db.execute(
                f"SELECT {_COLUMNS} FROM decided_verdicts v JOIN decided d ON d.id = v.decided_id WHERE {cond}"
                " ORDER BY v.decided_at DESC, v.decided_id DESC LIMIT ?",
                (*extra, chunk),
            ).fetchall()
            yield from rows
            if len(rows) < chunk:
                return
            after = (rows[-1][4], rows[-1][0])

    def get(self, ref: str) -> dict[str, Any] | None:
        """One trajectory by store id, trace id or task key (the newest when several match)."""
        row = None
        if ref.isdigit():
            row = self.db.execute("SELECT id, decided_at, source, run_id, record FROM decided WHERE id = ?",
                                  (int(ref),)).fetchone()  # fmt: skip
        for column in ("trace_id", "key"):
            if row is None:
                row = self.db.execute(
                    f"SELECT id, decided_at, source, run_id, record FROM decided WHERE {column} = ?"
                    " ORDER BY decided_at DESC, id DESC LIMIT 1", (ref,),
                ).fetchone()  # fmt: skip
        if row is None:
            return None
        record = _unpack(row[4])
        return {"id": row[0], "decided_at": row[1], "source": row[2], "run_id": row[3], **record}

    def trial(self, run_id: str, trial_id: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT id FROM decided WHERE run_id = ? AND trial_id = ? ORDER BY id DESC LIMIT 1",
                              (run_id, trial_id)).fetchone()  # fmt: skip
        return None if row is None else self.get(str(row[0]))

    def conformance(self, since: float, until: float, bucket: float, policy: str | None = None,
                    invariant: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
        """Per time bucket: of the trajectories checked (by ``policy``, or for ``invariant``),
        how many held, i.e. had no failing and no indeterminate verdict there."""
        if bucket <= 0 or until <= since:
            raise QueryError("bucket must be positive and until after since")
        if (until - since) / bucket > 10_000:
            raise QueryError("more than 10000 buckets: widen the bucket or narrow the range")
        terms = ["decided_at >= ?", "decided_at < ?"]
        args: list[Any] = [since, until]
        if policy is not None:
            terms.append("policy = ?")
            args.append(policy)
        if invariant is not None:
            terms.append("invariant = ?")
            args.append(invariant)
        rows = self.db.execute(
            "SELECT CAST((decided_at - ?) / ? AS INTEGER) AS b, decided_id,"
            " MAX(verdict IN ('fail', 'indeterminate')) FROM decided_verdicts"
            f" WHERE {' AND '.join(terms)} AND verdict != 'not_applicable' GROUP BY b, decided_id",
            (since, bucket, *args),
        ).fetchall()
        buckets: dict[int, list[int]] = {}
        for b, _, broken in rows:
            counts = buckets.setdefault(int(b), [0, 0])
            counts[0] += 0 if broken else 1
            counts[1] += 1
        return [{"start": since + b * bucket, "successes": s, "n": n} for b, (s, n) in sorted(buckets.items())]

    def names(self) -> dict[str, list[str]]:
        """The policies, invariants, agents and services present (for the console's filters)."""
        def column(sql: str) -> list[str]:
            return [r[0] for r in self.db.execute(sql).fetchall() if r[0] is not None]

        return {
            "policies": column("SELECT DISTINCT policy FROM decided_verdicts ORDER BY 1 LIMIT 500"),
            "invariants": column("SELECT DISTINCT invariant FROM decided_verdicts ORDER BY 1 LIMIT 500"),
            "agents": column("SELECT DISTINCT agent FROM decided ORDER BY 1 LIMIT 500"),
            "services": column("SELECT DISTINCT service FROM decided ORDER BY 1 LIMIT 500"),
        }

    def top_violations(self, since: float, limit: int = 10) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT policy, invariant, severity, COUNT(*) FROM decided_verdicts WHERE verdict = 'fail'"
            " AND decided_at >= ? GROUP BY policy, invariant, severity ORDER BY 4 DESC LIMIT ?", (since, limit),
        ).fetchall()  # fmt: skip
        return [{"policy": p, "invariant": i, "severity": s, "count": n} for p, i, s, n in rows]

    def status_counts(self, since: float) -> dict[str, int]:
        rows = self.db.execute("SELECT status, COUNT(*) FROM decided WHERE decided_at >= ? GROUP BY status",
                               (since,)).fetchall()  # fmt: skip
        return {s: n for s, n in rows}


# What a list item holds: these columns of ``decided``, in this order.
_SUMMARY = ("id", "source", "run_id", "trial_id", "decided_at", "trace_id", "key", "agent", "service", "status",
            "failed", "worst")  # fmt: skip
_COLUMNS = ", ".join(f"d.{c}" for c in _SUMMARY)


def _summary(row: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(_SUMMARY, row, strict=True))


def _on_verdicts(term: str) -> str:
    """A time or cursor term on the verdict row (same value), so the verdict index serves it."""
    return term.replace("d.decided_at", "v.decided_at").replace("d.id <", "v.decided_id <")
