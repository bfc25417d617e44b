"""DecGuard-compatible decision contracts: golden gates and metamorphic properties for
probabilistic decision models (choice, noul, score) behind interchangeable backends."""

DECGUARD_COMPAT_VERSION = "0.1.1"
"""The DecGuard release whose contract, report and fuzzing formats this package reproduces."""
