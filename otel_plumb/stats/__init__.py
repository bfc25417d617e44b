"""Statistics shared by reports, gates, decision contracts and campaigns. Pure functions."""

from otel_plumb.stats.wilson import Rate, rate, wilson_interval

__all__ = ["Rate", "rate", "wilson_interval"]
