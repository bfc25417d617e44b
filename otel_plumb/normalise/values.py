"""Decoding attribute values: JSON, double-encoded JSON, Python reprs, placeholders.

Instrumentations record arguments and results as JSON strings (OTel GenAI, Vercel, Langfuse),
JSON strings of JSON strings (MLflow, some exporters), Python ``repr`` (LangChain tool inputs,
older ADK), OTLP maps/arrays, or a placeholder when content capture is off. Only what decodes
cleanly is data; everything else is marked, never guessed.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any, Final

import orjson

from otel_plumb.model.placeholders import is_placeholder
from otel_plumb.model.text import parse_json, repair_lone_surrogates
from otel_plumb.model.trajectory import CaptureStatus

# Largest string handed to ast.literal_eval: it builds a full syntax tree first.
_LITERAL_EVAL_MAX: Final = 200_000
_OPENERS: Final[tuple[str, ...]] = ("{", "[")
# orjson turns integers beyond 64 bits into floats, where json keeps them exact: a value orjson
# read with a float of that size takes json's path. That is looked for in the parsed value when
# it has at most one value per _BYTES_PER_VALUE bytes of text (message content: a few values in
# many bytes), else (many short values) in the text's bytes, for a run of 19 digits: so the look
# costs no more than the cheaper of the two. Most texts hold fewer than 19 digits in all, which
# one bytes.translate deleting every other byte shows; only then are the digits mapped to "0" and
# everything else to "." for a substring search.
_LOSSY: Final = float(2**63)
_BYTES_PER_VALUE: Final = 16
_NOT_DIGITS: Final = bytes(i for i in range(256) if not 0x30 <= i <= 0x39)
_DIGITS_TO_ZERO: Final = bytes(0x30 if 0x30 <= i <= 0x39 else 0x2E for i in range(256))
_LONG_DIGIT_RUN: Final = b"0" * 19
# Double (or deeper) encoding is unwound at most this many times.
_MAX_UNWRAP: Final = 3


def _may_have_lost_digits(value: dict[str, Any] | list[Any], text: str) -> bool:
    """Whether orjson may have read an integer beyond 64 bits in ``text`` as the float it holds
    in ``value``; a float of that size written as one (``1e19``) also says yes (json reads it
    the same). Such an integer has 19 digits at least."""
    if len(text) < 19:
        return False
    containers: list[Any] = [value]
    budget = len(text) // _BYTES_PER_VALUE
    while containers:
        c = containers.pop()
        budget -= len(c)
        if budget < 0:
            return _long_digit_run(text.encode())
        # A loop per container type: compiled, each walks its own kind natively.
        if type(c) is dict:
            d: dict[str, Any] = c
            for v in d.values():
                if _lossy_or_container(v, containers):
                    return True
        else:
            items: list[Any] = c
            for v in items:
                if _lossy_or_container(v, containers):
                    return True
    return False


def _lossy_or_container(v: Any, containers: list[Any]) -> bool:
    """Whether ``v`` is a float beyond 64-bit integers; a dict or list is kept to walk."""
    t = type(v)
    if t is float:
        f: float = v
        return not -_LOSSY < f < _LOSSY
    if t is dict or t is list:
        containers.append(v)
    return False


def _long_digit_run(data: bytes) -> bool:
    if len(data.translate(None, _NOT_DIGITS)) < len(_LONG_DIGIT_RUN):
        return False
    return _LONG_DIGIT_RUN in data.translate(_DIGITS_TO_ZERO)


@dataclass(slots=True, init=False)  # its own __init__: see model/trajectory.py
class Decoded:
    value: Any
    status: CaptureStatus
    # Why the value is not data ("redacted placeholder", "not JSON: ..."); None when captured.
    reason: str | None = None

    def __init__(self, value: Any, status: CaptureStatus, reason: str | None = None) -> None:
        self.value = value
        self.status = status
        self.reason = reason


ABSENT: Final = Decoded(None, "absent")


def given_result(raw: Any) -> Any:
    """A tool result given back to a model in its input messages, for ``tool_results``: the value
    when captured, else the ``Decoded`` saying why not (``ABSENT`` when there is nothing). The
    step it is matched to then carries the real status, never a captured null."""
    d = decode(raw)
    return d.value if d.status == "captured" else d


def decode(raw: Any) -> Decoded:
    """One attribute value -> data, or why it is not data. Never raises."""
    if raw is None:
        return ABSENT
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            return Decoded(None, "undecodable", "bytes are not UTF-8")
    if isinstance(raw, str):
        return _decode_text(raw)
    # OTLP maps, arrays and scalars are data already.
    return Decoded(raw, "captured")


def _decode_text(text: str) -> Decoded:
    # Fast path, the common case on the hot path: a JSON object or array, encoded once.
    if text[:1] in _OPENERS:
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            pass  # NaN, Python reprs, lone surrogates, garbage: the careful path below decides
        else:
            if not _may_have_lost_digits(value, text):  # an object or an array: it starts with one
                return Decoded(value, "captured")
    s = text.strip()
    if not s:
        return ABSENT
    if is_placeholder(s):
        return Decoded(None, "redacted", f"placeholder {s[:40]!r}")
    value = text
    for _ in range(_MAX_UNWRAP):
        if not isinstance(value, str):
            break
        s = value.strip()
        if not s or s[0] not in '{["':
            if is_placeholder(s):
                return Decoded(None, "redacted", f"placeholder {s[:40]!r}")
            break
        parsed = _parse_structured(s)
        if isinstance(parsed, _Failure):
            if value is text:
                return Decoded(None, "undecodable", parsed.reason)
            break  # an inner string that merely starts with '{' stays a string
        value = parsed
    return Decoded(value, "captured")


class _Failure:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _parse_structured(s: str) -> Any:
    """JSON, else a Python literal; either with any lone surrogate written as its escape
    (``model.text``: checks compare it, verdicts and stored trajectories carry it)."""
    try:
        return parse_json(s)
    except (ValueError, RecursionError) as exc:
        # The message, not the exception: kept past the handler, its traceback would hold this
        # frame and every caller's (a reference cycle, left for the cyclic collector).
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
    if len(s) <= _LITERAL_EVAL_MAX:
        try:
            value = ast.literal_eval(s)  # Python reprs: {'a': 1, 'ok': True}
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
        else:
            return repair_lone_surrogates(value)
    return _Failure(f"neither JSON nor a Python literal ({msg})")


# Frameworks record a tool's input as the call they made rather than the arguments: a Python
# call's ``{"args": [...], "kwargs": {...}}`` (smolagents, other decorators), LangChain's
# callback payload ``{"input_str": "<repr or JSON>", "tags": [...], "metadata": {...}}``
# (OpenLLMetry's LangChain instrumentation). These keys alone, besides the payload, mark them.
_CALL_WRAPPER_EXTRAS: Final = frozenset({"sanitize_inputs_outputs", "self"})
_CALLBACK_EXTRAS: Final = frozenset(
    {"tags", "metadata", "kwargs", "inputs", "run_id", "parent_run_id", "serialized", "name"}
)


def unwrap_call(value: Any) -> Decoded | None:
    """The arguments inside a framework's call wrapper, or why they cannot be told; None when
    ``value`` is no wrapper (the usual case: it is the arguments).

    The text a wrapper holds (``input_str``, ``{"input": "<json>"}``) is decoded: a placeholder
    makes the arguments ``redacted``, text opening with ``{`` or ``[`` that does not decode (cut
    off, mangled) ``undecodable`` with the reason; neither is kept as a wrapper that lacks the
    arguments."""
    if type(value) is not dict:
        return None
    keys = value.keys()
    if ("kwargs" in keys or "args" in keys) and keys - {"args", "kwargs"} <= _CALL_WRAPPER_EXTRAS:
        args, kwargs = value.get("args") or [], value.get("kwargs") or {}
        if isinstance(kwargs, dict) and args in ([], ()):
            return Decoded(kwargs, "captured")
        if isinstance(kwargs, dict) and not kwargs and isinstance(args, list) and len(args) == 1:
            inner = args[0]
            if isinstance(inner, dict):
                return Decoded(inner, "captured")
        if _only_placeholders(args, kwargs):
            return Decoded(None, "redacted", "call wrapper holding only redaction placeholders")
        return Decoded(None, "undecodable", f"positional arguments without their names: {str(args)[:80]}")
    if "input_str" in keys and keys - {"input_str"} <= _CALLBACK_EXTRAS:
        inputs = value.get("inputs")
        if isinstance(inputs, dict) and inputs:
            return Decoded(inputs, "captured")
        inner = decode(value["input_str"])
        if inner.status != "captured":
            return inner
        # A single-string input stays a bare value: the model's request names the argument.
        return Decoded(inner.value, "captured")
    if keys == {"input"} and isinstance(value["input"], str):
        # MLflow / Langfuse: the input serialised once more.
        inner = decode(value["input"])
        if inner.status == "captured" and isinstance(inner.value, dict):
            return inner
        if inner.status in ("redacted", "undecodable"):
            # A placeholder, or JSON cut off or mangled: the arguments are in there but cannot be
            # read, so the wrapper is not passed off as them (a check on one would fail falsely).
            # Plain text (and an empty string) stays wrapped: it may be the tool's one argument.
            return inner
    return None


def _only_placeholders(args: Any, kwargs: Any) -> bool:
    """Whether a call wrapper's ``args`` and ``kwargs`` (not both empty) are placeholders, as a
    whole or each positional argument: ``{"args": ["<REDACTED>"], "kwargs": {}}``."""
    parts: list[Any] = list(args) if isinstance(args, (list, tuple)) else [args]
    if kwargs:
        parts.append(kwargs)
    return bool(parts) and all(isinstance(p, str) and is_placeholder(p) for p in parts)
