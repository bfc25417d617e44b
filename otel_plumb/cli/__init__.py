"""The ``otel-plumb`` command line. Each command lives in its own module, imported on use."""
