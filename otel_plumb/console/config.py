"""The processor config's ``console`` section: the console mounted on the metrics listener."""

from __future__ import annotations

from otel_plumb.configtypes import ConfigModel


class ConsoleConfig(ConfigModel):
    # A link from each trajectory to the tracing backend: a URL with {trace_id}.
    trace_url: str = ""
