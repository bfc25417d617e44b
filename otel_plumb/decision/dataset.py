"""Golden datasets: JSONL (one case a line) or JSON (a list). Every case is validated;
nothing is skipped silently. Cases without ``id`` get ``case-<position>``."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator

from otel_plumb.decision.contract import DecisionSpec
from otel_plumb.decision.errors import DatasetError
from otel_plumb.decision.model import Case, DecisionInput
from otel_plumb.decision.validation import Strict, format_errors, unique_keys


class CaseRow(Strict):
    id: str = Field(min_length=1)
    input: DecisionInput
    expected: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("expected", mode="before")
    @classmethod
    def _number_label(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value


@dataclass(frozen=True)
class Dataset:
    path: Path
    hash: str
    cases: tuple[Case, ...]

    @property
    def n_labeled(self) -> int:
        return sum(1 for case in self.cases if case.expected is not None)


def _items(path: Path, text: str) -> list[tuple[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        items = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    items.append((f"line {lineno}", json.loads(line, object_pairs_hook=unique_keys)))
                except ValueError as exc:
                    raise DatasetError(f"{path}: line {lineno}: invalid JSON: {exc}") from exc
        return items
    if suffix == ".json":
        try:
            data = json.loads(text, object_pairs_hook=unique_keys)
        except ValueError as exc:
            raise DatasetError(f"{path}: invalid JSON: {exc}") from exc
        if not isinstance(data, list):
            raise DatasetError(f"{path}: a JSON dataset must be a list of cases")
        return [(f"case {index}", item) for index, item in enumerate(data, start=1)]
    raise DatasetError(f"{path}: unsupported dataset format (use .jsonl or .json)")


def read_data(path: Path, what: str) -> tuple[bytes, str]:
    """A data file's bytes (for its hash) and text; unreadable or non-UTF-8 files are
    DatasetErrors naming ``what``."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc
    try:
        return raw, raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: {what} is not valid UTF-8") from exc


def load_dataset(path: str | Path, spec: DecisionSpec) -> Dataset:
    path = Path(path)
    raw, text = read_data(path, "dataset")
    cases: list[Case] = []
    seen: dict[str, str] = {}
    for position, (location, item) in enumerate(_items(path, text), start=1):
        if isinstance(item, dict) and "id" not in item:
            item = {"id": f"case-{position}", **item}
        try:
            row = CaseRow.model_validate(item)
        except ValidationError as exc:
            raise DatasetError(f"{path}: {location}: invalid case:\n{format_errors(exc)}") from exc
        if row.expected is not None and row.expected not in spec.labels:
            raise DatasetError(
                f"{path}: {location}: expected {row.expected!r} is not one of the contract labels {list(spec.labels)}"
            )
        if row.id in seen:
            raise DatasetError(f"{path}: {location}: duplicate case id {row.id!r} (first at {seen[row.id]})")
        seen[row.id] = location
        cases.append(Case(row.id, row.input, row.expected, row.metadata))
    if not cases:
        raise DatasetError(f"{path}: dataset contains no cases")
    return Dataset(path, "sha256:" + hashlib.sha256(raw).hexdigest(), tuple(cases))
