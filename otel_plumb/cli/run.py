"""``otel-plumb run``: the live processor, until SIGTERM or SIGINT (then it drains and exits 0)."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import click

from otel_plumb.check import CompiledPolicy
from otel_plumb.cli.main import RunError
from otel_plumb.processor.config import ProcessorConfig


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Processor config (YAML).")
@click.option("--policy", "policies", multiple=True, help="Policy file; repeatable. Replaces the config's list.")
@click.option("--grpc", "grpc_endpoint", metavar="HOST:PORT", help="OTLP/gRPC listen address (default 127.0.0.1:4317).")
@click.option("--http", "http_endpoint", metavar="HOST:PORT", help="OTLP/HTTP listen address (default 127.0.0.1:4318).")
@click.option("--metrics", "metrics_endpoint", metavar="HOST:PORT", help="/metrics address (default 127.0.0.1:9464).")
@click.option("--export-otlp", metavar="URL", help="Send annotated spans to grpc://HOST:PORT or http(s)://HOST:PORT.")
@click.option("--verdict-log", type=click.Path(dir_okay=False), help="Append one JSON line per decided trajectory.")
@click.option("--state-dir", type=click.Path(file_okay=False), help="Directory of the on-disk export queue.")
def run(
    config_path: str | None,
    policies: tuple[str, ...],
    grpc_endpoint: str | None,
    http_endpoint: str | None,
    metrics_endpoint: str | None,
    export_otlp: str | None,
    verdict_log: str | None,
    state_dir: str | None,
) -> None:
    """Receive OTLP traces, check trajectories live, export metrics and annotated spans."""
    from otel_plumb.check import PolicyError
    from otel_plumb.processor.config import ConfigError, load_config
    from otel_plumb.processor.core import load_policy_files
    from otel_plumb.processor.logs import configure_logging

    overrides: dict[str, Any] = {}
    for key, value in (
        ("receivers.grpc.endpoint", grpc_endpoint),
        ("receivers.http.endpoint", http_endpoint),
        ("metrics.endpoint", metrics_endpoint),
        ("exporters.otlp.endpoint", export_otlp),
        ("verdict_log.path", verdict_log),
    ):
        if value is not None:
            overrides[key] = value
    if policies:
        overrides["policies"] = list(policies)
    try:
        config = load_config(config_path, overrides)
    except ConfigError as exc:
        raise RunError(str(exc)) from exc
    if state_dir is not None and config.exporters.otlp is not None:
        config.exporters.otlp.state_dir = state_dir
    try:
        compiled = load_policy_files(config.policies)
    except PolicyError as exc:
        raise RunError(str(exc)) from exc
    configure_logging(config.logging)
    # Everything the processor writes (queue, journal, dead letters, verdict log) holds span
    # content: readable by its own user only.
    os.umask(0o077)
    try:
        code = asyncio.run(_serve(config, compiled))
    except KeyboardInterrupt:  # a second Ctrl-C while draining
        code = 130
    raise SystemExit(code)


async def _serve(config: ProcessorConfig, policies: list[CompiledPolicy]) -> int:
    from otel_plumb.export.otlp import StateDirInUse
    from otel_plumb.processor.config import ConfigError
    from otel_plumb.processor.core import Processor

    processor = Processor(config, policies)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await processor.start()
    except (OSError, StateDirInUse, ConfigError) as exc:
        await processor.stop(0)
        raise RunError(str(exc)) from exc
    await stop.wait()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    # What the backend did not take in the grace period stays in the on-disk queue for the next start.
    await processor.stop()
    return 0
