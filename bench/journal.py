"""The receive journal's cost per request: CPU microseconds (all threads) per journaled request,
one request at a time and with many in flight (group commit: the requests that arrive while a
write is on the storage thread go in the next one, in one transaction).

Then what remembering the traces already forwarded costs (so that a replay after a crash skips
them), per span, when traces finish in another order than they came: requests of 512 spans, two
from each of 256 traces in flight (as the SDK's batches carry them), the traces decided 300 at a
time in random order; each submit marks, per request still held, the traces it forwarded
(``export.annotate.JournalProgress``). Against the earlier layout in the same run: a row per
(request, trace), inserted and deleted one by one.

    python bench/journal.py                    # 600 KB requests (512 spans of 1 KB content)
    python bench/journal.py --bytes 4096 --requests 4000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import tempfile
import time
from pathlib import Path

from otel_plumb.export.annotate import Forwarded, JournalProgress, Origin
from otel_plumb.export.queue import DiskQueue
from otel_plumb.model import SpanRecord

TRACES_IN_FLIGHT = 256  # two spans of each per 512-span request
DECIDED_PER_SUBMIT = 300


def forwarded_traces(requests: int) -> list[list[Forwarded]]:
    """The spans of each trace, as ``requests`` journaled requests (ids 1..) brought them: each
    request two spans of each of the traces in flight, a trace in flight for 5 to 15 requests."""
    rng = random.Random(7)
    origin = Origin((b"", ""), (b"", ""))
    traces: list[list[Forwarded]] = []
    running: list[tuple[str, list[Forwarded], int]] = []  # trace id, its spans, its last request
    for journal_id in range(1, requests + 1):
        while len(running) < TRACES_IN_FLIGHT:
            traces.append([])
            running.append((f"{len(traces):032x}", traces[-1], journal_id + rng.randint(5, 15)))
        for trace_id, spans, _ in running:
            spans += [Forwarded(b"", origin, SpanRecord(trace_id, f"{len(spans) + n:016x}", None, "s"), journal_id)
                      for n in range(2)]  # fmt: skip
        running = [trace for trace in running if trace[2] > journal_id]
    rng.shuffle(traces)
    return traces


def earlier_layout(db: sqlite3.Connection, done: list[tuple[int, bytes]], released: list[int]) -> None:
    """The earlier layout: a row per (journal id, trace id)."""
    rows = [(jid, ids[i : i + 16]) for jid, ids in done for i in range(0, len(ids), 16)]
    db.execute("BEGIN")
    db.executemany("INSERT OR IGNORE INTO journal_done (jid, trace_id) VALUES (?, ?)", rows)
    db.executemany("DELETE FROM journal_done WHERE jid = ?", [(jid,) for jid in released])
    db.execute("COMMIT")


def marking_done(tmp: Path, requests: int) -> None:
    traces = forwarded_traces(requests)
    spans = sum(len(t) for t in traces)
    q = DiskQueue(tmp / "done.db")
    q._open()
    old = sqlite3.connect(tmp / "earlier.db", isolation_level=None)
    old.execute("PRAGMA journal_mode=WAL")
    old.execute("PRAGMA synchronous=NORMAL")
    old.execute("CREATE TABLE journal_done (jid INTEGER, trace_id BLOB, PRIMARY KEY (jid, trace_id)) WITHOUT ROWID")
    for label, write in (
        ("a row per request", lambda done, released: q._put([], done, released)),
        ("earlier: per trace", lambda done, released: earlier_layout(old, done, released)),
    ):
        pending: dict[int, int] = {}
        for trace in traces:
            for span in trace:
                pending[span.journal_id] = pending.get(span.journal_id, 0) + 1
        cpu, rows = time.process_time(), 0
        for start in range(0, len(traces), DECIDED_PER_SUBMIT):
            payloads = [span for trace in traces[start : start + DECIDED_PER_SUBMIT] for span in trace]
            progress = JournalProgress(payloads, pending, whole_traces=True)
            rows += sum(len(ids) // 16 for _, ids in progress.done)
            write(progress.done, progress.released)
            for journal_id, n in progress.taken.items():
                pending[journal_id] -= n
        cpu = time.process_time() - cpu
        print(f"{label:>20}: {cpu / spans * 1e6:8.2f} CPU us per span  ({rows / spans:.2f} (request, trace) "
              f"marks per span, {spans:,} spans)")  # fmt: skip
    q._close()
    old.close()


async def main(size: int, requests: int) -> None:
    with tempfile.TemporaryDirectory(prefix="otel-plumb-journal-") as tmp:
        q = DiskQueue(Path(tmp) / "queue.db")
        await q.open()
        body = os.urandom(size)
        await q.release([await q.journal(body) for _ in range(50)])  # the segment files exist
        for label, in_flight in (("one at a time", 1), (f"{requests} in flight", requests)):
            cpu, wall = time.process_time(), time.perf_counter()
            ids: list[int] = []
            for start in range(0, requests, in_flight):
                ids += await asyncio.gather(*(q.journal(body) for _ in range(start, min(requests, start + in_flight))))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            print(f"{label:>20}: {cpu / requests * 1e6:8.0f} CPU us per request  {wall / requests * 1e6:8.0f} us wall")
            await q.release(ids)
        await q.close()
        print("traces forwarded from requests still held, marked for a replay to skip:")
        marking_done(Path(tmp), max(requests, 400))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes", type=int, default=600_000, help="bytes per request")
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    asyncio.run(main(args.bytes, args.requests))
