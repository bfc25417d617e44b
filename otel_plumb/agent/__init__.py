"""Helpers for an agent under a campaign (protocol ``otel-plumb.agent/1``).

- :func:`in_trial` (a context manager) and :func:`trial_context` read the W3C ``traceparent``
  and ``baggage`` the harness sent (HTTP headers, the ``TRACEPARENT``/``BAGGAGE`` environment
  of a command, or the request dict of a Python callable) into an OpenTelemetry context: run
  the agent inside ``with in_trial(...)``.
- :func:`setup_tracing` builds a tracer provider that exports OTLP (gRPC or HTTP, as the
  request's ``otlp_protocol`` says) to the campaign's receiver and copies ``plumb.*`` baggage
  onto every span (``BaggageSpanProcessor`` from ``opentelemetry-processor-baggage``), so
  each trajectory names its case, variant, trial, arm.
- :class:`Faults` honours the request's injected tool faults: a wrapped tool raises the
  given error for its first ``times`` calls.
"""

from otel_plumb.agent.context import PLUMB_PREFIX, in_trial, setup_tracing, trial_context
from otel_plumb.agent.faults import Faults, InjectedFault

__all__ = ["PLUMB_PREFIX", "Faults", "InjectedFault", "in_trial", "setup_tracing", "trial_context"]
