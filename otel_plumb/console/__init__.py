"""The console: a read-only API and browser pages over a trajectory store (``otel-plumb console``)."""

from otel_plumb.console.app import console_app

__all__ = ["console_app"]
