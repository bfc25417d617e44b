"""Backends: built-in providers first (they cannot be shadowed), then plugins registered under
the ``otel_plumb.decision_backends`` entry-point group. Contracts never name import paths."""

from __future__ import annotations

from importlib.metadata import entry_points

from otel_plumb.decision.backends.base import Backend, BackendInfo, Health
from otel_plumb.decision.backends.decguard_plugins import ENTRY_POINT_GROUP as DECGUARD_GROUP
from otel_plumb.decision.backends.decguard_plugins import DecGuardPlugin
from otel_plumb.decision.backends.http import HttpBackend
from otel_plumb.decision.backends.mock import MockBackend
from otel_plumb.decision.backends.openai import OpenAIBackend
from otel_plumb.decision.backends.python import CallableBackend
from otel_plumb.decision.backends.systemone import SystemOneBackend
from otel_plumb.decision.contract import BackendConfig, DecisionSpec
from otel_plumb.decision.errors import ContractError

ENTRY_POINT_GROUP = "otel_plumb.decision_backends"
BUILTIN: dict[str, type[Backend]] = {b.provider: b for b in (MockBackend, HttpBackend, SystemOneBackend, OpenAIBackend)}

__all__ = ["Backend", "BackendInfo", "CallableBackend", "Health", "create_backend"]


def available() -> list[str]:
    plugins = {ep.name for group in (ENTRY_POINT_GROUP, DECGUARD_GROUP) for ep in entry_points(group=group)}
    return sorted(set(BUILTIN) | plugins)


def backend_class(provider: str) -> type[Backend]:
    if provider in BUILTIN:
        return BUILTIN[provider]
    matches = tuple(entry_points(group=ENTRY_POINT_GROUP, name=provider))
    if not matches:
        return _decguard_plugin(provider)
    try:
        loaded = matches[0].load()
    except Exception as exc:
        raise ContractError(f"cannot load backend provider {provider!r} from {matches[0].value}: {exc}") from exc
    if not (isinstance(loaded, type) and issubclass(loaded, Backend)):
        raise ContractError(f"backend provider {provider!r} ({matches[0].value}) is not a decision Backend")
    return loaded


def _decguard_plugin(provider: str) -> type[Backend]:
    """A provider registered for DecGuard (``decguard.backends``), adapted."""
    matches = tuple(entry_points(group=DECGUARD_GROUP, name=provider))
    if not matches:
        raise ContractError(f"unknown backend provider {provider!r}; available: {', '.join(available())}")
    try:
        loaded = matches[0].load()
    except Exception as exc:
        raise ContractError(f"cannot load backend provider {provider!r} from {matches[0].value}: {exc}") from exc
    try:
        from decguard.backends.base import DecisionBackend
    except ImportError as exc:
        raise ContractError(f"backend provider {provider!r} is a DecGuard plugin; install decguard") from exc
    if not (isinstance(loaded, type) and issubclass(loaded, DecisionBackend)):
        raise ContractError(f"backend provider {provider!r} ({matches[0].value}) is not a DecGuard DecisionBackend")
    return DecGuardPlugin.wrap(provider, loaded)


def create_backend(config: BackendConfig, *, decision: DecisionSpec, name: str = "default") -> Backend:
    """Build a backend from contract configuration; no network I/O."""
    return backend_class(config.provider).from_config(config, name=name, decision=decision)
