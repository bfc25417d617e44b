"""The types every component's config is built from: a model that refuses unknown keys,
durations, sizes and endpoints written as in Collector configs, and file paths, which resolve
against the config file's directory.

Each component keeps its config beside its code (``tls.py``, ``receive/config.py``,
``export/config.py``); ``processor/config.py`` composes them into the one file and loads it.
This module imports nothing of the product, so any component may use it.
"""

from __future__ import annotations

import os
import re
import types
from typing import Annotated, Any, Union, get_args, get_origin

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


class _FileMarker:
    """Metadata marking a config value as a file or directory path."""


FilePath = Annotated[str, _FileMarker()]


def resolve_paths(model: type[BaseModel], data: Any, base: str) -> Any:
    """``data``, a section of a config file as read (before validation), with every relative
    ``FilePath`` value of ``model`` joined to ``base``, the file's directory, as Prometheus does
    for ``rule_files``. Values that do not fit the schema are left for validation to report."""
    if not isinstance(data, dict):
        return data
    resolved = dict(data)
    for name, field in model.model_fields.items():
        for key in {name, field.alias or name}:
            if key in resolved:
                resolved[key] = _resolve(field.annotation, field.metadata, resolved[key], base)
    return resolved


def _resolve(annotation: Any, metadata: list[Any], value: Any, base: str) -> Any:
    if any(isinstance(m, _FileMarker) for m in metadata):
        if isinstance(value, str) and value and not os.path.isabs(value):
            return os.path.normpath(os.path.join(base, value))
        return value
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *more = get_args(annotation)
        return _resolve(inner, more, value, base)
    if origin in (Union, types.UnionType):
        for option in get_args(annotation):
            resolved = _resolve(option, [], value, base)
            if resolved is not value:
                return resolved
        return value
    if origin is list and isinstance(value, list):
        (item,) = get_args(annotation)
        return [_resolve(item, [], v, base) for v in value]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return resolve_paths(annotation, value, base)
    return value
