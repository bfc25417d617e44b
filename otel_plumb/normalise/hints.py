"""How to make each instrumentation record tool arguments, for coverage notes."""

from __future__ import annotations

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
