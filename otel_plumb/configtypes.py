"""The types every component's config is built from: a model that refuses unknown keys, and
durations, sizes and endpoints written as in Collector configs.

Each component keeps its config beside its code (``tls.py``, ``receive/config.py``,
``export/config.py``); ``processor/config.py`` composes them into the one file and loads it.
This module imports nothing of the product, so any component may use it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class ConfigModel(BaseModel):
    """A config section: an unknown key is an error."""

    model_config = ConfigDict(extra="forbid")


def _duration(value: Any) -> Any:
    """Seconds as a number, or a string such as ``500ms``, ``2s``, ``5m`` (as in Collector configs)."""
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m is None:
            raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 2s, 5m)")
        return float(m.group(1)) * _UNITS[m.group(2)]
    return value


Seconds = Annotated[float, BeforeValidator(_duration), Field(ge=0)]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$")
_SIZE_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def _size(value: Any) -> Any:
    """Bytes as a number, or a string such as ``512KiB``, ``256MiB``, ``1GiB``."""
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m is None:
            raise ValueError(f"not a size: {value!r} (use e.g. 512KiB, 256MiB, 1GiB)")
        return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    return value


Bytes = Annotated[int, BeforeValidator(_size), Field(ge=1)]


def parse_hostport(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def check_hostport(value: str) -> str:
    parse_hostport(value)
    return value


Endpoint = Annotated[str, BeforeValidator(lambda v: check_hostport(str(v)))]
