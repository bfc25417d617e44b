"""Normalising spans by what they carry: ``python bench/normalise.py [--runs 5]``.

For OTel GenAI spans carrying content of each shape below (model calls with message lists of
1 KB and 100 KB of prose, tool calls with 200-byte arguments and with results that are long
numeric arrays), the CPU microseconds ``normalise`` spends per span, against the floor in the
same run: ``orjson.loads`` of the same content alone (reading it as JSON at all costs that).
The ratio says what normalising adds beyond parsing the JSON; the best of ``--runs`` runs.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from typing import Any

import orjson

from otel_plumb.model.span import SpanRecord
from otel_plumb.normalise import normalise

SPANS = 200  # per shape and run
WORDS = ("the", "order", "refund", "customer", "please", "id", "2024-05-01", "amount", "EUR", "42.50", "ok", "A-1093")


def prose(size: int, rng: random.Random) -> str:
    out: list[str] = []
    n = 0
    while n < size:
        out.append(rng.choice(WORDS))
        n += len(out[-1]) + 1
    return " ".join(out)


def model_call(content: str, i: int) -> SpanRecord:
    return SpanRecord(
        f"{i:032x}", f"{i:016x}", f"{i + 1:016x}", "chat gpt-4o", start_ns=i, end_ns=i + 1,
        attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.input.messages": content,
                    "gen_ai.usage.input_tokens": 812, "gen_ai.usage.output_tokens": 64},
        scope_name="opentelemetry.instrumentation.openai_v2",
    )  # fmt: skip


def tool_call(arguments: str, result: str, i: int) -> SpanRecord:
    return SpanRecord(
        f"{i:032x}", f"{i:016x}", f"{i + 1:016x}", "execute_tool lookup", start_ns=i, end_ns=i + 1,
        attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
                    "gen_ai.tool.call.id": f"call_{i}", "gen_ai.tool.call.arguments": arguments,
                    "gen_ai.tool.call.result": result},
        scope_name="opentelemetry.instrumentation.openai_v2",
    )  # fmt: skip


def shapes(rng: random.Random) -> list[tuple[str, list[SpanRecord], list[str]]]:
    """(label, spans, the JSON texts they carry) per shape."""
    out = []
    for size in (1024, 100 * 1024):
        texts = [json.dumps([{"role": "system", "parts": [{"type": "text", "content": prose(size // 5, rng)}]},
                             {"role": "user", "parts": [{"type": "text", "content": prose(size * 4 // 5, rng)}]}])
                 for _ in range(SPANS)]  # fmt: skip
        out.append(
            (f"model call, {size // 1024} KB of messages", [model_call(t, i) for i, t in enumerate(texts)], texts)
        )
    arguments = [json.dumps({"order_id": f"A-{i}", "amount": 42.5, "currency": "EUR", "note": prose(120, rng)})
                 for i in range(SPANS)]  # fmt: skip
    for label, make in (("1,500 floats", lambda: rng.random()), ("1,500 integers", lambda: rng.randrange(10**6))):
        results = [json.dumps([make() for _ in range(1500)]) for _ in range(SPANS)]
        spans = [tool_call(a, r, i) for i, (a, r) in enumerate(zip(arguments, results, strict=True))]
        out.append((f"tool call, result of {label}", spans, arguments + results))
    return out


def best_cpu_us(work: Callable[[Any], object], items: list[Any], runs: int) -> float:
    """CPU µs per item of ``work`` over ``items``, its results dropped as it goes (as the
    processor drops a parsed message list once it has read it), the best of ``runs`` runs."""
    best = float("inf")
    for _ in range(runs):
        start = time.process_time()
        for item in items:
            work(item)
        best = min(best, time.process_time() - start)
    return best / len(items) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs of each measurement; the best is shown")
    args = parser.parse_args()
    print(f"{'content':>36} {'normalise us/span':>18} {'orjson.loads us/span':>21} {'ratio':>6}")
    for label, spans, texts in shapes(random.Random(7)):
        ours = best_cpu_us(normalise, spans, args.runs)
        floor = best_cpu_us(orjson.loads, texts, args.runs) * len(texts) / len(spans)
        print(f"{label:>36} {ours:>18.1f} {floor:>21.1f} {ours / floor:>5.2f}x")


if __name__ == "__main__":
    main()
