"""How to make each instrumentation record tool arguments, for coverage notes."""

from __future__ import annotations

from typing import Final

CAPTURE_HINTS: dict[str, str] = {
    "otel_genai": (
        "set OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY (or true) and "
        "OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental so arguments land on the spans "
        "(OpenLLMetry instrumentations: TRACELOOP_TRACE_CONTENT=true)"
    ),
    "mcp": (
        "use an MCP instrumentation that records gen_ai.tool.call.arguments (opt-in content capture, e.g. "
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true)"
    ),
    "openinference": (
        "leave OPENINFERENCE_HIDE_INPUTS, OPENINFERENCE_HIDE_OUTPUTS, OPENINFERENCE_HIDE_INPUT_MESSAGES and "
        "OPENINFERENCE_HIDE_OUTPUT_MESSAGES unset or false (TraceConfig(hide_inputs=False, ...))"
    ),
    "traceloop": "set TRACELOOP_TRACE_CONTENT=true (Traceloop.init(trace_content=True))",
    "vercel_ai": "pass experimental_telemetry: { isEnabled: true, recordInputs: true, recordOutputs: true }",
    "pydantic_ai": (
        "instrument with InstrumentationSettings(include_content=True) (the default), e.g. "
        "Agent(..., instrument=True) or logfire.instrument_pydantic_ai()"
    ),
    "langsmith": "set LANGSMITH_OTEL_ENABLED=true and leave LANGSMITH_HIDE_INPUTS / LANGSMITH_HIDE_OUTPUTS unset",
    "strands": (
        "Strands records tool input on gen_ai.tool.message span events; keep events enabled "
        "(OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental records gen_ai.* message attributes)"
    ),
    "google_adk": (
        "set OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY (ADK 2 default telemetry schema); with "
        "ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN=1 or ADK 1, ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS=true "
        "(ADK writes '{}' for arguments when it is false)"
    ),
    "mlflow": "enable tracing with inputs/outputs, e.g. mlflow.<flavor>.autolog() or @mlflow.trace on the tool",
    "langfuse": "do not disable capture_input / capture_output (@observe) and use no mask that drops tool input",
    "unknown": (
        "instrument the agent with an OTel GenAI or OpenInference instrumentation that records tool names and arguments"
    ),
}


# Frameworks and instrumentations, known by the instrumentation scope of their spans (longest
# prefix first where one is a prefix of another): the name coverage and reports give, and the
# switch that makes each record tool arguments.
FRAMEWORKS: Final[tuple[tuple[str, str, str], ...]] = (
    ("openinference.instrumentation.smolagents", "smolagents (OpenInference)",
     "TraceConfig(hide_inputs=False, hide_outputs=False) / leave OPENINFERENCE_HIDE_INPUTS and _OUTPUTS unset"),
    ("openinference.instrumentation.openai_agents", "OpenAI Agents SDK (OpenInference)",
     "RunConfig(trace_include_sensitive_data=True) and leave OPENINFERENCE_HIDE_INPUTS and _OUTPUTS unset"),
    ("openinference.instrumentation.langchain", "LangChain / LangGraph (OpenInference)",
     "leave OPENINFERENCE_HIDE_INPUTS, _OUTPUTS, _INPUT_MESSAGES and _OUTPUT_MESSAGES unset"),
    ("openinference.instrumentation.llama_index", "LlamaIndex (OpenInference)",
     "leave OPENINFERENCE_HIDE_INPUTS and _OUTPUTS unset"),
    ("openinference.instrumentation.crewai", "CrewAI (OpenInference)",
     "leave OPENINFERENCE_HIDE_INPUTS and _OUTPUTS unset"),
    ("openinference.instrumentation.openai", "OpenAI client (OpenInference)",
     "leave OPENINFERENCE_HIDE_INPUTS, _OUTPUTS, _INPUT_MESSAGES and _OUTPUT_MESSAGES unset"),
    ("openinference.instrumentation", "OpenInference", "leave the OPENINFERENCE_HIDE_* variables unset"),
    ("opentelemetry.instrumentation.langchain", "LangChain / LangGraph (OpenLLMetry)", "TRACELOOP_TRACE_CONTENT=true"),
    ("opentelemetry.instrumentation.openai.v1", "OpenAI client (OpenLLMetry)", "TRACELOOP_TRACE_CONTENT=true"),
    ("opentelemetry.instrumentation.openai_v2", "OpenAI client (OTel openai-v2)",
     "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY"),
    ("opentelemetry.util.genai", "OTel GenAI utilities (openai-v2 and others)",
     "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY"),
    ("traceloop.tracer", "Traceloop SDK", "Traceloop.init(trace_content=True)"),
    ("pydantic-ai", "Pydantic AI", "InstrumentationSettings(include_content=True)"),
    ("strands.telemetry.tracer", "Strands Agents", "keep the gen_ai.tool.message span events"),
    ("gcp.vertex.agent", "Google ADK", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY"),
    ("ai", "Vercel AI SDK", "experimental_telemetry: { recordInputs: true, recordOutputs: true }"),
    ("autogen", "AutoGen", "AutoGen's own spans carry no tool arguments; add an OpenAI client instrumentation"),
    ("semantic_kernel", "Semantic Kernel", "SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS_SENSITIVE=true"),
    ("mlflow.tracing", "MLflow", "mlflow autolog or @mlflow.trace with inputs and outputs"),
    ("langfuse", "Langfuse", "do not disable capture_input / capture_output"),
    ("langsmith", "LangSmith", "leave LANGSMITH_HIDE_INPUTS / LANGSMITH_HIDE_OUTPUTS unset"),
    ("mcp", "MCP SDK", "record gen_ai.tool.call.arguments (content capture on)"),
)  # fmt: skip
FRAMEWORK_HINTS: dict[str, str] = {name: hint for _, name, hint in FRAMEWORKS}


def framework_of(scope_name: str) -> str | None:
    """The framework an instrumentation scope belongs to, or None for one not listed."""
    for prefix, name, _ in FRAMEWORKS:
        if scope_name == prefix or scope_name.startswith((prefix + ".", prefix + " ", prefix + "-")):
            return name
    return None
