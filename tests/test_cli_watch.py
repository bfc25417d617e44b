"""``otel-plumb watch`` against a running processor: the decisions as lines or JSON, filtered on
the server, and a clear refusal without the listener's token."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from test_live_support import agent_provider, config, run_agent, wait_until

from otel_plumb.demo.agent import INVOICES
from otel_plumb.demo.run import policy_path
from otel_plumb.processor import Processor

TOKEN = "watch-token-0123456789abcdef"


def _watch(port: int, *args: str, token: str | None = TOKEN) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "OTEL_PLUMB_TOKEN"}
    if token is not None:
        env["OTEL_PLUMB_TOKEN"] = token
    return subprocess.Popen([sys.executable, "-m", "otel_plumb", "watch", f"grpc://127.0.0.1:{port}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip


async def _lines(proc: subprocess.Popen[str], count: int) -> list[str]:
    assert proc.stdout is not None
    out = []
    for _ in range(count):
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert line, proc.stderr.read() if proc.stderr else ""
        out.append(line)
    return out


async def test_watch_prints_what_the_processor_decides(tmp_path: Path) -> None:
    processor = Processor(config(tmp_path, policies=[str(policy_path())]))
    decided: list[Any] = []
    processor.on_decided(decided.append)
    await processor.start()
    port = processor.grpc_port or 0
    every = _watch(port, "--final", "--json", token=None)
    violating = _watch(port, "--final", "--status", "violating", token=None)
    try:
        await wait_until(lambda: len(processor.hub._subscribers) == 2, 20, "both watchers subscribed")
        provider, _ = agent_provider(port)
        await asyncio.to_thread(run_agent, provider)
        await wait_until(lambda: len(decided) == len(INVOICES), 30, "every trajectory decided")
        records = [json.loads(line) for line in await _lines(every, len(INVOICES))]
        assert sorted(r["traceId"] for r in records) == sorted(d.trajectory.trace_id for d in decided)
        bad = [d for d in decided if d.status == "violating"]
        lines = await _lines(violating, len(bad))
        assert all(line.startswith("violating") for line in lines)
        for d in bad:
            (line,) = [x for x in lines if d.trajectory.trace_id[:16] in x]
            assert all(v.invariant in line for v in d.failures)
    finally:
        every.kill()
        violating.kill()
        await processor.stop()


async def test_watch_without_the_token_is_refused_and_says_why(tmp_path: Path) -> None:
    grpc_auth = {"endpoint": "127.0.0.1:0", "auth": {"bearer_tokens": [{"token": TOKEN}]}}
    processor = Processor(config(tmp_path, receivers={"grpc": grpc_auth}))
    await processor.start()
    try:
        refused = _watch(processor.grpc_port or 0, token=None)
        code = await asyncio.to_thread(refused.wait, 20)
        assert code == 2
        assert "not authenticated: set OTEL_PLUMB_TOKEN" in (refused.stderr.read() if refused.stderr else "")
    finally:
        await processor.stop()
