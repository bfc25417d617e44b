"""The one YAML loader of every file kind: processor configs, policies and their context files,
campaign files, decision contracts.

The same rules everywhere:

- the file is at most ``MAX_BYTES`` (10 MiB) of UTF-8;
- plain data only (the YAML safe schema: mappings, lists, text, numbers, booleans, null); a key is
  a plain value, and a key written twice in one mapping is an error;
- merge keys (``<<: *anchor``, or a list of anchors) merge first, keys written in the mapping win;
- aliases are expanded, but they may add at most ``MAX_ALIAS_NODES`` values beyond those written
  in the file (an "alias bomb" such as billion laughs is refused at once, not built);
- nesting deeper than ``MAX_DEPTH`` is refused;
- dates and timestamps become ISO 8601 text, as they would be in JSON;
- ``${env:NAME}`` (``${env:NAME:-default}``, ``$${`` for a literal ``${``) is expanded in values,
  never in keys, when the caller asks for it (the processor config does).

Every error is a ``YamlError`` naming the file and, when known, the line. ``Document.lines`` holds
the line of every key path, so validation errors found later can name the line too.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Sequence
from typing import Any

import yaml

MAX_BYTES = 10 * 1024 * 1024
MAX_ALIAS_NODES = 10_000
MAX_DEPTH = 200

Path = tuple[str | int, ...]

_ENV = re.compile(r"\$(\$?)\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"


class YamlError(ValueError):
    """A file that cannot be read as data: ``str()`` is ``path:line: message``."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path, self.line, self.message = path, line, message
        super().__init__(f"{path}:{line}: {message}" if line is not None else f"{path}: {message}")


class Document:
    """A YAML document as plain data, with the 1-based line of each key path and list item."""

    __slots__ = ("data", "lines", "path")

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
            if not isinstance(seg, (str, int)):
                continue
            candidate = (*prefix, seg)
            if candidate in self.lines:
                prefix = candidate
                best = self.lines[candidate]
        return best


def read_text(path: str | os.PathLike[str], max_bytes: int = MAX_BYTES) -> str:
    """The file's text; larger than ``max_bytes``, unreadable or not UTF-8 is a ``YamlError``."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            # A file that says it is too large is not read; one that grows while read (or a pipe,
            # of size 0) stops at the limit.
            raw = b"" if size > max_bytes else f.read((size or max_bytes) + 1)
            if 0 < size < len(raw) <= max_bytes:
                raw += f.read(max_bytes + 1 - len(raw))
    except OSError as exc:
        raise YamlError(name, None, f"cannot read: {exc.strerror or exc}") from None
    if size > max_bytes or len(raw) > max_bytes:
        raise YamlError(name, None, f"the file is larger than {_size(max_bytes)}, the limit for this kind of file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise YamlError(name, line, "not valid UTF-8") from None


def load(path: str | os.PathLike[str], *, env: bool = False, max_bytes: int = MAX_BYTES) -> Document:
    """Read and parse one file (see the module's rules)."""
    name = os.fspath(path)
    return parse(read_text(name, max_bytes), name, env=env, max_bytes=max_bytes)


def parse(text: str, path: str = "<yaml>", *, env: bool = False, max_bytes: int = MAX_BYTES) -> Document:
    """Parse ``text``; an empty document has ``data`` None."""
    if len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise YamlError(path, None, f"the document is larger than {_size(max_bytes)}")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise YamlError(path, line, f"not valid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise YamlError(path, None, f"not valid YAML: {exc}") from None
    except RecursionError:
        raise YamlError(path, None, f"nested too deeply (at most {MAX_DEPTH} levels)") from None
    if node is None:
        return Document(path, None, {})
    builder = _Builder(path, env, _distinct_nodes(node) + MAX_ALIAS_NODES)
    lines: dict[Path, int] = {(): node.start_mark.line + 1}
    try:
        data = builder.build(node, (), lines, 0)
    except RecursionError:
        raise YamlError(path, None, f"nested too deeply (at most {MAX_DEPTH} levels)") from None
    return Document(path, data, lines)


def expand_env(value: str, path: str, line: int | None) -> str:
    """Replace ``${env:NAME}`` (Collector syntax). An unset variable without a default is an error."""

    def repl(m: re.Match[str]) -> str:
        if m.group(1):  # $${...} is a literal ${...}
            return m.group(0)[1:]
        name, default = m.group(2), m.group(3)
        found = os.environ.get(name)
        if found is None:
            if default is not None:
                return default
            raise YamlError(path, line, f"environment variable {name} is not set (referenced as {m.group(0)})")
        return found

    return _ENV.sub(repl, value)


def plain_value(value: Any) -> Any:
    """Values as JSON would have them: dates and times become ISO 8601 text."""
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_value(v) for v in value]
    return value


def _size(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB" if n % (1024 * 1024) == 0 else f"{n:,} bytes"


def _distinct_nodes(root: yaml.Node) -> int:
    """How many nodes the file writes (an alias is the node it names, counted once)."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                todo.append(k)
                todo.append(v)
        elif isinstance(n, yaml.SequenceNode):
            todo.extend(n.value)
    return len(seen)


class _Builder:
    def __init__(self, path: str, env: bool, max_nodes: int) -> None:
        self.path = path
        self.env = env
        self.max_nodes = max_nodes
        self.built = 0
        self.scalars = yaml.SafeLoader("")  # only its scalar rules are used

    def error(self, node: yaml.Node, message: str) -> YamlError:
        return YamlError(self.path, node.start_mark.line + 1, message)

    def count(self, node: yaml.Node) -> None:
        self.charge(node, 1)

    def charge(self, node: yaml.Node, n: int) -> None:
        self.built += n
        if self.built > self.max_nodes:
            raise self.error(
                node, f"aliases expand to more than {MAX_ALIAS_NODES:,} values beyond those written in the file "
                "(an alias bomb?); write the values out or use fewer aliases",
            )  # fmt: skip

    def build(self, node: yaml.Node, at: Path, lines: dict[Path, int], depth: int) -> Any:
        self.count(node)
        if depth > MAX_DEPTH:
            raise self.error(node, f"nested too deeply (at most {MAX_DEPTH} levels)")
        if isinstance(node, yaml.MappingNode):
            if node.tag != _MAP:
                raise self.error(node, f"unsupported tag {node.tag!r}: only plain mappings, lists and values")
            out: dict[Any, Any] = {}
            for key_node, value_node in self.pairs(node, 0):
                key = self.key(key_node)
                seg = key if isinstance(key, (str, int)) else str(key)
                lines[(*at, seg)] = key_node.start_mark.line + 1
                out[key] = self.build(value_node, (*at, seg), lines, depth + 1)
            return out
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ:
                raise self.error(node, f"unsupported tag {node.tag!r}: only plain mappings, lists and values")
            items = []
            for i, item in enumerate(node.value):
                lines[(*at, i)] = item.start_mark.line + 1
                items.append(self.build(item, (*at, i), lines, depth + 1))
            return items
        assert isinstance(node, yaml.ScalarNode)
        if self.env and node.tag == _STR and "${" in node.value:
            return expand_env(node.value, self.path, node.start_mark.line + 1)
        return self.scalar(node)

    def scalar(self, node: yaml.Node) -> Any:
        try:
            return plain_value(self.scalars.construct_object(node, deep=True))
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            raise self.error(node, f"not valid YAML: {problem}") from None

    def key(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, "a key must be a plain value")
        key = self.scalar(node)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise self.error(node, "a key must be a plain value")
        return key

    def pairs(self, node: yaml.MappingNode, depth: int) -> list[tuple[yaml.Node, yaml.Node]]:
        """The mapping's entries with merge keys applied: merged entries first (from a list of
        mappings, the first wins), then the mapping's own, so its own keys win. A key written
        twice among the mapping's own entries is an error."""
        if depth > MAX_DEPTH:
            raise self.error(node, f"merge keys nested too deeply (at most {MAX_DEPTH} levels)")
        merged: list[tuple[yaml.Node, yaml.Node]] = []
        own: list[tuple[yaml.Node, yaml.Node]] = []
        written: set[Any] = set()
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                if isinstance(value_node, yaml.MappingNode):
                    sources = [value_node]
                elif isinstance(value_node, yaml.SequenceNode) and all(
                    isinstance(v, yaml.MappingNode) for v in value_node.value
                ):
                    sources = list(value_node.value)
                else:
                    raise self.error(key_node, "a merge key (<<) takes a mapping or a list of mappings")
                for source in reversed(sources):
                    entries = self.pairs(source, depth + 1)
                    self.charge(key_node, len(entries))
                    merged.extend(entries)
                continue
            key = self.key(key_node)
            if key in written:
                raise self.error(key_node, f"duplicate key {key!r}")
            written.add(key)
            own.append((key_node, value_node))
        return merged + own
