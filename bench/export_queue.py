"""Export queue benchmark: what the on-disk queue costs per byte of span data, at SQLite's default
WAL checkpoint size and at the queue's (``export.queue.WAL_CHECKPOINT_PAGES``), alternately in
one run.

    python bench/export_queue.py                 # 3 rounds of 120 MB each way
    python bench/export_queue.py --rounds 5 --requests 800

Each request goes through what the live processor does with it in annotate mode: journaled when
received, queued as an export batch of the same size in one transaction that releases its
journal entry, and deleted once a few later batches are queued (the backend acknowledged it).
Printed: CPU and wall microseconds per KB of request, the median over the rounds, and the ratio
of the queue's setting to SQLite's default.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from otel_plumb.export import queue

SQLITE_DEFAULT_PAGES = 1000
REQUEST_BYTES = 300_000  # a 512-span request of agent spans with 1 KB of content per model call
IN_FLIGHT = 8  # batches queued before the oldest are acknowledged


def run(pages: int, requests: int) -> tuple[float, float]:
    """CPU and wall microseconds per KB of request through the queue at ``pages``."""
    queue.WAL_CHECKPOINT_PAGES = pages
    with tempfile.TemporaryDirectory() as tmp:
        q = queue.DiskQueue(Path(tmp) / "queue.db")
        q._open()
        body = os.urandom(REQUEST_BYTES)
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
    kb = requests * REQUEST_BYTES / 1000
    return cpu / kb * 1e6, wall / kb * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="runs each way, alternately")
    parser.add_argument("--requests", type=int, default=400, help="requests per run")
    args = parser.parse_args()
    ours = queue.WAL_CHECKPOINT_PAGES
    results: dict[int, list[tuple[float, float]]] = {SQLITE_DEFAULT_PAGES: [], ours: []}
    for _ in range(args.rounds):
        for pages in results:
            results[pages].append(run(pages, args.requests))
    print(f"{args.requests} requests of {REQUEST_BYTES:,} B per run, median of {args.rounds}")
    print(f"{'WAL checkpoint (pages)':>24} {'CPU us/KB':>10} {'wall us/KB':>11}")
    medians = {}
    for pages, runs in results.items():
        cpu, wall = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        medians[pages] = (cpu, wall)
        print(f"{pages:>24,} {cpu:>10.2f} {wall:>11.2f}")
    (cpu0, wall0), (cpu1, wall1) = medians[SQLITE_DEFAULT_PAGES], medians[ours]
    print(f"queue's setting / SQLite's default: CPU {cpu1 / cpu0:.2f}x, wall {wall1 / wall0:.2f}x")


if __name__ == "__main__":
    main()
