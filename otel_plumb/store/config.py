"""The processor config's ``store`` section: where decided trajectories are kept for the console."""

from __future__ import annotations

from pydantic import Field

from otel_plumb.configtypes import Bytes, ConfigModel, FilePath, Seconds

DAY = 86400.0


class StoreConfig(ConfigModel):
    # The SQLite file (a campaign store may be the same file: the console shows both).
    path: FilePath
    # Records older than this are deleted.
    max_age: Seconds = 7 * DAY
    # Past this size the oldest records are deleted until the file is back under it.
    max_bytes: Bytes = 1 << 30
    # Records in flight to the writer process; past it new ones are dropped and counted, so a
    # slow disk never slows the processor.
    max_pending: int = Field(default=10_000, ge=1)
