"""Structured logs for the processor: plain text for a terminal, JSON lines for a log pipeline."""

from __future__ import annotations

import json
import logging
import sys
import time

from otel_plumb.processor.config import LoggingConfig
from otel_plumb.terminal import safe


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """One line per record: names and values from the traffic in the message are escaped
    (``terminal.safe``), so they cannot forge lines or drive the terminal."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = safe(record.message)
        return super().formatMessage(record)


def configure_logging(config: LoggingConfig) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.json_format:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("otel_plumb")
    root.handlers[:] = [handler]
    root.setLevel(config.level.upper())
    root.propagate = False
