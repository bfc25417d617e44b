"""Policy and context files through the one YAML loader (``otel_plumb.yamlfile``), keeping
the line of every key and list item so errors can name it."""

from __future__ import annotations

import os
from collections.abc import Sequence

from otel_plumb import yamlfile
from otel_plumb.check.errors import PolicyError
from otel_plumb.yamlfile import plain_value

__all__ = ["LocatedYaml", "load_located", "plain_value", "read_located"]


class LocatedYaml(yamlfile.Document):
    """A YAML document as plain data, with the 1-based line of each key path."""

    __slots__ = ()

    def error(self, loc: Sequence[object], message: str) -> PolicyError:
        return PolicyError(self.path, self.line_of(loc), message)


def load_located(path: str, text: str) -> LocatedYaml:
    """Parse a policy's text; an empty document is an error."""
    try:
        doc = yamlfile.parse(text, path)
    except yamlfile.YamlError as exc:
        raise PolicyError(path, exc.line, exc.message) from None
    if doc.data is None:
        raise PolicyError(path, 1, "the file is empty")
    return LocatedYaml(doc.path, doc.data, doc.lines)


def read_located(path: str | os.PathLike[str], what: str = "policy") -> LocatedYaml:
    """Read and parse a file (at most ``yamlfile.MAX_BYTES``); ``what`` names it in errors."""
    name = os.fspath(path)
    try:
        text = yamlfile.read_text(name)
    except yamlfile.YamlError as exc:
        raise PolicyError(name, exc.line, f"cannot read {what}: {exc.message}") from None
    return load_located(name, text)
