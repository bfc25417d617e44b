"""The live processor (``otel-plumb run``): config, wiring and lifecycle."""

from otel_plumb.processor.config import ConfigError, ProcessorConfig, load_config
from otel_plumb.processor.core import Processor

__all__ = ["ConfigError", "Processor", "ProcessorConfig", "load_config"]
