"""The trajectory store behind the console: decided records in SQLite (``db``), written off the
processor's hot path (``writer``), configured by the ``store`` section (``config``)."""

from otel_plumb.store.config import StoreConfig
from otel_plumb.store.db import MAX_PAGE, PAGE, Filters, QueryError, TrajectoryStore
from otel_plumb.store.writer import StoreWriter

__all__ = ["MAX_PAGE", "PAGE", "Filters", "QueryError", "StoreConfig", "StoreWriter", "TrajectoryStore"]
