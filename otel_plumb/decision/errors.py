"""Errors. ``DecisionError`` and its subclasses mean the run could not be done (exit 2);
``BackendError`` subclasses are per-case failures recorded in the report with their ``kind``."""

from __future__ import annotations

from typing import ClassVar


class DecisionError(Exception):
    """A contract, dataset, report or run could not be used."""


class ContractError(DecisionError):
    pass


class DatasetError(DecisionError):
    pass


class ReportError(DecisionError):
    pass


class BackendError(Exception):
    """One request failed; recorded as an errored case, never aborting the run."""

    kind: ClassVar[str] = "backend_error"


class BackendTimeout(BackendError):
    kind: ClassVar[str] = "timeout"


class BackendUnavailable(BackendError):
    kind: ClassVar[str] = "unavailable"


class InvalidResponse(BackendError):
    """The backend answered, but not with a valid probability distribution."""

    kind: ClassVar[str] = "invalid_response"


class ParaphraseError(BackendError):
    kind: ClassVar[str] = "paraphrase_error"
