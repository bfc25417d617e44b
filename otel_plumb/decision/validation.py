"""Strict parsing helpers: a base model that forbids unknown keys, YAML/JSON without
duplicate keys, and validation errors that name the file, the line and the field."""

from __future__ import annotations

import json
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

SENSITIVE_KEYS = frozenset(
    {
        "api_key",
        "apikey",
        "authorization",
        "access_token",
        "refresh_token",
        "token",
        "password",
        "secret",
        "client_secret",
        "cookie",
        "set_cookie",
    }
)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _UniqueKeyLoader(yaml.SafeLoader):
    """Safe loader that refuses duplicate mapping keys instead of keeping the last."""


def _mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in out:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
            )
        out[key] = loader.construct_object(value_node, deep=True)
    return out


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` hook refusing duplicate keys."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def parse_document(text: str, *, json_only: bool) -> Any:
    if json_only:
        return json.loads(text, object_pairs_hook=unique_keys)
    return yaml.load(text, Loader=_UniqueKeyLoader)


def _line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest node on ``loc`` that exists in the document."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def format_errors(exc: ValidationError, *, prefix: str = "", text: str | None = None, limit: int = 20) -> str:
    """One ``  location[ (line N)]: message`` line per problem."""
    lines = []
    errors = exc.errors(include_url=False)
    for error in errors[:limit]:
        loc = tuple(error["loc"])
        # Tagged unions add the tag to the location; it is not a key of the document.
        loc = tuple(part for part in loc if part not in ("choice", "noul", "score") or loc.index(part) != 1)
        location = ".".join([prefix, *map(str, loc)] if prefix else map(str, loc)) or "(root)"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown field (check the spelling)"
        elif error["type"] == "missing":
            message = "required field is missing"
        elif message.startswith("Value error, "):
            message = message.removeprefix("Value error, ")
        line = _line_of(text, loc) if text is not None else None
        lines.append(f"  {location}{f' (line {line})' if line else ''}: {message}")
    if len(errors) > limit:
        lines.append(f"  ... and {len(errors) - limit} more")
    return "\n".join(lines)


def redact(value: Any) -> Any:
    """Replace values under credential-like keys in untrusted metadata."""
    if isinstance(value, dict):
        return {
            k: "[REDACTED]" if isinstance(k, str) and k.lower().replace("-", "_") in SENSITIVE_KEYS else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value
