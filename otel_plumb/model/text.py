"""Text as the model holds it: valid Unicode.

JSON can escape half of a surrogate pair (``"\\ud800"``), and ``json.loads`` keeps such an
unpaired half as a lone surrogate: a str no UTF-8 encoder accepts, so protobuf, SQLite and
orjson would refuse every message, row or record that carried it (an annotated span, a stored
trajectory). Parsed JSON from trace data passes through ``repair_lone_surrogates``, which writes
each lone surrogate as its escape text (``\\ud800``), keeping what was sent visible.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# The escape of a surrogate, in JSON text: where a parse may give a lone one (a valid pair is
# joined into one character by the parser, so this only says where to look).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def may_hold_lone_surrogates(json_text: str | bytes) -> bool:
    """Whether parsing this JSON text may give a lone surrogate (cheap: one scan in C)."""
    pattern = _SURROGATE_ESCAPE if isinstance(json_text, str) else _SURROGATE_ESCAPE_BYTES
    return pattern.search(json_text) is not None  # type: ignore[arg-type]


def parse_json(text: str | bytes) -> Any:
    """``json.loads`` of trace data, with any lone surrogate written as its escape: otherwise a
    ``"\\ud800"`` in one attribute would make everything carrying it unencodable downstream."""
    value = json.loads(text)
    return repair_lone_surrogates(value) if may_hold_lone_surrogates(text) else value


def valid_text(text: str) -> str:
    """``text`` with each lone surrogate written as its escape (``\\ud800``)."""
    if text.isascii() or _LONE_SURROGATE.search(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def repair_lone_surrogates(value: Any) -> Any:
    """A parsed JSON value with ``valid_text`` applied to every string in it, keys too; lists
    and objects are repaired in place (iteratively: a value nested as deep as the parser allows
    is walked without recursion), and the value is returned."""
    if isinstance(value, str):
        return valid_text(value)
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, str):
                    node[i] = valid_text(item)
                elif isinstance(item, (list, dict)):
                    stack.append(item)
        elif isinstance(node, dict):
            if any(isinstance(key, str) and valid_text(key) is not key for key in node):
                items = list(node.items())
                node.clear()
                node.update((valid_text(k) if isinstance(k, str) else k, v) for k, v in items)
            for key, item in node.items():
                if isinstance(item, str):
                    node[key] = valid_text(item)
                elif isinstance(item, (list, dict)):
                    stack.append(item)
    return value


def within_limits(value: Any, max_depth: int, max_int: int) -> Any:
    """A JSON-like value as an output with these limits can hold it: ``valid_text`` strings,
    keys as text, integers beyond ``max_int`` either way as their digits, and below
    ``max_depth`` levels each value as its JSON text. Lists and objects are copies."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, bool) or not isinstance(value, (int, dict, list, tuple)):
        return value
    if isinstance(value, int):
        return value if -max_int <= value <= max_int else str(value)
    if max_depth <= 0:
        try:
            return json.dumps(value, default=str)
        except (ValueError, RecursionError):
            return "[nested too deep]"
    if isinstance(value, dict):
        return {
            valid_text(k) if isinstance(k, str) else str(k): within_limits(v, max_depth - 1, max_int)
            for k, v in value.items()
        }
    return [within_limits(v, max_depth - 1, max_int) for v in value]


# orjson writes str keys, integers of 64 bits and 254 levels of nesting. A record past these (a
# tool's arguments holding a 30-digit number, a Python repr's int keys, JSON nested 300 deep,
# text that is no Unicode) is written with such integers and keys as text and the deepest
# values as their JSON text (``within_limits``), rather than refused with the whole batch or
# line it is in.
_MAX_NESTING = 200
_INT_MAX = (1 << 63) - 1


def record_json(value: Any) -> bytes:
    """The JSON of a record (or a list of them) as the trajectory store and the verdict log
    write it: UTF-8, compact, a float that is no number (NaN, infinity) as null, anything that
    is no JSON value as its ``str``."""
    try:
        return orjson.dumps(value, default=str)
    except TypeError:  # orjson.JSONEncodeError
        return orjson.dumps(within_limits(value, _MAX_NESTING, _INT_MAX), default=str)
