"""Entry point. Commands are imported lazily so ``otel-plumb gate`` does not pay for gRPC.

Exit codes everywhere: 0 ok, 1 a check or gate failed, 2 the run itself could not be done.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, TextIO

import click

# command name -> "module:attribute" of a click command or group
COMMANDS: dict[str, str] = {
    "replay": "otel_plumb.cli.replay:replay",
    "coverage": "otel_plumb.cli.replay:coverage",
    "check-policy": "otel_plumb.cli.policy:check_policy",
    "gate": "otel_plumb.cli.gate:gate",
    "run": "otel_plumb.cli.run:run",
    "demo": "otel_plumb.cli.demo:demo",
    "decision": "otel_plumb.cli.decision:decision",
    "campaign": "otel_plumb.cli.campaign:campaign",
    "suggest": "otel_plumb.cli.suggest:suggest",
    "console": "otel_plumb.cli.console:console",
    "watch": "otel_plumb.cli.watch:watch",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        return command


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import version

    from otel_plumb import core
    from otel_plumb.receive.otlp import DECODER, DECODER_DETAIL

    click.echo(
        f"otel-plumb, version {version('otel-plumb')}\nOTLP decoder: {DECODER} ({DECODER_DETAIL})\ncore: {core()}"
    )
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and the compiled parts in use, and exit.")  # fmt: skip
def cli() -> None:
    """Check LLM agent trajectories, built from OpenTelemetry traces, against declared invariants."""


class _UntilReaderGone:
    """Standard output that, once its reader has gone (``otel-plumb replay ... | head -1``),
    drops the rest instead of raising: a closed pipe is not a verdict, so the command finishes
    and exits as it would have (0, or 1 for a violation), without a traceback."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self.gone = True
        # What is still buffered goes nowhere, also when the interpreter flushes at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main() -> None:
    sys.stdout = _UntilReaderGone(sys.stdout)
    try:
        cli.main(prog_name="otel-plumb", standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)


class RunError(click.ClickException):
    """The run itself could not be done (bad input, bad config): exit code 2."""

    exit_code = 2
