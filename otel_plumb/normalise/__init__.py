"""Normalise stage: one SpanRecord -> one NormalisedSpan, whatever convention produced it."""

from otel_plumb.model.placeholders import is_placeholder
from otel_plumb.normalise.dispatch import normalise
from otel_plumb.normalise.hints import CAPTURE_HINTS
from otel_plumb.normalise.values import Decoded, decode

__all__ = ["CAPTURE_HINTS", "Decoded", "decode", "is_placeholder", "normalise"]
