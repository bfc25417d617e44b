"""The JSONL verdict log: one trajectory record (report shape) per decided trajectory."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import IO, Any


class VerdictLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open for the run

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Close the file; what a full disk kept from being written is lost (the processor counts
        the failed writes in plumb_storage_errors_total{operation="verdict_log"})."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
