"""Read a YAML file keeping the line of every key and list item, so errors can name it."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import yaml

from otel_plumb.check.errors import PolicyError

Path = tuple[str | int, ...]


class LocatedYaml:
    """A YAML document as plain data, with the 1-based line of each key path."""

    def __init__(self, path: str, data: Any, lines: dict[Path, int]) -> None:
        self.path = path
        self.data = data
        self.lines = lines

    def line_of(self, loc: Sequence[object]) -> int | None:
        """The line of the deepest known prefix of ``loc``. Segments that are not keys of the
        document (pydantic's union member names such as ``list[str]``) are skipped."""
        best = self.lines.get(())
        prefix: Path = ()
        for seg in loc:
            if not isinstance(seg, str | int):
                continue
            candidate = (*prefix, seg)
            if candidate in self.lines:
                prefix = candidate
                best = self.lines[candidate]
        return best

    def error(self, loc: Sequence[object], message: str) -> PolicyError:
        return PolicyError(self.path, self.line_of(loc), message)


def load_located(path: str, text: str) -> LocatedYaml:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise PolicyError(path, line, f"not valid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise PolicyError(path, None, f"not valid YAML: {exc}") from None
    if node is None:
        raise PolicyError(path, 1, "the file is empty")
    lines: dict[Path, int] = {(): node.start_mark.line + 1}
    data = _construct(path, node, (), lines, yaml.SafeLoader(""))
    return LocatedYaml(path, data, lines)


def _construct(path: str, node: yaml.Node, at: Path, lines: dict[Path, int], scalars: yaml.SafeLoader) -> Any:
    if isinstance(node, yaml.MappingNode):
        written: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = _construct(path, key_node, at, lines, scalars)
            if not isinstance(key, str | int | float | bool) and key is not None:
                raise PolicyError(path, key_node.start_mark.line + 1, "a key must be a plain value")
            if key in written:
                raise PolicyError(path, key_node.start_mark.line + 1, f"duplicate key {key!r}")
            written.add(key)
        # YAML merge keys (<<: *anchor) as the SafeLoader reads them: merged first, own keys win.
        scalars.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _construct(path, key_node, at, lines, scalars)
            seg = key if isinstance(key, str | int) else str(key)
            lines[(*at, seg)] = key_node.start_mark.line + 1
            out[key] = _construct(path, value_node, (*at, seg), lines, scalars)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            lines[(*at, i)] = item.start_mark.line + 1
            items.append(_construct(path, item, (*at, i), lines, scalars))
        return items
    # Scalars resolve by the SafeLoader's own rules (ints, floats, booleans, null), except that
    # dates stay text as they would in JSON, the form trace values arrive in.
    return plain_value(scalars.construct_object(node, deep=True))


def plain_value(value: Any) -> Any:
    """YAML values as JSON would have them: dates and times become ISO 8601 text."""
    if isinstance(value, datetime.date | datetime.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_value(v) for v in value]
    return value
