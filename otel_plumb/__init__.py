"""otel-plumb: check LLM agent trajectories, built from OpenTelemetry traces, against declared invariants."""

__version__ = "0.1.0"
