"""Normalise stage: one SpanRecord -> one NormalisedSpan, whatever convention produced it."""

from otel_plumb.normalise.dispatch import normalise

__all__ = ["normalise"]
