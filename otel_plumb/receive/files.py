"""Trace files -> SpanRecords, streamed, with the format detected by content (not by name).

Accepted, in any mix:

- OTLP/JSON ``ExportTraceServiceRequest``: one document (pretty-printed or not), or JSON lines as
  the Collector's file exporter writes them (one batch per line);
- OTLP protobuf: the file exporter's records (4-byte big-endian length + request, each
  optionally zstd-compressed; with ``format: json`` and compression the records hold JSON), or
  one bare serialized request;
- Jaeger JSON: ``{"data": [trace, ...]}`` from the UI or query API (also JSON lines of those);
- any of these inside a ``.gz`` or ``.zst`` file (recognised by magic bytes).

A malformed line or record is yielded as a ``ReadError`` (file, line or byte offset, message)
and reading goes on with the next one. Nothing is held beyond the current line, record or
(for a single JSON document, parsed incrementally with ijson) the current trace.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, cast

import ijson
import zstandard
from google.protobuf.message import DecodeError

from otel_plumb.model.span import SpanRecord
from otel_plumb.model.text import parse_json, repair_lone_surrogates
from otel_plumb.receive.jaeger import is_jaeger_trace, trace_records
from otel_plumb.receive.otlp import decode_request
from otel_plumb.receive.otlp_json_spans import request_spans

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# A line longer than this is read as a streamed JSON document instead of being loaded whole.
LONG_LINE = 16 << 20
# A length prefix above this is corruption, not a record (the Collector's batches are far smaller).
MAX_RECORD = 512 << 20
_JSON_START = (b"{", b"[")
_BLANK = b" \t\r\n"
_BOM = b"\xef\xbb\xbf"
# Signals other than traces that a Collector file may carry: skipped without complaint.
_OTHER_SIGNALS = ("resourceLogs", "resource_logs", "resourceMetrics", "resource_metrics", "resourceProfiles")
# ijson prefixes of the items streamed out of one JSON document: OTLP ResourceSpans (Tempo
# calls them batches), Jaeger traces, Jaeger's v3 API ({"result": {"resourceSpans": ...}}),
# Tempo's v2 API ({"trace": {...}}), and a top-level array of any.
_OTLP_ITEMS = tuple(
    f"{wrapper}{key}.item"
    for wrapper in ("", "result.", "trace.")
    for key in ("resourceSpans", "resource_spans", "batches")
)
_ITEM_KINDS: dict[str, str] = {
    **{p: "otlp" for p in _OTLP_ITEMS},
    **{f"item.{p}": "otlp" for p in _OTLP_ITEMS},
    "data.item": "jaeger",
    "item.data.item": "jaeger",
    "item": "any",
}
_JAEGER_TRACE_KEYS = frozenset({"traceID", "spans", "processes", "warnings"})
_STARTS = ("start_map", "start_array")
_ENDS = ("end_map", "end_array")
# Deeper nesting than any trace needs is refused rather than built.
MAX_DEPTH = 512


@dataclass(frozen=True, slots=True)
class ReadError:
    """Input that could not be read: which file, where (line or byte offset), and why."""

    file: str
    message: str
    line: int | None = None
    offset: int | None = None
    # The trace the unreadable data belonged to, when the reader could still tell.
    trace_id: str | None = None

    @property
    def location(self) -> str:
        if self.line is not None:
            return f"{self.file}:{self.line}"
        if self.offset is not None:
            return f"{self.file}@{self.offset}"
        return self.file

    def record(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "offset": self.offset, "message": self.message}

    def __str__(self) -> str:
        return f"{self.location}: {self.message}"


Item = SpanRecord | ReadError


def read_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Item]:
    for path in paths:
        yield from read_spans(path)


def read_spans(path: str | os.PathLike[str]) -> Iterator[Item]:
    """Every span of one trace file, and a ReadError for each part that could not be read."""
    for batch in read_batches(path):
        yield from batch


def read_batches(path: str | os.PathLike[str]) -> Iterator[list[Item]]:
    """``read_spans`` a line or record at a time: fewer generator hops on the hot path."""
    name = os.fspath(path)
    try:
        f = open(name, "rb")  # noqa: SIM115 - closed by the with below, after the generator ends
    except OSError as exc:
        yield [ReadError(name, f"cannot open: {exc.strerror or exc}")]
        return
    with f:
        try:
            yield from _read_stream(name, f, compressed=False)
        except (OSError, EOFError, zlib.error, zstandard.ZstdError) as exc:
            # A compressed file cut short or corrupt: what came before it was read.
            yield [ReadError(name, f"unreadable past this point: {exc}")]


def _read_stream(name: str, stream: IO[bytes], *, compressed: bool) -> Iterator[list[Item]]:
    head = _peek(stream, 256)
    if not head:
        return
    if head.startswith(GZIP_MAGIC) and not compressed:
        with gzip.GzipFile(fileobj=stream, mode="rb") as inner:  # buffered, with peek
            yield from _read_stream(name, cast(IO[bytes], inner), compressed=True)
        return
    if head.startswith(ZSTD_MAGIC) and not compressed:
        reader = zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True)
        yield from _read_stream(name, io.BufferedReader(reader, 1 << 16), compressed=True)
        return
    if _looks_like_json(head):
        yield from _read_json(name, stream)
    else:
        yield from _read_protobuf(name, stream)


def _looks_like_json(head: bytes) -> bool:
    """JSON text starts with ``{`` or ``[`` after blanks and has no control bytes but blanks.
    The second test matters: a serialized request starts with ``0a`` (a newline) and a length
    that may be ``7b`` (``{``), but its tags and lengths soon give bytes below ``20``."""
    start = head.removeprefix(_BOM).lstrip(_BLANK)
    if start and start[:1] not in _JSON_START:
        return False
    return not any(b < 0x20 and b not in _BLANK for b in head)


def _peek(stream: IO[bytes], n: int) -> bytes:
    peek = getattr(stream, "peek", None)
    data: bytes = peek(n) if peek is not None else b""
    return data[:n]


# --- JSON ------------------------------------------------------------------------------------


def _read_json(name: str, stream: IO[bytes]) -> Iterator[list[Item]]:
    consumed: list[bytes] = []
    lineno = 0
    first = b""
    while not first.strip():
        first = stream.readline(LONG_LINE)
        if not first:
            return
        if lineno == 0:
            first = first.removeprefix(_BOM)
        lineno += 1
        consumed.append(first)
    if len(first) >= LONG_LINE and not first.endswith(b"\n"):
        yield from _read_document(name, _Chained(consumed, stream))
        return
    try:
        obj = parse_json(first)
    except (ValueError, RecursionError) as exc:
        # Either a pretty-printed document or a malformed first line of JSON lines: a JSON-lines
        # file has a complete value on its next non-blank line.
        second = b""
        second_lineno = lineno
        while not second.strip():
            second = stream.readline(LONG_LINE)
            if not second:
                break
            second_lineno += 1
            consumed.append(second)
        if not _is_json_value(second):
            yield from _read_document(name, _Chained(consumed, stream))
            return
        yield [ReadError(name, f"malformed JSON: {exc}", line=lineno)]
        yield list(_json_records(name, parse_json(second), line=second_lineno))
        lineno = second_lineno
    else:
        yield list(_json_records(name, obj, line=lineno))
    for line in stream:
        lineno += 1
        if not line.strip():
            continue
        try:
            obj = parse_json(line)
        except (ValueError, RecursionError) as exc:
            yield [ReadError(name, f"malformed JSON: {exc}", line=lineno)]
            continue
        yield list(_json_records(name, obj, line=lineno))


def _is_json_value(line: bytes) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def _json_records(
    name: str, obj: Any, *, line: int | None = None, offset: int | None = None, nested: bool = False
) -> Iterator[Item]:
    """One decoded JSON value: an OTLP/JSON request, a Jaeger response or trace, or a list of those."""
    if isinstance(obj, list) and not nested:
        for item in obj:
            yield from _json_records(name, item, line=line, offset=offset, nested=True)
        return
    if not isinstance(obj, dict):
        yield ReadError(name, f"expected a JSON object, got {type(obj).__name__}", line, offset)
        return
    if "resourceSpans" in obj or "resource_spans" in obj or isinstance(obj.get("batches"), list):
        yield from _otlp_json_records(name, obj, line, offset)
    elif isinstance(obj.get("result"), dict) or isinstance(obj.get("trace"), dict):
        inner = obj["result"] if isinstance(obj.get("result"), dict) else obj["trace"]
        yield from _json_records(name, inner, line=line, offset=offset, nested=True)
    elif isinstance(obj.get("data"), list):
        for trace in obj["data"]:
            yield from _jaeger_records(name, trace, line, offset)
    elif is_jaeger_trace(obj):
        yield from _jaeger_records(name, obj, line, offset)
    elif obj and not any(k in obj for k in _OTHER_SIGNALS):
        keys = ", ".join(sorted(map(str, obj))[:5])
        yield ReadError(name, f"not OTLP/JSON traces or Jaeger JSON (keys: {keys})", line, offset)


def _otlp_json_records(name: str, obj: dict[str, Any], line: int | None, offset: int | None) -> Iterator[Item]:
    try:
        for item in request_spans(obj):
            yield ReadError(name, f"invalid OTLP/JSON: {_short(item)}", line, offset) if isinstance(item, str) else item
    except (ValueError, RecursionError) as exc:
        yield ReadError(name, f"invalid OTLP/JSON: {_short(exc)}", line, offset)


def _jaeger_records(name: str, trace: Any, line: int | None, offset: int | None) -> Iterator[Item]:
    if not isinstance(trace, Mapping) or not isinstance(trace.get("spans"), list):
        yield ReadError(name, "Jaeger trace without a spans list", line, offset)
        return
    for item in trace_records(trace):
        yield ReadError(name, item, line, offset) if isinstance(item, str) else item


def _read_document(name: str, stream: io.RawIOBase) -> Iterator[list[Item]]:
    """One JSON document (or several concatenated), streamed item by item with ijson.

    Paths are tracked here rather than by ``ijson.parse``, whose prefixes grow with nesting
    depth on every event: a hostile document nested a million deep would cost quadratic memory.
    """
    path: list[str] = []  # where the parser is, as ijson prefixes spell it
    builder: Any = None
    depth = 0
    kind = ""
    found = False
    try:
        for event, value in ijson.basic_parse(stream, multiple_values=True, use_float=True):
            if builder is None:
                if event == "map_key":
                    path[-1] = value
                    continue
                if event in _ENDS:
                    path.pop()
                    continue
                if event not in _STARTS:
                    continue
                prefix = ".".join(path)
                if prefix in _ITEM_KINDS:
                    builder, depth, kind = ijson.ObjectBuilder(), 0, _ITEM_KINDS[prefix]
                elif event == "start_map" and not path:
                    # A top-level Jaeger trace is built whole; requests and responses are streamed.
                    builder, depth, kind = ijson.ObjectBuilder(), 0, "top"
                else:
                    if len(path) >= MAX_DEPTH:
                        raise ValueError(f"nested deeper than {MAX_DEPTH}")
                    path.append("item" if event == "start_array" else "")
                    continue
            builder.event(event, value)
            if event in _STARTS:
                depth += 1
                if depth > MAX_DEPTH:
                    raise ValueError(f"nested deeper than {MAX_DEPTH}")
            elif event in _ENDS:
                depth -= 1
            elif kind == "top" and event == "map_key" and depth == 1 and value not in _JAEGER_TRACE_KEYS:
                builder, path = None, [value]  # not a bare Jaeger trace: its items are streamed instead
                continue
            if depth == 0:
                obj, builder = repair_lone_surrogates(builder.value), None
                found = True
                if kind == "otlp":
                    yield list(_otlp_json_records(name, {"resourceSpans": [obj]}, None, None))
                elif kind == "jaeger":
                    yield list(_jaeger_records(name, obj, None, None))
                else:
                    yield list(_json_records(name, obj, nested=kind == "any"))
    except ijson.common.IncompleteJSONError as exc:
        yield [ReadError(name, f"malformed JSON document: {_short(exc)}")]
        return
    except (ValueError, UnicodeDecodeError) as exc:
        yield [ReadError(name, f"malformed JSON document: {_short(exc)}")]
        return
    if not found:
        yield [ReadError(name, "no trace data in this JSON document (expected OTLP/JSON resourceSpans or Jaeger data)")]


class _Chained(io.RawIOBase):
    """The lines already read, then the rest of the stream: lets detection look ahead."""

    def __init__(self, head: list[bytes], rest: IO[bytes]) -> None:
        self._head = b"".join(head)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._head:
            n = min(len(view), len(self._head))
            view[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._rest.read(len(view))
        view[: len(data)] = data
        return len(data)


# --- protobuf --------------------------------------------------------------------------------


def _read_protobuf(name: str, stream: IO[bytes]) -> Iterator[list[Item]]:
    # A serialized request starts with field 1 (resource_spans, length-delimited): tag 0x0a.
    # A length prefix would start with 0x0a only for a record of 160 MiB or more.
    if _peek(stream, 1) == b"\x0a":
        yield _payload_records(name, stream.read(), 0)
        return
    offset = 0
    while True:
        header = stream.read(4)
        if not header:
            return
        if len(header) < 4:
            yield [ReadError(name, f"truncated record header ({len(header)} of 4 bytes)", offset=offset)]
            return
        (size,) = struct.unpack(">I", header)
        if size > MAX_RECORD:
            what = (
                "not a trace file (neither JSON nor OTLP protobuf records)"
                if offset == 0
                else f"corrupt record length {size}; the rest of the file is skipped"
            )
            yield [ReadError(name, what, offset=offset)]
            return
        payload = stream.read(size)
        if len(payload) < size:
            yield [ReadError(name, f"truncated record: {len(payload)} of {size} bytes", offset=offset)]
            return
        yield _payload_records(name, payload, offset)
        offset += 4 + size


def _payload_records(name: str, payload: bytes, offset: int) -> list[Item]:
    if payload.startswith(ZSTD_MAGIC):
        try:
            payload = zstandard.ZstdDecompressor().decompressobj().decompress(payload)
        except zstandard.ZstdError as exc:
            return [ReadError(name, f"corrupt zstd record: {exc}", offset=offset)]
    if payload[:1] in _JSON_START:  # the file exporter's format: json with compression
        try:
            obj = parse_json(payload)
        except (ValueError, RecursionError) as exc:
            return [ReadError(name, f"malformed JSON record: {exc}", offset=offset)]
        return list(_json_records(name, obj, offset=offset))
    try:
        records = decode_request(payload)
    except (DecodeError, RuntimeError) as exc:
        return [ReadError(name, f"not an OTLP protobuf record: {_short(exc)}", offset=offset)]
    out: list[Item] = []
    for record in records:
        if len(record.trace_id) != 32 or len(record.span_id) != 16:
            message = f"span {record.name!r} has an invalid trace or span id ({record.trace_id!r})"
            trace_id = record.trace_id if len(record.trace_id) == 32 else None
            out.append(ReadError(name, message, offset=offset, trace_id=trace_id))
        else:
            out.append(record)
    return out


def _short(exc: BaseException | str, limit: int = 300) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
