"""Label values come from the traffic (agent and tool names): /metrics stays bounded whatever a
sender chooses, in value length, values per label and series per metric."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otel_plumb.export.metrics import OVERFLOW, Metrics


def _samples(metrics: Metrics, name: str) -> list[dict[str, str]]:
    text = generate_latest(metrics.registry).decode()
    return [s.labels for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_long_label_values_are_cut() -> None:
    metrics = Metrics(max_label_values=50, max_label_length=16, max_series=100)
    metrics.tool_calls.labels("agent", "t" * 10_000, "ok").inc()
    (labels,) = _samples(metrics, "plumb_tool_calls_total")
    assert len(labels["tool"]) == 16 and labels["tool"].endswith("…")


def test_series_per_metric_are_capped_and_the_rest_overflow() -> None:
    metrics = Metrics(max_label_values=1_000, max_label_length=64, max_series=20)
    for agent in range(30):
        for tool in range(30):  # 900 combinations, each label under its own cap
            metrics.tool_calls.labels(f"agent-{agent}", f"tool-{tool}", "ok").inc()
    samples = _samples(metrics, "plumb_tool_calls_total")
    assert len(samples) == 21, "20 series, and one overflow series for the rest"
    assert {"agent": OVERFLOW, "tool": OVERFLOW, "outcome": OVERFLOW} in samples
