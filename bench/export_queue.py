"""Export queue benchmark: what the journal and the export queue cost per byte of span data,
with the bodies in segment files (``export.queue.DiskQueue``, as the processor runs) and with the
bodies in SQLite rows, as earlier versions kept them (16 KiB pages, a 16 MiB WAL checkpoint,
secure_delete FAST), alternately in one run. Request sizes: 17 MB (a 512-span batch with 100 KB
of content per model call), 300 KB (the same with 1 KB) and 2 KB (a batch flushed on its timer
at low load).

    python bench/export_queue.py                 # 3 rounds each way
    python bench/export_queue.py --rounds 5 --megabytes 400

Each request goes through what the live processor does with it in annotate mode: journaled when
received, queued as an export batch of the same size in one transaction that releases its
journal entry, and deleted once a few later batches are queued (the backend acknowledged it).
Each run starts on a new file and first sends a quarter of its requests unmeasured, so that
both layouts are measured on files that reached their working size. Printed: CPU and wall
microseconds per KB of request, the median over the rounds, and the ratio of segments to rows.
"""

from __future__ import annotations

import argparse
import os
import resource
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Protocol

from otel_plumb.export.queue import DiskQueue

REQUEST_SIZES = (17_000_000, 300_000, 2_000)
IN_FLIGHT = 8  # batches queued before the oldest are acknowledged
MIN_REQUESTS = 40  # per run, whatever --megabytes says: a file reaches its working size


class Queue(Protocol):
    def _journal(self, body: bytes) -> int: ...
    def _put(
        self, batches: list[tuple[bytes, int]], done: list[tuple[int, bytes]], released: list[int]
    ) -> list[int]: ...
    def _delete(self, batch_ids: list[int]) -> None: ...
    def _close(self) -> None: ...


class RowQueue:
    """The same three operations with the bodies in rows, as earlier versions stored them."""

    def __init__(self, path: Path) -> None:
        self.db = db = sqlite3.connect(path, isolation_level=None)
        for pragma in ("page_size=16384", "journal_mode=WAL", "synchronous=NORMAL", "secure_delete=FAST",
                       "wal_autocheckpoint=1024"):  # fmt: skip
            db.execute(f"PRAGMA {pragma}")
        db.execute("CREATE TABLE batches (id INTEGER PRIMARY KEY AUTOINCREMENT, spans INTEGER, body BLOB)")
        db.execute("CREATE TABLE journal (id INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB)")
        db.execute("CREATE TABLE journal_done (jid INTEGER, trace_id BLOB, PRIMARY KEY (jid, trace_id)) WITHOUT ROWID")

    def _journal(self, body: bytes) -> int:
        return int(self.db.execute("INSERT INTO journal (body) VALUES (?)", (body,)).lastrowid or 0)

    def _put(self, batches: list[tuple[bytes, int]], done: list[tuple[int, bytes]], released: list[int]) -> list[int]:
        db = self.db
        db.execute("BEGIN")
        ids = [
            int(db.execute("INSERT INTO batches (spans, body) VALUES (?, ?)", (n, b)).lastrowid or 0)
            for b, n in batches
        ]
        db.executemany("INSERT OR IGNORE INTO journal_done (jid, trace_id) VALUES (?, ?)", done)
        db.executemany("DELETE FROM journal WHERE id = ?", [(j,) for j in released])
        db.executemany("DELETE FROM journal_done WHERE jid = ?", [(j,) for j in released])
        db.execute("COMMIT")
        return ids

    def _delete(self, batch_ids: list[int]) -> None:
        self.db.executemany("DELETE FROM batches WHERE id = ?", [(i,) for i in batch_ids])

    def _close(self) -> None:
        self.db.close()


def segments(path: Path) -> Queue:
    q = DiskQueue(path)
    q._open()
    return q


LAYOUTS = {"bodies in segments": segments, "bodies in rows (earlier)": RowQueue}


def send(q: Queue, body: bytes, requests: int) -> None:
    waiting: list[int] = []
    for _ in range(requests):
        journal_id = q._journal(body)
        waiting += q._put([(body, 512)], [(journal_id, b"t" * 16)], [journal_id])
        if len(waiting) >= IN_FLIGHT:
            q._delete(waiting[: IN_FLIGHT // 2])
            waiting = waiting[IN_FLIGHT // 2 :]


def run(layout: str, request_bytes: int, requests: int) -> tuple[float, float]:
    """CPU and wall microseconds per KB of request through a new file of ``layout``."""
    with tempfile.TemporaryDirectory() as tmp:
        q = LAYOUTS[layout](Path(tmp) / "queue.db")
        body = os.urandom(request_bytes)
        send(q, body, max(1, requests // 4))
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        send(q, body, requests)
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
        q._close()
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    kb = requests * request_bytes / 1000
    return cpu / kb * 1e6, wall / kb * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="runs each way, alternately")
    parser.add_argument("--megabytes", type=int, default=200, help="MB of requests per run, each size")
    args = parser.parse_args()
    print(f"{args.megabytes} MB of requests per run, median of {args.rounds}")
    print(f"{'request':>11} {'layout':>26} {'CPU us/KB':>10} {'wall us/KB':>11}")
    for request_bytes in REQUEST_SIZES:
        requests = max(MIN_REQUESTS, args.megabytes * 1_000_000 // request_bytes)
        results: dict[str, list[tuple[float, float]]] = {layout: [] for layout in LAYOUTS}
        for _ in range(args.rounds):
            for layout in results:
                results[layout].append(run(layout, request_bytes, requests))
        medians = {}
        for layout, runs in results.items():
            medians[layout] = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            print(f"{request_bytes:>11,} {layout:>26} {medians[layout][0]:>10.2f} {medians[layout][1]:>11.2f}")
        (cpu1, wall1), (cpu0, wall0) = medians.values()
        print(f"{'':>11} {'segments / rows':>26} {cpu1 / cpu0:>9.2f}x {wall1 / wall0:>10.2f}x")


if __name__ == "__main__":
    main()
