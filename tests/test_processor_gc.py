"""The live processor tunes the cyclic garbage collector while it runs, and gives it back as it was."""

from __future__ import annotations

import asyncio
import gc

from otel_plumb.processor import Processor, load_config
from otel_plumb.processor.core import GC_THRESHOLDS


def test_start_freezes_what_start_up_built_and_raises_the_thresholds_stop_restores_them() -> None:
    before = gc.get_threshold()
    assert before != GC_THRESHOLDS

    async def run() -> tuple[tuple[int, ...], int]:
        config = load_config(None, {
            "receivers": {"grpc": {"enabled": False}, "http": {"enabled": False}},
            "metrics": {"endpoint": ""},
        })  # fmt: skip
        processor = Processor(config, [])
        await processor.start()
        try:
            return gc.get_threshold(), gc.get_freeze_count()
        finally:
            await processor.stop()

    running, frozen = asyncio.run(run())
    assert running == GC_THRESHOLDS
    assert frozen > 1000  # the interpreter, the modules and the processor itself
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
