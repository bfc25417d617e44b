"""Receive stage: everything that turns bytes (network requests, trace files) into SpanRecords."""
