"""Live verdict fan-out: the processor publishes every decided trajectory record; the
gRPC ``VerdictService.Watch`` stream and in-process subscribers (campaigns) follow it."""

from otel_plumb.watch.hub import Subscription, VerdictHub

__all__ = ["Subscription", "VerdictHub"]
