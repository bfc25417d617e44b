"""``otel-plumb demo``: the live processor checking a bundled, instrumented agent."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="otel-plumb-demo", show_default=True,
              help="Where the report and the verdict log are written.")
@click.option("--rounds", type=click.IntRange(1, 100), default=1, show_default=True,
              help="How many times the agent works through its invoices.")
@click.option("--keep-running", is_flag=True,
              help="Keep the console over the demo's trajectory store up (until Ctrl-C).")
def demo(out_dir: str, rounds: int, keep_running: bool) -> None:
    """Start the processor, run an accounts-payable agent against it (some runs faulty), print live verdicts,
    then run a campaign of the agent's faulty build against a fixed one into the same store."""
    from otel_plumb.demo.run import main

    main(Path(out_dir), rounds, keep_running)
