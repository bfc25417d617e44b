"""Generated from proto/otel_plumb/v1 by scripts/gen_proto.py; do not edit."""
