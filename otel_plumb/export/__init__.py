"""Export stage: Prometheus metrics, annotated OTLP span export with an on-disk queue, verdict log."""
