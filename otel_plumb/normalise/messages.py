"""Tool calls and tool results inside decoded message payloads, whatever their shape.

Model outputs name the tools they want in several shapes; the readers hand the decoded
payload here and get RequestedCalls back:

- OTel GenAI parts: ``{"type": "tool_call", "id", "name", "arguments"}``
- OpenAI chat: ``{"id", "type": "function", "function": {"name", "arguments"}}``
- LangChain: ``{"type": "tool_call", "name", "args", "id"}``
- Vercel AI SDK: ``{"toolCallId", "toolName", "args" | "input"}``
- Bedrock/Strands: ``{"toolUse": {"toolUseId", "name", "input"}}``; Anthropic ``{"type": "tool_use", ...}``
- Gemini/ADK: ``{"functionCall": {"id", "name", "args"}}``

Tool results given back to the model (input messages) are read the same way, by tool-call id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from otel_plumb.model.trajectory import RequestedCall
from otel_plumb.normalise.values import ABSENT, decode, given_result

# Containers that may hold calls or results; anything else is not descended into.
_CONTAINER_KEYS = (
    "parts",
    "tool_calls",
    "toolCalls",
    "content",
    "message",
    "messages",
    "choices",
    "output",
    "outputs",
    "candidates",
    "generations",
    "kwargs",
    "additional_kwargs",
    "response",
    "data",
)
# Their order of descent, looked up from a node's own keys (a message has a few keys; there
# are fifteen containers, and every model call's messages are walked).
_CONTAINER_ORDER: Final = {key: i for i, key in enumerate(_CONTAINER_KEYS)}
_MAX_DEPTH: Final = 8
_CALL_TYPES: Final = frozenset({"tool_call", "function_call", "tool-call", "tool_use", "function"})
_RESULT_TYPES: Final = frozenset({"tool_call_response", "tool-result", "tool_result", "function_call_output"})


def requested_calls(payload: Any) -> list[RequestedCall]:
    """Every tool call requested in a decoded output payload, in order; a call seen twice under
    the same id (LangChain keeps both ``tool_calls`` and the provider's raw copy) counts once."""
    out: list[RequestedCall] = []
    seen: set[str] = set()
    for call in _calls(payload, 0):
        if call.tool_call_id is not None:
            if call.tool_call_id in seen:
                continue
            seen.add(call.tool_call_id)
        out.append(call)
    return out


def _calls(node: Any, depth: int) -> Iterator[RequestedCall]:
    if depth > _MAX_DEPTH:
        return
    if isinstance(node, list):
        for item in node:
            yield from _calls(item, depth + 1)
        return
    if not isinstance(node, dict):
        return
    call = _as_call(node)
    if call is not None:
        yield call
        return
    for child in _containers(node):
        yield from _calls(child, depth + 1)


def _containers(node: dict[Any, Any]) -> list[Any]:
    """The node's lists and objects under container keys, in ``_CONTAINER_KEYS`` order. Read from
    the node's own keys (a message or part has a few; every model call's messages are walked);
    any keys: a Python literal's need not be text."""
    found: list[tuple[int, Any]] = []
    for key, child in node.items():
        order = _CONTAINER_ORDER.get(key)
        if order is not None and isinstance(child, (list, dict)):
            found.append((order, child))
    if len(found) < 2:
        return [child for _, child in found]
    found.sort(key=_first_of)
    return [child for _, child in found]


def _first_of(pair: tuple[int, Any]) -> int:
    return pair[0]


def _as_call(node: dict[str, Any]) -> RequestedCall | None:
    for wrapper in ("toolUse", "functionCall", "function_call"):
        inner = node.get(wrapper)
        if isinstance(inner, dict) and "name" in inner:
            return _call(inner.get("name"), _first(inner, ("input", "args", "arguments")), _call_id(inner))
    fn = node.get("function")
    if isinstance(fn, dict) and "name" in fn:  # OpenAI chat
        return _call(fn.get("name"), fn.get("arguments"), _call_id(node))
    if "toolName" in node and ("args" in node or "input" in node or "toolCallId" in node):  # Vercel
        return _call(node.get("toolName"), _first(node, ("args", "input")), _call_id(node))
    kind = node.get("type")
    if isinstance(kind, str) and kind in _CALL_TYPES and isinstance(node.get("name"), str):
        return _call(node.get("name"), _first(node, ("arguments", "args", "input")), _call_id(node))
    return None


def _first(node: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if key in node:
            return node[key]
    return None


def _call_id(node: dict[str, Any]) -> str | None:
    for key in ("id", "tool_call_id", "toolCallId", "toolUseId", "call_id"):
        value = node.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and value != "":
            return str(value)
    return None


def _call(name: Any, raw_args: Any, call_id: str | None) -> RequestedCall | None:
    if not isinstance(name, str) or not name:
        return None
    d = decode(raw_args)
    return RequestedCall(name=name, args=d.value, args_status=d.status, tool_call_id=call_id)


def tool_results(payload: Any) -> dict[str, Any]:
    """Tool results in decoded input messages, by tool-call id (a ``Decoded`` for one whose
    content was not captured, see ``values.given_result``): only those after the last assistant
    message, i.e. what this call gives back for the previous call's requests. Each model call
    repeats the whole history; keeping all of it would grow buffers quadratically."""
    out: dict[str, Any] = {}
    _results(recent_messages(payload), out, 0)
    return out


_ASSISTANT_ROLES: Final = frozenset({"assistant", "model", "ai"})


def recent_messages(payload: Any) -> Any:
    """The messages after the last assistant message, for a message list (or ``{"messages": [...]}``)."""
    if isinstance(payload, dict) and isinstance(payload.get("messages"), list):
        payload = payload["messages"]
    if not isinstance(payload, list):
        return payload
    for i in range(len(payload) - 1, -1, -1):
        message = payload[i]
        if isinstance(message, dict) and isinstance(role := message.get("role"), str) and role in _ASSISTANT_ROLES:
            return payload[i + 1 :]
    return payload


def _results(node: Any, out: dict[str, Any], depth: int) -> None:
    if depth > _MAX_DEPTH:
        return
    if isinstance(node, list):
        for item in node:
            _results(item, out, depth + 1)
        return
    if not isinstance(node, dict):
        return
    found = _as_result(node)
    if found is not None:
        # A result message without content (content capture off) is no result; one whose
        # content was redacted or is undecodable is kept as such (see values.given_result).
        if found[1] is not ABSENT:
            out[found[0]] = found[1]
        return
    for child in _containers(node):
        _results(child, out, depth + 1)


def _as_result(node: dict[str, Any]) -> tuple[str, Any] | None:
    kind = node.get("type")
    role = node.get("role")
    tool_like = (isinstance(kind, str) and (kind == "tool" or kind in _RESULT_TYPES)) or (
        isinstance(role, str) and role == "tool"
    )
    if not tool_like and not _has_wrapper(node):
        return None  # the usual message or part: nothing a result has (a quick look first)
    for wrapper in _RESULT_WRAPPERS:
        inner = node.get(wrapper)
        if isinstance(inner, dict):
            call_id = _call_id(inner)
            if call_id is not None:
                return call_id, given_result(_first(inner, ("content", "response", "output")))
    if isinstance(kind, str) and kind in _RESULT_TYPES:  # "type" may be anything in hostile input
        call_id = _call_id(node) or _str(node.get("tool_use_id"))
        if call_id is not None:
            return call_id, given_result(_first(node, ("response", "result", "output", "content")))
    if node.get("role") == "tool" or kind == "tool":
        call_id = _str(node.get("tool_call_id")) or _str(node.get("toolCallId"))
        content = node.get("content")
        if call_id is not None and not isinstance(content, list):
            return call_id, given_result(content)
    return None


_RESULT_WRAPPERS: Final[tuple[str, ...]] = ("toolResult", "functionResponse", "function_response")


def _has_wrapper(node: dict[Any, Any]) -> bool:
    for key in _RESULT_WRAPPERS:  # noqa: SIM110 (a loop: any() over a generator takes twice as long)
        if key in node:
            return True
    return False


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
