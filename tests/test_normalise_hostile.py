"""Hostile input, reader by reader: spans routed to each convention reader whose structured
attributes (message lists, arguments, results, payloads, events) hold message-shaped trees as
JSON text, as native OTLP arrays/maps, as Python reprs, or scalars of the wrong type. Whatever
they hold, normalise records problems rather than raising, and the trajectory still builds."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_normalise import span

from otel_plumb.assemble import build_trajectory
from otel_plumb.model import SpanEvent, SpanRecord
from otel_plumb.normalise import normalise
from otel_plumb.normalise.messages import _CONTAINER_KEYS


def check(normalised: list[Any]) -> None:
    """What every normalised span promises, whatever its input; and its trajectory builds."""
    for n in normalised:
        assert n.kind in ("tool", "llm", "agent", "other")
        assert isinstance(n.name, str)
        assert all(isinstance(c.name, str) and c.name for c in n.requested_calls)
        assert all(isinstance(k, str) for k in n.tool_results)
        assert all(isinstance(p, str) and ": " in p for p in n.problems)
    build_trajectory("k", normalised)


# ---------------------------------------------------------------------------------------------
# Values: message-shaped trees over the keys the readers look at, and wrong scalars.

TREE_KEYS = [
    # message walkers (messages.py)
    "role",
    "type",
    "id",
    "tool_call_id",
    "toolCallId",
    "toolUseId",
    "call_id",
    "tool_use_id",
    "name",
    "arguments",
    "args",
    "input",
    "function",
    "function_call",
    "functionCall",
    "toolUse",
    "toolResult",
    "functionResponse",
    "function_response",
    "toolName",
    *_CONTAINER_KEYS,  # the keys the message walkers descend through
    "result",
    # call wrappers and content blocks (values.py, common.py)
    "inputs",
    "input_str",
    "tags",
    "metadata",
    "self",
    "sanitize_inputs_outputs",
    "text",
    "isError",
    "structuredContent",
    "_meta",
    # schemas, LangGraph metadata, pydantic-ai events, finish reasons
    "properties",
    "description",
    "ls_integration",
    "langgraph_node",
    "event.name",
    "finish_reason",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "total",
]
VOCABULARY = [
    "assistant",
    "tool",
    "user",
    "model",
    "ai",
    "system",
    "tool_call",
    "tool_calls",
    "function",
    "function_call",
    "tool_use",
    "tool-call",
    "tool-result",
    "tool_result",
    "tool_call_response",
    "function_call_output",
    "ToolCallRequestEvent",
    "gen_ai.choice",
    "gen_ai.tool.message",
    "langgraph",
    "object",
    "text",
    "call_1",
    "call_2",
    "lookup",
    "pay",
    "",
    " ",
    '{"a": 1}',
    "[1, 2]",
    "<REDACTED>",
    "***",
    "{",
    "[",
]

ints = st.integers(-2, 2) | st.sampled_from([2**63, -(2**64) - 1, 10**30])
floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([math.nan, math.inf, -math.inf, 0.5])
json_scalars = st.none() | st.booleans() | ints | floats | st.sampled_from(VOCABULARY) | st.text(max_size=8)
keys = st.sampled_from(TREE_KEYS) | st.text(max_size=6)


def _trees(leaves: st.SearchStrategy[Any], most: int = 40) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=6),
        max_leaves=most,
    )


# (a) JSON-shaped trees: str keys, JSON scalars (NaN and Infinity as Python's json writes them).
json_trees = _trees(json_scalars)
# (b) Native OTLP values: arrays and kvlists decode to lists and str-keyed dicts, bytes included.
native_trees = _trees(json_scalars | st.binary(max_size=6))
# Python reprs (ast.literal_eval's path): tuples, sets, complex numbers, non-str keys.
python_scalars = json_scalars | st.binary(max_size=4) | st.complex_numbers(max_magnitude=3, allow_nan=False)
python_keys = keys | ints | st.tuples(ints, st.sampled_from(VOCABULARY))


def _python_trees(most: int = 40) -> st.SearchStrategy[Any]:
    return st.recursive(
        python_scalars,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.lists(inner, max_size=3).map(tuple)
            | st.frozensets(st.sampled_from(VOCABULARY) | ints, max_size=3).map(set)
            | st.dictionaries(python_keys, inner, max_size=6)
        ),
        max_leaves=most,
    )


python_trees = _python_trees()
# (c) Scalars of the wrong type or shape: numbers and bools where strings go, bytes (some not
# UTF-8), placeholders, truncated JSON.
wrong_scalars = (
    st.none()
    | st.booleans()
    | ints
    | floats
    | st.binary(max_size=8)
    | st.sampled_from([b"\xff\xfe", "", "  ", "<REDACTED>", "***", "{'a': ", "[1,", "{" * 40, "[" * 1100, "nan"])
    | st.sampled_from(VOCABULARY)
    | st.text(max_size=12)
)


def _json(value: Any) -> str:
    return json.dumps(value)


hostile = st.one_of(
    json_trees.map(_json),
    json_trees.map(lambda v: json.dumps(_json(v))),  # encoded twice (MLflow, some exporters)
    native_trees,
    python_trees.map(repr),
    wrong_scalars,
)


# Well-formed payloads of each shape the readers know, to be mutated: a subtree swapped for a
# wrong scalar or an arbitrary tree, a key dropped, a stray key added. Arbitrary trees alone
# rarely reach the nodes a reader only looks at inside a recognised shape.
CALL = {"id": "call_1", "type": "function", "function": {"name": "pay", "arguments": '{"a": 1}'}}
OUTPUTS = [
    [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "call_1", "name": "pay", "arguments": {"a": 1}}],
            "finish_reason": "tool_call",
        }
    ],
    {"choices": [{"message": {"role": "assistant", "tool_calls": [CALL]}, "finish_reason": "tool_calls"}]},
    {
        "generations": [
            [
                {
                    "message": {
                        "kwargs": {
                            "tool_calls": [{"type": "tool_call", "name": "pay", "args": {"a": 1}, "id": "call_1"}]
                        }
                    }
                }
            ]
        ]
    },
    [{"toolCallId": "call_1", "toolName": "pay", "args": {"a": 1}}],
    {"content": [{"toolUse": {"toolUseId": "call_1", "name": "pay", "input": {"a": 1}}}]},
    {"content": [{"type": "tool_use", "id": "call_1", "name": "pay", "input": {"a": 1}}]},
    {"candidates": [{"content": {"parts": [{"functionCall": {"id": "call_1", "name": "pay", "args": {"a": 1}}}]}}]},
    {"message": {"tool_calls": [CALL]}, "finish_reason": "tool_calls"},
]
INPUTS = [
    [
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1", "name": "pay"}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": {"ok": True}}]},
    ],
    {
        "messages": [
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true}'},
        ]
    },
    [
        {
            "role": "tool",
            "content": [{"type": "tool-result", "toolCallId": "call_1", "toolName": "pay", "result": {"ok": True}}],
        }
    ],
    [{"role": "user", "content": [{"toolResult": {"toolUseId": "call_1", "content": [{"text": "ok"}]}}]}],
    [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "ok"}]}],
    {
        "contents": [
            {"role": "user", "parts": [{"functionResponse": {"id": "call_1", "name": "pay", "response": {"ok": True}}}]}
        ]
    },
]
ARGS = [
    {"a": 1, "b": "x", "card": "<REDACTED>"},
    {"args": [], "kwargs": {"a": 1}},
    {"args": [{"a": 1}], "kwargs": {}, "self": "x"},
    {"input_str": "{'a': 1}", "tags": [], "metadata": {}, "inputs": {"a": 1}, "kwargs": {"tool_call_id": "call_1"}},
    {"input": '{"a": 1}'},
]
RESULTS = [
    {"ok": True},
    {"content": [{"type": "text", "text": '{"ok": 1}'}], "isError": False},
    {"content": [], "structuredContent": {"ok": 1}},
    [{"text": '{"ok": 1}'}],
    {"type": "tool", "data": {"tool_call_id": "call_1", "content": '{"ok": 1}'}},
    {"output": {"ok": 1}},
]
SCHEMAS = [{"type": "object", "properties": {"a": {"type": "string"}}}, {"a": {"type": "string", "description": "d"}}]
METADATA = [{"ls_integration": "langgraph", "langgraph_node": "agent"}]
FINISH = [["tool_calls"], "tool_use", '["tool-calls"]']
USAGE = [{"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}, {"input": 1, "output": 2, "total": 3}]
AUTOGEN = [
    {"message": {"type": "ToolCallRequestEvent", "content": [{"id": "call_1", "name": "pay", "arguments": "{}"}]}}
]
PYDANTIC_EVENTS = [
    [
        {"event.name": "gen_ai.choice", "message": {"tool_calls": [CALL]}},
        {"event.name": "gen_ai.tool.message", "id": "call_1", "content": "ok"},
    ],
]

# Leaves a mutation puts in, by how the tree is then written: JSON text, native OTLP values
# (bytes too), or a Python repr (tuples, sets, complex numbers, non-str keys).
_MODES: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {
    # (leaf, tree, extra key)
    "json": (json_scalars, _trees(json_scalars, 8), keys),
    "native": (json_scalars | st.binary(max_size=6), _trees(json_scalars | st.binary(max_size=6), 8), keys),
    "python": (python_scalars, _python_trees(8), python_keys),
}


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every node of a template, as the keys and indices leading to it."""
    out = [path]
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        out += _paths(child, (*path, key))
    return out


def _mutate_at(draw: Callable[..., Any], node: Any, path: tuple[Any, ...], mode: str) -> Any:
    """A copy of ``node`` with the node at ``path`` replaced, dropped, or given a stray key."""
    if path:
        key, rest = path[0], path[1:]
        if isinstance(node, dict):
            copy: Any = dict(node)
        else:
            copy = list(node)
        if not rest and isinstance(copy, dict) and draw(st.integers(0, 5)) == 0:
            del copy[key]
        else:
            copy[key] = _mutate_at(draw, copy[key], rest, mode)
        return copy
    leaf, tree, extra_key = _MODES[mode]
    action = draw(st.sampled_from(["leaf", "tree", "container", "extra"]))
    if action == "leaf":
        return draw(leaf)
    if action == "tree":
        return draw(tree)
    if action == "container":  # the other container, or one around a scalar
        return list(node.values()) if isinstance(node, dict) else {"0": node} if isinstance(node, list) else [node]
    if isinstance(node, dict):
        return {**node, **draw(st.dictionaries(extra_key, leaf | tree, min_size=1, max_size=2))}
    if isinstance(node, list):
        return [*node, *draw(st.lists(leaf | tree, min_size=1, max_size=2))]
    return draw(leaf)


@st.composite
def mutated(draw: Callable[..., Any], templates: list[Any]) -> Any:
    value = draw(st.sampled_from(templates))
    mode = draw(st.sampled_from(["json", "native", "python"]))
    for _ in range(draw(st.integers(1, 2))):
        value = _mutate_at(draw, value, draw(st.sampled_from(_paths(value))), mode)
    if mode == "python":
        return repr(value)
    if mode == "native":
        return value
    return draw(st.sampled_from([_json, lambda v: json.dumps(_json(v))]))(value)


# ---------------------------------------------------------------------------------------------
# Readers: how a span reaches each, the attributes and events each decodes or walks (with the
# payload shapes each holds), and the names, ids and counts read beside them.


def flat(prefix: str, fields: list[str]) -> list[str]:
    """Flattened list keys: ``<prefix><N>.<field>``, ``M`` in a field being a nested index."""
    return [
        f"{prefix}{i}.{f.replace('M', str(j))}" for i in range(2) for f in fields for j in range(2 if "M" in f else 1)
    ]


@dataclass
class Case:
    convention: str
    # Attributes that route the span (values may themselves be odd), one dict of them drawn.
    triggers: st.SearchStrategy[dict[str, Any]]
    # Structured attributes: key -> the well-formed payloads it holds.
    payloads: dict[str, list[Any]]
    # Scalar attributes read beside them (names, ids, counts, levels).
    scalars: list[str] = field(default_factory=list)
    scopes: list[str] = field(default_factory=lambda: [""])
    names: list[str] = field(default_factory=lambda: ["s"])
    # Event names read, and their attributes: structured (key -> payloads) and scalar.
    events: list[str] = field(default_factory=list)
    event_payloads: dict[str, list[Any]] = field(default_factory=dict)
    event_scalars: list[str] = field(default_factory=list)


def triggers(key: str, good: list[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """``{key: <a good value or a wrong scalar>}``."""
    return st.fixed_dictionaries({key: st.sampled_from(good) | wrong_scalars})


GENAI_PAYLOADS = {
    "gen_ai.tool.call.arguments": ARGS,
    "gen_ai.tool.call.result": RESULTS,
    "gen_ai.tool.definitions": [[{"type": "function", "name": "pay", "parameters": SCHEMAS[0]}]],
    "gen_ai.input.messages": INPUTS,
    "gen_ai.output.messages": OUTPUTS,
    "gen_ai.response.finish_reasons": FINISH,
}
GENAI_SCALARS = [
    "gen_ai.tool.name",
    "gen_ai.tool.call.id",
    "gen_ai.agent.name",
    "gen_ai.workflow.name",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.total_tokens",
    "gen_ai.conversation.id",
    "error.type",
]
GENAI_EVENTS = [
    "gen_ai.client.inference.operation.details",
    "gen_ai.choice",
    "gen_ai.tool.message",
    "gen_ai.assistant.message",
    "gen_ai.user.message",
    "gen_ai.system.message",
    "exception",
]
GENAI_EVENT_PAYLOADS = {
    "gen_ai.input.messages": INPUTS,
    "gen_ai.output.messages": OUTPUTS,
    "gen_ai.tool.call.arguments": ARGS,
    "gen_ai.tool.call.result": RESULTS,
    "message": OUTPUTS + RESULTS,  # gen_ai.choice: the model's output, or a Strands tool's result
    "content": INPUTS + ARGS + RESULTS,  # *.message: a message, a Strands tool's input, a result
    "tool_calls": [[CALL]],
    "finish_reason": FINISH,
}
GENAI_EVENT_SCALARS = ["id", "tool_call_id", "index", "role", "exception.message", "exception.type"]
GENAI_EVENT_ARGS: dict[str, Any] = {
    "events": GENAI_EVENTS,
    "event_payloads": GENAI_EVENT_PAYLOADS,
    "event_scalars": GENAI_EVENT_SCALARS,
}
OPERATIONS = ["execute_tool", "invoke_agent", "chat", "text_completion", "generate_content", "embeddings"]
genai_operation = triggers("gen_ai.operation.name", OPERATIONS)

CASES = {
    "genai": Case(
        "otel_genai",
        genai_operation,
        GENAI_PAYLOADS,
        GENAI_SCALARS,
        names=["s", "execute_tool pay", "invoke_agent a", "chat m"],
        **GENAI_EVENT_ARGS,
    ),
    "openinference": Case(
        "openinference",
        triggers("openinference.span.kind", ["TOOL", "LLM", "AGENT", "CHAIN", "tool", "llm"]),
        {
            "tool.parameters": SCHEMAS + ARGS,
            "tool_call.function.arguments": ARGS,
            "input.value": ARGS + INPUTS,
            "output.value": RESULTS + OUTPUTS,
            "metadata": METADATA,
            **dict.fromkeys(flat("llm.output_messages.", ["message.tool_calls.M.tool_call.function.arguments"]), ARGS),
            **dict.fromkeys(flat("llm.input_messages.", ["message.content"]), RESULTS),
        },
        [
            "tool.name",
            "tool_call.function.name",
            "tool_call.id",
            "gen_ai.tool.call.id",
            "agent.name",
            "graph.node.id",
            "llm.model_name",
            "llm.token_count.total",
            "llm.finish_reason",
            *flat(
                "llm.output_messages.",
                ["message.tool_calls.M.tool_call.function.name", "message.tool_calls.M.tool_call.id", "message.role"],
            ),
            *flat("llm.input_messages.", ["message.role", "message.tool_call_id"]),
        ],
        scopes=[
            "",
            "openinference.instrumentation.langchain",
            "openinference.instrumentation.smolagents",
            "openinference.instrumentation.openai_agents",
        ],
        names=["s", "handoff to b", "refunds.run", "agent", "final_answer"],
    ),
    "traceloop": Case(
        "traceloop",
        st.one_of(
            triggers("traceloop.span.kind", ["tool", "agent", "workflow", "task"]),
            triggers("llm.request.type", ["chat", "completion"]),
        ),
        {
            "traceloop.entity.input": ARGS,
            "traceloop.entity.output": RESULTS,
            "gen_ai.output.messages": OUTPUTS,
            "gen_ai.input.messages": INPUTS,
            **dict.fromkeys(flat("gen_ai.completion.", ["tool_calls.M.arguments"]), ARGS),
            **dict.fromkeys(flat("gen_ai.completion.", ["finish_reason"]), FINISH),
            **dict.fromkeys(flat("gen_ai.prompt.", ["content"]), RESULTS),
        },
        [
            "traceloop.entity.name",
            "gen_ai.request.model",
            *flat("gen_ai.completion.", ["tool_calls.M.name", "tool_calls.M.id", "role"]),
            *flat("gen_ai.prompt.", ["role", "tool_call_id"]),
        ],
        names=["s", "pay.tool", "a.agent"],
    ),
    "vercel": Case(
        "vercel_ai",
        triggers(
            "ai.operationId",
            ["ai.toolCall", "ai.generateText.doGenerate", "ai.streamText.doStream", "ai.generateText", "x"],
        ),
        {
            "ai.toolCall.args": ARGS,
            "ai.toolCall.input": ARGS,
            "ai.toolCall.result": RESULTS,
            "ai.toolCall.output": RESULTS,
            "ai.response.toolCalls": OUTPUTS,
            "ai.prompt.messages": INPUTS,
            "ai.response.finishReason": FINISH,
            **GENAI_PAYLOADS,
        },
        [
            "ai.toolCall.name",
            "ai.toolCall.id",
            "ai.model.id",
            "ai.telemetry.functionId",
            "ai.usage.promptTokens",
            *GENAI_SCALARS,
        ],
        scopes=["", "ai"],
    ),
    "pydantic_ai": Case(
        "pydantic_ai",
        st.one_of(triggers("tool_arguments", ["{}", '{"a": 1}']), genai_operation, st.just({})),
        {"tool_arguments": ARGS, "tool_response": RESULTS, "events": PYDANTIC_EVENTS, **GENAI_PAYLOADS},
        ["agent_name", "logfire.msg", *GENAI_SCALARS],
        scopes=["pydantic-ai"],
        names=["running tool", "agent run", "chat m", "execute_tool pay"],
        **GENAI_EVENT_ARGS,
    ),
    "mcp": Case(
        "mcp",
        triggers("mcp.method.name", ["tools/call", "tools/list", "initialize"]),
        {
            "gen_ai.tool.call.arguments": ARGS,
            "mcp.request.params.arguments": ARGS,
            "mcp.request.argument.x": ARGS,
            "mcp.request.argument.y": ARGS,
            "gen_ai.tool.call.result": RESULTS,
            "mcp.tool.result.content": RESULTS,
        },
        ["gen_ai.tool.name", "mcp.tool.name", "gen_ai.tool.call.id", "gen_ai.agent.name", "mcp.tool.result.is_error"],
        names=["s", "tools/call pay"],
    ),
    "strands": Case(
        "strands",
        st.one_of(genai_operation, st.just({})),
        GENAI_PAYLOADS,
        [*GENAI_SCALARS, "tool.status"],
        scopes=["strands.telemetry.tracer", "strands-agents"],
        names=["s", "execute_tool pay", "invoke_agent a", "chat"],
        **GENAI_EVENT_ARGS,
    ),
    "adk": Case(
        "google_adk",
        st.one_of(genai_operation, st.just({})),
        {
            "gcp.vertex.agent.tool_call_args": ARGS,
            "gcp.vertex.agent.tool_response": RESULTS,
            "gcp.vertex.agent.llm_request": INPUTS,
            "gcp.vertex.agent.llm_response": OUTPUTS,
            **GENAI_PAYLOADS,
        },
        ["gcp.vertex.agent.session_id", *GENAI_SCALARS],
        scopes=["gcp.vertex.agent"],
        names=["call_llm", "agent_run [a]", "invoke_agent a", "execute_tool pay", "execute_tool (merged tools)"],
        **GENAI_EVENT_ARGS,
    ),
    "semantic_kernel": Case(
        "otel_genai",
        genai_operation,
        GENAI_PAYLOADS,
        GENAI_SCALARS,
        scopes=["semantic_kernel.functions.kernel_function"],
        names=["execute_tool Handoff-transfer_to_b", "execute_tool Handoff-complete_task", "execute_tool a-b"],
    ),
    "autogen": Case(
        "autogen",
        st.just({}),
        {"message": AUTOGEN},
        ["messaging.operation", "recipient_agent_type"],
        scopes=["autogen SingleThreadedAgentRuntime"],
        names=["process a", "send b"],
    ),
    "langsmith": Case(
        "langsmith",
        triggers("langsmith.span.kind", ["tool", "llm", "chat_model", "chain", "TOOL"]),
        {
            "gen_ai.prompt": ARGS + INPUTS,
            "gen_ai.completion": RESULTS + OUTPUTS,
            "gen_ai.response.finish_reasons": FINISH,
        },
        ["langsmith.trace.name", "gen_ai.request.model", "langsmith.metadata.session_id"],
    ),
    "mlflow": Case(
        "mlflow",
        triggers("mlflow.spanType", ['"TOOL"', '"LLM"', '"CHAT_MODEL"', '"AGENT"', "TOOL", '"CHAIN"']),
        {"mlflow.spanInputs": ARGS + INPUTS, "mlflow.spanOutputs": RESULTS + OUTPUTS, "mlflow.chat.tokenUsage": USAGE},
        ["mlflow.trace.session"],
    ),
    "langfuse": Case(
        "langfuse",
        triggers("langfuse.observation.type", ["tool", "generation", "agent", "span", "chain"]),
        {
            "langfuse.observation.input": ARGS + INPUTS,
            "langfuse.observation.output": RESULTS + OUTPUTS,
            "langfuse.observation.usage_details": USAGE,
        },
        [
            "langfuse.observation.level",
            "langfuse.observation.status_message",
            "langfuse.observation.model.name",
            "langfuse.session.id",
            "gen_ai.request.model",
        ],
    ),
}


# A scalar attribute holds a wrong scalar, or words from the readers' vocabulary.
scalar_values = wrong_scalars | st.sampled_from(["tool", "pay", "ERROR", "error", "call_1", "assistant"])


# Strategies by (payload list, arbitrary), built once: building one costs more than a draw.
_strategies: dict[tuple[int, bool], st.SearchStrategy[Any]] = {}


def _values(templates: list[Any], arbitrary: bool) -> st.SearchStrategy[Any]:
    key = (id(templates), arbitrary)
    if key not in _strategies:
        _strategies[key] = hostile | mutated(templates) if arbitrary else mutated(templates)
    return _strategies[key]


def _attributes(
    draw: Callable[..., Any], payloads: dict[str, list[Any]], scalars: list[str], arbitrary: bool, most: int
) -> dict[str, Any]:
    """Some of the structured keys, each holding a mutated payload of its own shapes (or, when
    ``arbitrary``, possibly an arbitrary tree), and some scalar keys."""
    out: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(sorted(payloads)), unique=True, max_size=most)) if payloads else []:
        out[key] = draw(_values(payloads[key], arbitrary))
    for key in draw(st.lists(st.sampled_from(scalars), unique=True, max_size=3)) if scalars else []:
        out[key] = draw(hostile if arbitrary else scalar_values)
    return out


@st.composite
def spans_for(draw: Callable[..., Any], case: Case, arbitrary: bool, most: int) -> list[SpanRecord]:
    """Up to ``most`` spans routed to the case's reader, in one trace."""
    out = []
    for i in range(draw(st.integers(1, most))):
        attributes = _attributes(draw, case.payloads, case.scalars, arbitrary, 3)
        attributes.update(draw(case.triggers))  # after the others: the span is routed to the case's reader
        events = [
            SpanEvent(name, 1, _attributes(draw, case.event_payloads, case.event_scalars, arbitrary, 2))
            for name in draw(st.lists(st.sampled_from(case.events), max_size=3) if case.events else st.just([]))
        ]
        out.append(
            SpanRecord(
                "t1",
                f"s{i}",
                draw(st.none() | st.sampled_from(["s0", "s1", "s2"])),
                draw(st.sampled_from(case.names)),
                start_ns=draw(st.integers(0, 5)),
                end_ns=draw(st.integers(0, 5)),
                status_code=draw(st.integers(0, 2)),
                attributes=attributes,
                events=events,
                scope_name=draw(st.sampled_from(case.scopes)),
            )
        )
    return out


def _run(case: Case, arbitrary: bool, most: int, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(spans_for(case, arbitrary, most))
    def run(spans: list[SpanRecord]) -> None:
        normalised = [normalise(s) for s in spans]
        # Read by the case's reader; or found by it to name no tool where a tool span must (an
        # empty or non-string tool name): then no convention's, with the problem said.
        assert all(
            n.convention == case.convention or (n.convention == "unrecognised" and n.problems) for n in normalised
        ), [(n.convention, n.problems) for n in normalised]
        check(normalised)

    run()


@pytest.mark.parametrize("reader", sorted(CASES))
def test_well_formed_payloads_with_a_node_gone_wrong_never_make_a_reader_raise(reader: str) -> None:
    _run(CASES[reader], arbitrary=False, most=1, examples=150)


@pytest.mark.parametrize("reader", sorted(CASES))
def test_arbitrary_trees_and_wrong_scalars_never_make_a_reader_raise(reader: str) -> None:
    _run(CASES[reader], arbitrary=True, most=2, examples=80)


# ---------------------------------------------------------------------------------------------
# Every node of every payload a reader knows, one at a time, given each wrong value: a search
# that random draws would take thousands of examples to make.

# (routing attributes, span name): one per kind of span each reader reads differently.
ROUTES: dict[str, list[tuple[dict[str, Any], str]]] = {
    "genai": [({"gen_ai.operation.name": op}, "s") for op in ("execute_tool", "chat", "invoke_agent")],
    "openinference": [
        ({"openinference.span.kind": "TOOL", "tool.name": "pay"}, "s"),
        # Arguments are checked against the tool's schema.
        ({"openinference.span.kind": "TOOL", "tool.name": "pay", "tool.parameters": json.dumps(SCHEMAS[0])}, "s"),
        ({"openinference.span.kind": "TOOL", "tool.name": "pay", "input.value": '{"a": 1, "z": 2}'}, "s"),
        ({"openinference.span.kind": "LLM"}, "s"),
        ({"openinference.span.kind": "AGENT", "tool.name": "pay"}, "s"),
        ({"openinference.span.kind": "TOOL"}, "handoff to b"),
    ],
    "traceloop": [({"traceloop.span.kind": "tool"}, "pay.tool"), ({"llm.request.type": "chat"}, "s")],
    "vercel": [({"ai.operationId": op}, "s") for op in ("ai.toolCall", "ai.generateText.doGenerate")],
    "pydantic_ai": [({}, "running tool"), ({"gen_ai.operation.name": "chat"}, "chat m")],
    "mcp": [({"mcp.method.name": "tools/call"}, "s")],
    "strands": [({"gen_ai.operation.name": op}, "s") for op in ("execute_tool", "chat")],
    "adk": [({"gen_ai.operation.name": "execute_tool"}, "execute_tool pay"), ({}, "call_llm")],
    "semantic_kernel": [({"gen_ai.operation.name": "execute_tool"}, "execute_tool a-b")],
    "autogen": [({}, "process a")],
    "langsmith": [({"langsmith.span.kind": kind}, "s") for kind in ("tool", "llm")],
    "mlflow": [({"mlflow.spanType": kind}, "s") for kind in ('"TOOL"', '"LLM"')],
    "langfuse": [({"langfuse.observation.type": kind}, "s") for kind in ("tool", "generation")],
}
SCOPES = {reader: case.scopes[-1] for reader, case in CASES.items()}
WRONG = [5, 1.5, math.nan, True, False, None, "", "tool", "{", [], {}, [5], {"x": 5}, [[]]]
# Only a Python repr (ast.literal_eval) gives these: a non-str key, a tuple, a set.
WRONG_PYTHON = [(5,), {"x"}, {7: "x", "a": 1}]


def _replaced(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy: Any = dict(node) if isinstance(node, dict) else list(node)
    copy[path[0]] = _replaced(copy[path[0]], path[1:], value)
    return copy


def _dropped(node: Any, path: tuple[Any, ...]) -> Any:
    copy: Any = dict(node) if isinstance(node, dict) else list(node)
    if len(path) == 1:
        del copy[path[0]]
        return copy
    copy[path[0]] = _dropped(copy[path[0]], path[1:])
    return copy


def _variants(template: Any) -> list[Any]:
    """Attribute values: the template with one node replaced by each wrong value, or dropped, or
    given a stray non-str key, as JSON text and as native values (and as a Python repr)."""
    out: list[Any] = []
    for path in _paths(template):
        for value in WRONG:
            variant = _replaced(template, path, value)
            out += [json.dumps(variant), variant]
        for value in WRONG_PYTHON:
            out.append(repr(_replaced(template, path, value)))
        if path:
            out.append(_dropped(template, path))
    for path in _paths(template):
        target = template
        for key in path:
            target = target[key]
        if isinstance(target, dict):
            out.append(repr(_replaced(template, path, {**target, 7: "x"})))
    return out


@pytest.mark.parametrize("reader", sorted(CASES))
def test_every_node_of_every_known_payload_given_each_wrong_value(reader: str) -> None:
    case = CASES[reader]
    for route, name in ROUTES[reader]:
        for key, templates in case.payloads.items():
            for template in templates:
                for value in _variants(template):
                    n = normalise(span({**route, key: value}, name=name, scope=SCOPES[reader]))
                    assert n.convention == case.convention
                    check([n])


# ---------------------------------------------------------------------------------------------
# Shapes that used to raise.

AUTOGEN_SCOPE = "autogen SingleThreadedAgentRuntime"


@pytest.mark.parametrize("content", [5, 1.5, True, "pay", {"name": "pay"}])
def test_autogen_tool_call_request_whose_content_is_no_list_has_no_calls(content: Any) -> None:
    message = json.dumps({"message": {"type": "ToolCallRequestEvent", "content": content}})
    n = normalise(span({"message": message}, name="process a", scope=AUTOGEN_SCOPE))
    assert (n.convention, n.requested_calls) == ("autogen", ())


def test_autogen_calls_with_an_empty_name_are_skipped() -> None:
    calls = [{"id": "c0", "name": "", "arguments": "{}"}, {"id": "c1", "name": "pay", "arguments": '{"a": 1}'}]
    message = json.dumps({"message": {"type": "ToolCallRequestEvent", "content": calls}})
    n = normalise(span({"message": message}, name="process a", scope=AUTOGEN_SCOPE))
    assert [(c.name, c.args, c.tool_call_id) for c in n.requested_calls] == [("pay", {"a": 1}, "c1")]


@pytest.mark.parametrize(
    ("arguments", "parameters", "problem"),
    [
        # Python reprs (ast.literal_eval's path) may have int keys beside str ones.
        ("{7: 'x', 'a': 1}", '{"properties": {"a": {}}}', "[7, 'a'] are not the parameters of pay (['a'])"),
        ('{"a": 1, "z": 2}', "{'properties': {7: {}, 'a': {}}}", "['a', 'z'] are not the parameters of pay ([7, 'a'])"),
    ],
)
def test_openinference_arguments_and_schema_with_mixed_key_types(arguments: str, parameters: str, problem: str) -> None:
    attributes = {"openinference.span.kind": "TOOL", "tool.name": "pay", "input.value": arguments}
    n = normalise(span({**attributes, "tool.parameters": parameters}))
    assert (n.kind, n.args_status, n.problems) == ("tool", "undecodable", (f"input.value: {problem}",))
