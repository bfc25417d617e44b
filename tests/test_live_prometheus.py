"""A real Prometheus scrapes a running processor; PromQL returns the violation count."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_live_support import agent_provider, config, free_port, run_agent, wait_until

from otel_plumb.demo.run import policy_path
from otel_plumb.processor import Processor
from otel_plumb.report.records import decided_record

QUERY = 'sum(plumb_violations_total{policy="ap-controls",severity="critical"})'


async def test_prometheus_scrapes_violation_counts(tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("the prometheus binary is not installed (.ci/install.d/10-prometheus.sh installs it)")
    processor = Processor(config(tmp_path, policies=[str(policy_path())]))
    decided: list[dict[str, Any]] = []
    processor.on_decided(lambda d: decided.append(decided_record(d)))
    await processor.start()
    prom_port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 500ms, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: otel-plumb\n    static_configs: [{{targets: ['127.0.0.1:{processor.metrics_port}']}}]\n"
    )
    prometheus = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    value: list[float] = []
    try:
        agent, _ = agent_provider(processor.grpc_port or 0)

        await asyncio.to_thread(run_agent, agent)
        await wait_until(lambda: len(decided) == 6, 10, "all trajectories decided")
        async with aiohttp.ClientSession() as session:

            async def query() -> None:
                url = f"http://127.0.0.1:{prom_port}/api/v1/query"
                try:
                    async with session.get(url, params={"query": QUERY}) as resp:
                        result = (await resp.json())["data"]["result"]
                        if result:
                            value[:] = [float(result[0]["value"][1])]
                except aiohttp.ClientError:
                    pass  # not listening yet

            deadline = asyncio.get_running_loop().time() + 30
            while value != [4.0] and asyncio.get_running_loop().time() < deadline:
                await query()
                await asyncio.sleep(0.2)
    finally:
        prometheus.terminate()
        await asyncio.to_thread(prometheus.wait, 10)
        await processor.stop()
    # INV-1002 (dup-check, dup-before-pay), INV-1003 (pay-once), INV-1004 (pay-as-invoiced).
    assert value == [4.0]
