"""The receive journal's request bodies: append-only segment files in a directory beside the
queue's SQLite file, which indexes them (``DiskQueue``: segment, offset, length and checksum of
each body).

Why files and not rows: a request stored as a row was written three times (into the WAL, into
the database at checkpoint, and its whole chain of overflow pages read again to free it), which
at 100 KB of content per model call was half of the processor's CPU (``bench/live.py --sweep
payload``). A segment takes each request with one ``pwrite``.

Files are reused rather than deleted: a segment whose requests were all released becomes a
spare, and the next segment is a spare renamed and overwritten from its start. Writing over
pages the page cache holds costs far less than writing a new file's pages (this machine: about
9 against 0.4 GB/s). Bytes past what the index points at are never read, and a read is checked
against the length and checksum the index recorded, so stale bytes are never taken for a request.

A segment kept for a few long-lived requests (a trace waiting for its root holds its request)
is compacted: once less than ``COMPACT_BELOW`` of it is live (and it is no longer the one being
written), it is listed by ``take_sparse``, and the caller copies its live requests to the
current segment and frees it, so the files hold at most about four times the
live bytes, plus the current segment and the spares.

Only the segment being written is held open: a queue of gigabytes during a backend outage is
hundreds of segments, and the others are read only at a restart or when the queue outgrows its
memory window. Not thread-safe: the queue calls it from its one storage thread.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# A new segment is started once the current one holds this much (a larger request still goes
# into one segment whole).
SEGMENT_BYTES = 64 << 20
# Spare segment files: each freed segment is kept for reuse for SPARE_KEEP_S, and at least
# SPARE_SEGMENTS are kept however long. The journal's working set is every request since the
# oldest trace in flight began (gigabytes at 100 KB per model call, its size changing with the
# load): spares that cover it keep the writes on cached pages, as a database file reuses its
# free pages, and the files shrink again once the load drops (spares are trimmed at every
# release, roll and retirement).
SPARE_SEGMENTS = 2
SPARE_KEEP_S = 60.0
COMPACT_BELOW = 0.25

_NAME = re.compile(r"^(\d{1,18})\.seg$")


@dataclass(slots=True)
class _Segment:
    number: int
    end: int = 0  # bytes written (the file may be longer: a spare's old bytes)
    live: int = 0  # bytes of the bodies the index still points at
    entries: int = 0
    freed_at: float = 0.0  # when it became a spare (monotonic)


class Segments:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._segments: dict[int, _Segment] = {}
        self._spares: list[_Segment] = []
        self._current: _Segment | None = None
        self._fd = -1  # the current segment's, open for writing
        self._next = 1
        self._sparse: set[int] = set()

    def _path(self, number: int) -> Path:
        return self.directory / f"{number:06d}.seg"

    def open(self, indexed: Iterable[tuple[int, int, int]]) -> None:
        """Opens the directory; ``indexed``: (segment, offset, length) of every request the index
        holds. Files holding none of them become spares (or are deleted)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = {int(m.group(1)): p for p in self.directory.iterdir() if (m := _NAME.match(p.name))}
        indexed = list(indexed)
        # Past every number the index names too: a new segment must not take the number of a
        # missing one that rows still point at.
        self._next = max([*found, *(number for number, _, _ in indexed)], default=0) + 1
        for number, path in sorted(found.items()):
            self._segments[number] = _Segment(number, path.stat().st_size)
        for number, _offset, length in indexed:
            if number in self._segments:
                self._segments[number].live += length
                self._segments[number].entries += 1
        for segment in [s for s in self._segments.values() if not s.entries]:
            self._retire(segment)

    def write(self, body: bytes) -> tuple[int, int]:
        """Appends ``body`` to the current segment; returns (segment, offset). Raises OSError
        (nothing is pointed at the bytes, and the next write goes over them)."""
        segment = self._current
        if segment is None or segment.end >= SEGMENT_BYTES:
            segment = self._roll()
        offset = segment.end
        view = memoryview(body)
        written = 0
        while written < len(view):  # a write past a file size limit or a full disk comes back short
            written += os.pwrite(self._fd, view[written:], offset + written)
        segment.end = offset + written
        return segment.number, offset

    def add(self, number: int, length: int) -> None:
        """The index now points at ``length`` bytes written to segment ``number``."""
        segment = self._segments[number]
        segment.live += length
        segment.entries += 1

    def read(self, number: int, offset: int, length: int) -> bytes | None:
        """The bytes at (segment, offset, length), or None when the file is missing or shorter."""
        segment = self._segments.get(number)
        if segment is None:
            return None
        if segment is self._current:
            data = os.pread(self._fd, length, offset)
        else:
            try:
                fd = os.open(self._path(number), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
            try:
                data = os.pread(fd, length, offset)
            finally:
                os.close(fd)
        return data if len(data) == length else None

    def remove(self, number: int, length: int) -> None:
        """The index no longer points at ``length`` bytes of segment ``number``."""
        segment = self._segments.get(number)
        if segment is None:
            return
        segment.live -= length
        segment.entries -= 1
        if segment is not self._current:
            if segment.entries <= 0:
                self._retire(segment)
            else:
                self._sparse.add(number)  # take_sparse says whether it is sparse
        self._trim_spares()

    def take_sparse(self) -> list[int]:
        """Segments to compact now (see the module's docstring); one that holds nothing the
        index points at is among them, for the caller to free."""
        if not self._sparse:
            return []
        segments = self._segments
        sparse = sorted(
            n for n in self._sparse
            if n in segments and segments[n] is not self._current and segments[n].live < COMPACT_BELOW * segments[n].end
        )  # fmt: skip
        self._sparse = set()
        return sparse

    def free(self, number: int) -> None:
        """Segment ``number`` holds nothing the index points at any more (compacted)."""
        segment = self._segments.get(number)
        if segment is not None and segment is not self._current:
            self._retire(segment)

    def _retire(self, segment: _Segment) -> None:
        del self._segments[segment.number]
        self._sparse.discard(segment.number)
        if segment is self._current:
            self._close_current()
        segment.freed_at = time.monotonic()
        self._spares.append(segment)
        self._trim_spares()

    def _trim_spares(self) -> None:
        """Deletes the spares kept longer than SPARE_KEEP_S, oldest first, down to SPARE_SEGMENTS."""
        spares, cutoff = self._spares, time.monotonic() - SPARE_KEEP_S
        while len(spares) > SPARE_SEGMENTS and spares[0].freed_at < cutoff:
            spare = spares.pop(0)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(spare.number))

    def _close_current(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._current = -1, None

    def _roll(self) -> _Segment:
        if self._current is not None:
            # Not retired here even when the index points at nothing in it: the caller's
            # transaction may have written to it and not committed yet. take_sparse lists it.
            self._sparse.add(self._current.number)
        self._close_current()
        number, self._next = self._next, self._next + 1
        self._trim_spares()
        path, flags = self._path(number), os.O_RDWR | os.O_CLOEXEC
        if self._spares:
            spare = self._spares.pop()  # the one freed last: the likeliest to be in the page cache
            os.rename(self._path(spare.number), path)
        else:
            flags |= os.O_CREAT | os.O_EXCL
        self._fd = os.open(path, flags, 0o600)
        segment = _Segment(number)
        self._segments[number] = segment
        self._current = segment
        return segment

    def close(self) -> None:
        self._close_current()
        self._segments, self._spares = {}, []
