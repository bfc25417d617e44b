"""Memory per buffered span: ``python bench/memory.py [--traces N] [--spans-per-trace K]``.

The live processor (embedded, annotate mode, its journal and queue on disk) takes the requests of
the realistic delivery of ``bench/live.py`` (512-span requests across the traces in flight, 20%
HTTP and database spans, 1 KB of content per model call) but for the requests carrying the
roots, so no trace completes and every span stays buffered. Printed per span: its size on the
wire, the growth of the process's RSS over the RSS before the first request, and that growth
beyond the span's own bytes (which a buffered span keeps, to forward it), with the native
decoder and with the pure-Python one (``OTEL_PLUMB_PURE_PYTHON=1``), each in its own child
process. Target: at most 1 KiB per buffered span beyond its own bytes (native).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import live  # the realistic delivery and the policy of the live benchmark

PURE_PYTHON_ENV = "OTEL_PLUMB_PURE_PYTHON"  # as otel_plumb.receive.otlp reads it
TARGET_BEYOND_BYTES = 1024


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def measure(traces: int, per_trace: int) -> dict[str, float]:
    from otel_plumb.check import load_policies
    from otel_plumb.processor import Processor, load_config
    from otel_plumb.receive.otlp import ReceivedRequest

    requests = live.realistic_requests(traces, per_trace, in_flight=traces, payload=1024)
    bodies = [body for body, roots in requests if not roots]
    del requests
    tmp = Path(tempfile.mkdtemp(prefix="otel-plumb-memory-"))
    (tmp / "policy.yaml").write_text(live.POLICY)
    config = load_config(None, {
        "receivers": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"enabled": False}, "max_buffered_spans": 10**8},
        "metrics": {"endpoint": ""},
        "assembly": {"idle_timeout": 3600, "max_wait": 7200, "tick": 1, "max_traces": 10 * traces,
                     "max_buffered_bytes": 64 * 2**30},
        # Nothing completes, so nothing is sent: the exporter only journals the requests.
        "exporters": {"otlp": {"endpoint": "grpc://127.0.0.1:9", "state_dir": str(tmp / "state")}},
        "logging": {"level": "error"},
    })  # fmt: skip
    processor = Processor(config, load_policies([tmp / "policy.yaml"]))
    await processor.start()
    spans = wire = 0
    try:
        gc.collect()
        before = rss_bytes()
        cpu = time.process_time()
        for body in bodies:
            request = ReceivedRequest.parse(body)
            await processor.ingest(request, "grpc")
            spans += len(request.spans[0])
            wire += len(body)
        cpu = time.process_time() - cpu
        del request
        gc.collect()
        grown = rss_bytes() - before
        in_flight = processor.intake.traces_in_flight
    finally:
        await processor.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"spans": spans, "traces": in_flight, "wire": wire / spans, "rss": grown / spans,
            "cpu_us": cpu / spans * 1e6}  # fmt: skip


def run_child(pure: bool, args: argparse.Namespace) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != PURE_PYTHON_ENV}
    if pure:
        env[PURE_PYTHON_ENV] = "1"
    cmd = [sys.executable, __file__, "--role", "measure", "--traces", str(args.traces),
           "--spans-per-trace", str(args.spans_per_trace)]  # fmt: skip
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main(args: argparse.Namespace) -> None:
    print(f"{args.traces:,} traces of {args.spans_per_trace} spans in flight, the roots not yet sent (nothing decided)")
    print(f"{'decoder':>12} {'spans buffered':>15} {'wire B/span':>12} {'RSS B/span':>11} {'beyond bytes':>13} "
          f"{'ingest CPU us/span':>19}")  # fmt: skip
    results = {}
    for name, pure in (("native", False), ("pure Python", True)):
        r = results[name] = run_child(pure, args)
        print(f"{name:>12} {r['spans']:>15,.0f} {r['wire']:>12,.0f} {r['rss']:>11,.0f} {r['rss'] - r['wire']:>13,.0f} "
              f"{r['cpu_us']:>19.1f}", flush=True)  # fmt: skip
    native = results["native"]
    beyond = native["rss"] - native["wire"]
    met = "ok" if beyond <= TARGET_BEYOND_BYTES else "MISSED"
    print(f"  [{met}] native: {beyond:,.0f} B per buffered span beyond its own bytes "
          f"(target <= {TARGET_BEYOND_BYTES:,})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=int, default=20_000, help="traces in flight")
    parser.add_argument("--spans-per-trace", type=int, default=21, help="spans per trace, the root included")
    parser.add_argument("--role", choices=["main", "measure"], default="main", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.role == "measure":
        print(json.dumps(asyncio.run(measure(ns.traces, ns.spans_per_trace))))
    else:
        main(ns)
