"""Replay throughput and memory: ``python bench/replay.py [--spans N] [--runs 3]``.

Writes a Collector-style trace file (length-prefixed OTLP protobuf records) of agent traces
(invoke_agent > chat / execute_tool spans with ~200-byte JSON arguments, 10-20 spans a trace),
then measures, each in its own child process and the median of ``--runs`` runs:

- plain parse: ``ExportTraceServiceRequest.FromString`` over every record (the floor);
- read: the file to SpanRecords (decode only);
- replay: read + normalise + assemble, the pipeline ``otel-plumb replay`` runs;

read and replay both native (the compiled decoder, and the core compiled by mypyc when the
install built it) and pure Python (``OTEL_PLUMB_PURE_PYTHON=1``: the same modules interpreted),
side by side, with their ratio to plain parse in the same run,
and the replay's peak RSS against the file size.
Targets: replay (native) >= 150k spans/s; replay (pure Python) >= 100k spans/s and >= 10% of
plain parse; peak RSS < 2x file size + 200 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span

PURE_PYTHON_ENV = "OTEL_PLUMB_PURE_PYTHON"  # as otel_plumb.pure_python reads it
BATCH_SPANS = 512
TOOLS = ("fetch_invoice", "match_purchase_order", "check_duplicate", "schedule_payment", "post_audit_log")


def _kv(key: str, value: str | int) -> KeyValue:
    value_ = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
    return KeyValue(key=key, value=value_)


def _arguments(rng: random.Random, i: int) -> str:
    """About 200 bytes of JSON, as agents' tool arguments look."""
    return json.dumps(
        {
            "invoice_id": f"INV-{i:07d}",
            "vendor": {"id": f"V-{rng.randrange(10_000):05d}", "name": "Acme Industrial Supplies Ltd"},
            "amount_gbp": round(rng.uniform(10, 50_000), 2),
            "currency": "GBP",
            "due_date": "2026-12-31",
            "lines": [{"sku": f"SKU-{rng.randrange(999)}", "qty": rng.randrange(1, 9)} for _ in range(2)],
        }
    )


def trace_spans(rng: random.Random, n: int) -> list[Span]:
    """One agent trace, children before the root (the order in which spans end and are exported)."""
    trace_id = rng.randbytes(16)
    root_id = rng.randbytes(8)
    start = 1_700_000_000_000_000_000 + n * 1_000_000_000
    size = rng.randrange(10, 21)
    spans: list[Span] = []
    t = start
    for k in range(size - 1):
        span_id = rng.randbytes(8)
        if k % 2 == 0:
            attrs = [
                _kv("gen_ai.operation.name", "chat"),
                _kv("gen_ai.provider.name", "openai"),
                _kv("gen_ai.request.model", "gpt-4o-mini"),
                _kv("gen_ai.usage.input_tokens", rng.randrange(100, 4000)),
                _kv("gen_ai.usage.output_tokens", rng.randrange(10, 400)),
            ]
            name = "chat gpt-4o-mini"
        else:
            tool = TOOLS[(k // 2) % len(TOOLS)]
            attrs = [
                _kv("gen_ai.operation.name", "execute_tool"),
                _kv("gen_ai.tool.name", tool),
                _kv("gen_ai.tool.call.id", f"call_{rng.getrandbits(64):016x}"),
                _kv("gen_ai.tool.type", "function"),
                _kv("gen_ai.tool.call.arguments", _arguments(rng, n)),
                _kv("gen_ai.tool.call.result", '{"status": "ok"}'),
            ]
            name = f"execute_tool {tool}"
        spans.append(
            Span(
                trace_id=trace_id,
                span_id=span_id,
                parent_span_id=root_id,
                name=name,
                kind=Span.SPAN_KIND_INTERNAL if k % 2 else Span.SPAN_KIND_CLIENT,
                start_time_unix_nano=t,
                end_time_unix_nano=t + 5_000_000,
                attributes=attrs,
            )
        )
        t += 6_000_000
    spans.append(
        Span(
            trace_id=trace_id,
            span_id=root_id,
            name="invoke_agent ap",
            kind=Span.SPAN_KIND_SERVER,
            start_time_unix_nano=start,
            end_time_unix_nano=t,
            attributes=[
                _kv("gen_ai.operation.name", "invoke_agent"),
                _kv("gen_ai.agent.name", "ap"),
                _kv("plumb.case.id", f"INV-{n:07d}"),
            ],
        )
    )
    return spans


def write_file(path: Path, total_spans: int, seed: int = 7) -> int:
    rng = random.Random(seed)
    resource_attrs = [_kv("service.name", "ap-agent"), _kv("telemetry.sdk.language", "python")]
    written = 0
    n = 0
    pending: list[Span] = []
    with path.open("wb") as f:

        def flush() -> None:
            rs = ResourceSpans()
            rs.resource.attributes.extend(resource_attrs)
            ss = rs.scope_spans.add()
            ss.scope.name = "opentelemetry.instrumentation.openai_v2"
            ss.spans.extend(pending)
            data = ExportTraceServiceRequest(resource_spans=[rs]).SerializeToString()
            f.write(struct.pack(">I", len(data)) + data)
            pending.clear()

        while written < total_spans:
            spans = trace_spans(rng, n)
            n += 1
            pending.extend(spans)
            written += len(spans)
            if len(pending) >= BATCH_SPANS:
                flush()
        if pending:
            flush()
    return written


def write_json_lines(records_path: Path, path: Path) -> None:
    """The same batches as the Collector file exporter's default ``format: json`` writes them."""
    from otel_plumb.receive.otlp_json import request_to_json

    with records_path.open("rb") as f, path.open("w") as out:
        while header := f.read(4):
            (size,) = struct.unpack(">I", header)
            out.write(json.dumps(request_to_json(ExportTraceServiceRequest.FromString(f.read(size)))) + "\n")


def child_parse(path: str) -> dict[str, float]:
    start = time.perf_counter()
    spans = 0
    with open(path, "rb") as f:
        while header := f.read(4):
            (size,) = struct.unpack(">I", header)
            request = ExportTraceServiceRequest.FromString(f.read(size))
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    spans += len(ss.spans)
    return {"seconds": time.perf_counter() - start, "spans": spans}


def child_read(path: str) -> dict[str, float]:
    from otel_plumb.receive.files import read_spans

    start = time.perf_counter()
    spans = sum(1 for _ in read_spans(path))
    return {"seconds": time.perf_counter() - start, "spans": spans}


def child_replay(path: str) -> dict[str, float]:
    from otel_plumb.replay import ReplayStats, iter_trajectories
    from otel_plumb.report.coverage import CoverageCounter

    start = time.perf_counter()
    stats = ReplayStats()
    counter = CoverageCounter()
    trajectories = 0
    tool_steps = 0
    for t in iter_trajectories([path], stats):
        trajectories += 1
        tool_steps += len(t.tool_steps)
        counter.add(t)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "spans": stats.spans,
        "trajectories": trajectories,
        "tool_steps": tool_steps,
        "args_captured": counter.args.get("captured", 0),
        "errors": stats.errors_total,
    }


def run_child(mode: str, path: Path, *, pure: bool = False) -> dict[str, float]:
    env = dict(os.environ)
    env.pop(PURE_PYTHON_ENV, None)
    if pure:
        env[PURE_PYTHON_ENV] = "1"
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(path)], check=True, capture_output=True, text=True, env=env
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def median_run(mode: str, path: Path, runs: int, *, pure: bool = False) -> dict[str, float]:
    """The run of median speed among ``runs``."""
    results = sorted((run_child(mode, path, pure=pure) for _ in range(runs)), key=lambda r: r["seconds"])
    return results[len(results) // 2]


def decoder_in_use() -> str:
    out = subprocess.run(
        [sys.executable, "-c", "import otel_plumb; from otel_plumb.receive import otlp; "
         "print(otlp.DECODER, '-', otlp.DECODER_DETAIL, '- core:', otel_plumb.core())"],
        check=True, capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != PURE_PYTHON_ENV},
    )  # fmt: skip
    return out.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3, help="runs of each measurement; the median is shown")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, path = args.child
        result = {"parse": child_parse, "read": child_read, "replay": child_replay}[mode](path)
        result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(result))
        return

    decoder = decoder_in_use()
    print(f"decoder: {decoder}")
    native = decoder.startswith("native")
    with tempfile.TemporaryDirectory(prefix="otel-plumb-bench-") as tmp:
        path = Path(tmp) / "traces.pb"
        t0 = time.perf_counter()
        spans = write_file(path, args.spans)
        size_mb = os.path.getsize(path) / 2**20
        print(f"file: {spans} spans, {size_mb:.1f} MB of length-prefixed OTLP protobuf "
              f"(written in {time.perf_counter() - t0:.1f}s); median of {args.runs} runs")
        parse = median_run("parse", path, args.runs)
        runs: dict[str, dict[str, dict[str, float]]] = {"pure-python": {}, "native": {}}
        for name in runs if native else ("pure-python",):
            for mode in ("read", "replay"):
                runs[name][mode] = median_run(mode, path, args.runs, pure=name == "pure-python")
        json_path = Path(tmp) / "traces.jsonl"
        write_json_lines(path, json_path)
        json_mb = os.path.getsize(json_path) / 2**20
        replay_json = median_run("replay", json_path, args.runs)

    parse_rate = parse["spans"] / parse["seconds"]
    print(f"plain parse (FromString): {parse_rate:>12,.0f} spans/s   ({parse['seconds']:.2f}s, "
          f"peak RSS {parse['max_rss_mb']:.0f} MB)")
    rates: dict[str, dict[str, float]] = {}
    for name, modes in runs.items():
        if not modes:
            print(f"{name}: not built, not measured")
            continue
        read, replay = modes["read"], modes["replay"]
        rates[name] = {"read": read["spans"] / read["seconds"], "replay": replay["spans"] / replay["seconds"]}
        print(f"{name}:")
        print(f"  read to SpanRecords (decode only):  {rates[name]['read']:>10,.0f} spans/s   "
              f"({rates[name]['read'] / parse_rate:.0%} of plain parse, {read['seconds']:.2f}s, "
              f"{read['seconds'] / replay['seconds']:.0%} of replay time)")
        print(f"  replay (read+normalise+assemble):   {rates[name]['replay']:>10,.0f} spans/s   "
              f"({rates[name]['replay'] / parse_rate:.1%} of plain parse, {replay['seconds']:.2f}s, "
              f"{replay['trajectories']:.0f} trajectories, {replay['tool_steps']:.0f} tool steps, "
              f"{replay['args_captured']:.0f} with arguments, {replay['errors']:.0f} errors, "
              f"peak RSS {replay['max_rss_mb']:.0f} MB)")
    if len(rates) == 2:
        print(f"native / pure-python: read {rates['native']['read'] / rates['pure-python']['read']:.1f}x, "
              f"replay {rates['native']['replay'] / rates['pure-python']['replay']:.2f}x")
    print(f"replay from OTLP/JSON lines ({json_mb:.1f} MB, the file exporter's default format): "
          f"{replay_json['spans'] / replay_json['seconds']:,.0f} spans/s ({replay_json['seconds']:.2f}s, "
          f"peak RSS {replay_json['max_rss_mb']:.0f} MB)")
    mem_budget = 2 * size_mb + 200
    peak = max(m["replay"]["max_rss_mb"] for m in runs.values() if m)
    print(f"replay peak RSS: {peak:.0f} MB for a {size_mb:.1f} MB file (budget 2x file + 200 MB = {mem_budget:.0f} MB)")
    pure = rates["pure-python"]["replay"]
    checks = {
        "replay (native) >= 150k spans/s": native and rates["native"]["replay"] >= 150_000,
        "replay (pure Python) >= 100k spans/s": pure >= 100_000,
        "replay (pure Python) >= 10% of plain parse": pure / parse_rate >= 0.10,
        "peak RSS < 2x file + 200 MB": peak < mem_budget,
        "every span read": all(m["replay"]["spans"] == spans for m in runs.values() if m)
        and spans == parse["spans"] == replay_json["spans"],
    }
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'MISSED'}] {name}")


if __name__ == "__main__":
    main()
