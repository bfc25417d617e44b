"""Export queue benchmark: what the on-disk queue costs per byte of span data, with SQLite's
defaults (4 KiB pages, a 1,000-page WAL checkpoint, secure_delete as this build of SQLite has it:
on in Debian's) and with the queue's settings (``export.queue.PAGE_SIZE``,
``WAL_CHECKPOINT_BYTES``, ``SECURE_DELETE``), alternately in one run, for full
requests (300 KB: a 512-span batch of agent spans with 1 KB of content per model call, what
SDKs send at load) and small ones (2 KB: a batch flushed on its timer at low load, or one span
per request).

    python bench/export_queue.py                 # 3 rounds each way
    python bench/export_queue.py --rounds 5 --megabytes 200

Each request goes through what the live processor does with it in annotate mode: journaled when
received, queued as an export batch of the same size in one transaction that releases its
journal entry, and deleted once a few later batches are queued (the backend acknowledged it).
Printed: CPU and wall microseconds per KB of request, the median over the rounds, and the ratio
of the queue's settings to SQLite's defaults.
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

from otel_plumb.export import queue

BUILD_SECURE_DELETE = ("OFF", "ON", "FAST")[sqlite3.connect(":memory:").execute("PRAGMA secure_delete").fetchone()[0]]
# Page size, WAL checkpoint in bytes, secure_delete (this build's default: on in Debian's).
SQLITE_DEFAULTS = (4096, 1000 * 4096, BUILD_SECURE_DELETE)
OURS = (queue.PAGE_SIZE, queue.WAL_CHECKPOINT_BYTES, queue.SECURE_DELETE)
REQUEST_SIZES = (300_000, 2_000)
IN_FLIGHT = 8  # batches queued before the oldest are acknowledged


def run(settings: tuple[int, int, str], request_bytes: int, requests: int) -> tuple[float, float]:
    """CPU and wall microseconds per KB of request through a new queue file with ``settings``."""
    queue.PAGE_SIZE, queue.WAL_CHECKPOINT_BYTES, queue.SECURE_DELETE = settings
    with tempfile.TemporaryDirectory() as tmp:
        q = queue.DiskQueue(Path(tmp) / "queue.db")
        q._open()
        body = os.urandom(request_bytes)
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        waiting: list[int] = []
        for _ in range(requests):
            journal_id = q._journal(body)
            waiting += q._put([(body, 512)], [(journal_id, b"t" * 16)], [journal_id])
            if len(waiting) >= IN_FLIGHT:
                q._delete(waiting[: IN_FLIGHT // 2])
                waiting = waiting[IN_FLIGHT // 2 :]
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
        assert q._db is not None
        q._db.close()
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    kb = requests * request_bytes / 1000
    return cpu / kb * 1e6, wall / kb * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="runs each way, alternately")
    parser.add_argument("--megabytes", type=int, default=100, help="MB of requests per run, each size")
    args = parser.parse_args()
    print(f"{args.megabytes} MB of requests per run, median of {args.rounds}")
    print(f"{'request':>9} {'settings':>52} {'CPU us/KB':>10} {'wall us/KB':>11}")
    for request_bytes in REQUEST_SIZES:
        requests = args.megabytes * 1_000_000 // request_bytes
        results: dict[tuple[int, int, str], list[tuple[float, float]]] = {SQLITE_DEFAULTS: [], OURS: []}
        for _ in range(args.rounds):
            for settings in results:
                results[settings].append(run(settings, request_bytes, requests))
        medians = {}
        for (page, checkpoint, secure_delete), runs in results.items():
            cpu, wall = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            medians[page, checkpoint, secure_delete] = (cpu, wall)
            label = f"{page // 1024} KiB pages, {checkpoint / 2**20:.0f} MiB WAL, secure_delete {secure_delete}"
            print(f"{request_bytes:>9,} {label:>52} {cpu:>10.2f} {wall:>11.2f}")
        (cpu0, wall0), (cpu1, wall1) = medians[SQLITE_DEFAULTS], medians[OURS]
        print(f"{'':>9} {'queue / SQLite defaults':>52} {cpu1 / cpu0:>9.2f}x {wall1 / wall0:>10.2f}x")


if __name__ == "__main__":
    main()
