"""The receive journal's cost per request: CPU microseconds (all threads) per journaled request,
one request at a time and with many in flight (group commit: the requests that arrive while a
write is on the storage thread go in the next one, in one transaction).

    python bench/journal.py                    # 600 KB requests (512 spans of 1 KB content)
    python bench/journal.py --bytes 4096 --requests 4000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from otel_plumb.export.queue import DiskQueue


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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes", type=int, default=600_000, help="bytes per request")
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    asyncio.run(main(args.bytes, args.requests))
