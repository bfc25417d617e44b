"""Instructions per span on the live path, counted by valgrind's callgrind: a figure the load of
a shared machine does not move (seconds on it vary by a third from hour to hour), for comparing
two versions of the code, and agent spans with spans that are no agent's.

    python bench/instructions.py                # agent traces (20% HTTP/DB spans) and service traces
    python bench/instructions.py --spans 20000  # fewer spans: faster, a little less exact
    python bench/instructions.py --verdict-log  # with the verdict log on, as in the production config

Each point runs in a child process under ``valgrind --tool=callgrind`` (Debian's ``valgrind``;
about fifty times slower than native, a minute or two a point): the processor is started in the
process with the realistic policy of ``bench/live.py``, exporting annotated spans to a sink in the
same process, and each request of ``bench/live.py --realistic``'s delivery (after a warm-up wave)
goes to ``Processor.ingest`` as a receiver hands it on, so everything but the gRPC transport is
counted: decoding, normalising, assembling, early checks, decisions, annotation, journal and
queue writes, export. The requests are built and the sink counts spans outside the count, and
each point is run again without the measured spans: the difference, over the spans, leaves out
what does not grow with them (start, warm-up, drain, stop). Prints the instructions per span of
each point, and their ratio (the target is agent spans at least 3x the cost of spans that are no
agent's).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import operator
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import live  # noqa: E402  (bench/live.py: the requests, the policy and the sink)

# Everything from the processor's start to its stop runs inside operator.call, which callgrind
# counts (--toggle-collect); the sink's counting runs inside itertools.starmap, which toggles the
# count off again while it runs (a second operator.call would not: callgrind does not toggle on a
# function's recursive entry).
COUNTED = "_operator_call"
NOT_COUNTED = "starmap_next"


class CountingSink(live.Sink):
    async def export(self, raw: bytes, _context: object) -> bytes:
        self.spans += sum(itertools.starmap(spans_in, ((raw,),)))
        return b""


def spans_in(raw: bytes) -> int:
    return sum(len(ss.spans) for rs in live.ExportTraceServiceRequest.FromString(raw).resource_spans
               for ss in rs.scope_spans)  # fmt: skip


def measure(non_agent: int, spans: int, verdict_log: bool = False) -> int:
    """The live path on ``spans`` spans (and a warm-up wave); returns the spans counted through."""
    per_trace, in_flight = 21, 1000
    requests = live.realistic_requests(spans // per_trace, per_trace, in_flight, 1024, non_agent=non_agent)
    warm_up = live.realistic_requests(in_flight, per_trace, in_flight, 1024, seed=1, non_agent=non_agent)
    total = live.count_spans(requests) + live.count_spans(warm_up)
    tmp = Path(tempfile.mkdtemp(prefix="otel-plumb-instructions-"))
    try:
        (tmp / "policy.yaml").write_text(live.POLICY)
        return int(operator.call(asyncio.run, run(tmp, [warm_up, requests], total, verdict_log)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def run(tmp: Path, waves: list[list[tuple[bytes, list[bytes]]]], total: int, verdict_log: bool) -> int:
    from otel_plumb.check import load_policies
    from otel_plumb.processor.config import load_config
    from otel_plumb.processor.core import Processor
    from otel_plumb.receive.otlp import ReceivedRequest

    sink = CountingSink()
    port = await sink.start()
    config = load_config(None, {
        "assembly.idle_timeout": live.IDLE_TIMEOUT, "assembly.confirm_wait": 0, "assembly.tick": "50ms",
        "assembly.max_traces": 200_000, "receivers.grpc.endpoint": "127.0.0.1:0",
        "receivers.http.endpoint": "127.0.0.1:0", "metrics.endpoint": "127.0.0.1:0",
        "receivers.max_buffered_spans": 10_000_000,
        "exporters.otlp": {"endpoint": f"grpc://127.0.0.1:{port}", "state_dir": str(tmp / "state"),
                           "queue": {"max_spans": 10_000_000}},
        **({"verdict_log.path": str(tmp / "verdicts.jsonl")} if verdict_log else {}),
    })  # fmt: skip
    processor = Processor(config, load_policies([str(tmp / "policy.yaml")]))
    await processor.start()
    try:
        for wave in waves:
            pending = [body for body, _ in wave]
            await asyncio.gather(*(feed(processor, pending, ReceivedRequest.parse) for _ in range(8)))
        await sink.wait_for(total, 600)
    finally:
        await processor.stop()
        if sink.server is not None:
            await sink.server.stop(None)
    return sink.spans


async def feed(processor: Any, pending: list[bytes], parse: Any) -> None:
    """One of the requests in flight: takes the next request body until none is left."""
    while pending:
        await processor.ingest(parse(pending.pop(0)), "grpc")


def counted(non_agent: int, spans: int, verdict_log: bool) -> tuple[int, int]:
    """(instructions, spans) of one point, in a child process under callgrind."""
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/callgrind.out", "--collect-atstart=no",
             f"--toggle-collect={COUNTED}", f"--toggle-collect={NOT_COUNTED}", os.path.realpath(sys.executable),
             __file__, "--role", "point", "--non-agent", str(non_agent), "--spans", str(spans),
             *(["--verdict-log"] if verdict_log else [])],
            capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"}, check=True,
        )  # fmt: skip
    refs = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    through = re.search(r"spans through: (\d+)", out.stdout)
    if refs is None or through is None:
        sys.exit(f"no count from the child:\n{out.stdout}\n{out.stderr[-2000:]}")
    return int(refs.group(1).replace(",", "")), int(through.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=40_000, help="spans measured per point (after the warm-up)")
    parser.add_argument("--verdict-log", action="store_true", help="the processor writes a verdict log too")
    parser.add_argument("--non-agent", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--role", choices=["bench", "point"], default="bench", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "point":
        print(f"spans through: {measure(args.non_agent, args.spans, args.verdict_log)}")
        return
    import otel_plumb

    print(f"core {otel_plumb.core()}; realistic delivery, 1 KB per model call, annotate export to a sink in process"
          + ("; verdict log on" if args.verdict_log else ""))  # fmt: skip
    per_span = {}
    for label, non_agent in (("agent traces (20% HTTP/DB spans)", 20), ("service traces (no agent span)", 100)):
        # Start, warm-up wave, drain and stop cost the same in both runs: the difference is the spans'.
        with_spans, through = counted(non_agent, args.spans, args.verdict_log)
        without, warm_up = counted(non_agent, 0, args.verdict_log)
        spans = through - warm_up
        per_span[non_agent] = (with_spans - without) / spans
        print(f"{label:>36}: {per_span[non_agent]:>9,.0f} instructions per span ({spans:,} spans)", flush=True)
    print(f"agent / service: {per_span[20] / per_span[100]:.2f}x (target: >= 3x)")


if __name__ == "__main__":
    main()
