"""The records that write their own ``__init__`` (``@dataclass(init=False)``, so that mypyc
compiles it) take exactly their fields, in order, with the fields' defaults: made from
positional or keyword values, or from the required ones alone, they equal what the
dataclass-generated ``__init__`` would have made. CI runs this compiled and interpreted."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

import otel_plumb
from otel_plumb.assemble import Finished
from otel_plumb.check.checks import Outcome
from otel_plumb.check.early import _Tool
from otel_plumb.model import Decided, NormalisedSpan, RequestedCall, Step, Trajectory, Verdict
from otel_plumb.normalise import Decoded

RECORDS = [NormalisedSpan, RequestedCall, Step, Verdict, Outcome, Decoded, Trajectory, Finished, Decided, _Tool]


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


class _Value:
    """A distinct value for a field typed ``Any``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


STRINGS = ("str", "Literal", "StepKind", "CaptureStatus", "VerdictValue", "Severity", "TrajectoryStatus",
           "DecisionKind")


def _value(name: str, annotation: str, n: int, default: Any = None) -> Any:
    """A value of the field's type (the compiled records check types) unlike any other field's,
    so that a parameter wired to the wrong attribute shows."""
    kind = annotation.split("[")[0].split(" ")[0]
    if kind in STRINGS:
        return f"{name}-{n}"
    if kind == "int":
        return 1000 + n
    if kind == "float":
        return 1000.5 + n
    if kind == "list":
        return [f"{name}-{n}"]
    if kind == "bool":
        return default is not True  # unlike the default
    if kind == "tuple":
        return (f"{name}-{n}",)
    if kind in ("dict", "Mapping"):
        return {name: n}
    if kind == "Step":
        return Step(n, "tool", "t", "s", None, "tr", 0, 1, "c")
    if kind == "Trajectory":
        return Trajectory(f"{name}-{n}", [], [])
    assert kind == "Any", f"no test value for {name}: {annotation}"
    return _Value(name)


def _annotations(cls: type) -> dict[str, str]:
    """The fields' annotations as written in the source (compiled, ``Field.type`` is ``type``
    for all but plain classes)."""
    source = Path(otel_plumb.__file__).parent.joinpath(*cls.__module__.split(".")[1:]).with_suffix(".py")
    tree = ast.parse(source.read_text())
    body = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__).body
    return {n.target.id: ast.unparse(n.annotation) for n in body if isinstance(n, ast.AnnAssign)
            and isinstance(n.target, ast.Name)}  # fmt: skip


def _values(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> list[Any]:
    written = _annotations(cls)
    return [_value(f.name, written[f.name], n, f.default) for n, f in enumerate(fields)]


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_own_init_takes_the_fields_in_order(cls: type) -> None:
    fields = dataclasses.fields(cls)
    values = _values(cls, fields)
    by_position = cls(*values)
    by_keyword = cls(**{f.name: v for f, v in zip(fields, values, strict=True)})
    for f, v in zip(fields, values, strict=True):
        assert getattr(by_position, f.name) == v, f.name
        assert getattr(by_keyword, f.name) == v, f.name
    with pytest.raises(TypeError):
        cls(*values, values[0])


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_own_init_has_the_fields_defaults(cls: type) -> None:
    fields = dataclasses.fields(cls)
    required = [f for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    values = _values(cls, tuple(required))
    made = cls(*values)
    for f in fields[len(required):]:
        assert getattr(made, f.name) == _default(f), f.name
    if required:
        with pytest.raises(TypeError):
            cls(*values[:-1])


def test_default_containers_are_not_shared() -> None:
    a = NormalisedSpan("t", "a", None, "x", 0, 1, "other", "x", "none")
    b = NormalisedSpan("t", "b", None, "x", 0, 1, "other", "x", "none")
    a.attributes["k"] = 1
    assert b.attributes == {}
    assert dataclasses.replace(a, span_id="c").attributes == {"k": 1}
    t, u = Trajectory("a", [], []), Trajectory("b", [], [])
    t.attributes["k"], t.problems = 1, ["p"]
    assert (u.attributes, u.problems) == ({}, [])
    f, g = (Finished(k, [], [], True, None, 0.0, 0.0) for k in "fg")
    f.trace_ids.append("t")
    assert g.trace_ids == []
