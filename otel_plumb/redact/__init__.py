"""Redaction: what leaves the processor (annotations, events, the verdict log, Watch, reports,
the campaign store, optionally the forwarded spans) with secrets masked, hashed, cut or dropped.
Checks run on the real values first. Pure: no I/O; the caller passes the HMAC key."""

from otel_plumb.redact.config import PathRule, PatternRule, RedactionConfig, RedactionRules, Truncate
from otel_plumb.redact.patterns import BUILTIN_PATTERNS
from otel_plumb.redact.redactor import Redaction, Redactor, Scrub

# Where tools that have no config file (campaigns) read the HMAC key of ``hash``.
REDACTION_KEY_ENV = "PLUMB_REDACTION_KEY"

__all__ = [
    "BUILTIN_PATTERNS",
    "REDACTION_KEY_ENV",
    "PathRule",
    "PatternRule",
    "Redaction",
    "RedactionConfig",
    "RedactionRules",
    "Redactor",
    "Scrub",
    "Truncate",
]
