"""``otel-plumb console``: the read-only API and browser console over a trajectory store."""

from __future__ import annotations

import asyncio
import signal
from typing import TYPE_CHECKING

import click

from otel_plumb.cli.main import RunError

if TYPE_CHECKING:  # aiohttp is imported when the console runs, not for every command
    from aiohttp import web


@click.command()
@click.option("--store", "store_path", required=True, metavar="DB",
              help="The trajectory store (the processor's store.path, replay --store, or a campaign store).")
@click.option("--listen", default="127.0.0.1:8080", show_default=True, metavar="HOST:PORT",
              help="Where to serve the console.")
@click.option("--trace-url", default="", metavar="TEMPLATE",
              help="Link each trajectory to the tracing backend: a URL with {trace_id}, e.g. "
                   "http://jaeger:16686/trace/{trace_id}.")  # fmt: skip
def console(store_path: str, listen: str, trace_url: str) -> None:
    """Serve the console: overview, violations, trajectories, campaigns, side-by-side diffs."""
    from otel_plumb.configtypes import parse_hostport
    from otel_plumb.console import console_app

    try:
        host, port = parse_hostport(listen)
    except ValueError as exc:
        raise RunError(f"--listen: {exc}") from None
    try:
        app = console_app(store_path, trace_url)
    except (FileNotFoundError, OSError) as exc:
        raise RunError(str(exc)) from None
    asyncio.run(_serve(app, host, port))


async def _serve(app: web.Application, host: str, port: int) -> None:
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise RunError(f"--listen {host}:{port}: {exc.strerror or exc}") from None
    bound = runner.addresses[0][1] if runner.addresses else port
    click.echo(f"otel-plumb console: http://{host}:{bound}/", err=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
