"""The JSONL verdict log: one trajectory record (report shape) per decided trajectory, a line of
JSON each, as the trajectory store writes it (``model.text.record_json``: orjson, a sixth of the
time of ``json.dumps`` on a trajectory of 21 steps)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import IO, Any

from otel_plumb.model.text import record_json


class VerdictLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] | None = open(self.path, "ab")  # noqa: SIM115 - open for the run

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(record_json(record) + b"\n")

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
