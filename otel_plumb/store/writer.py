"""Decided records written to the store off the hot path, by a process of its own.

The processor hands each batch of records to ``offer`` (never waiting): they go as one JSON
frame through a pipe to the writer process (``python -m otel_plumb.store``), which
compresses them, writes them in transactions of up to ``BATCH`` records and applies retention.
A thread would share the interpreter lock with the event loop: its orjson and row building,
and every time it took the lock back after SQLite, cost the loop as much time as they took (the
store cost 12 to 16% of the processor's throughput that way; bench/store.py).

The writer answers each batch with what it wrote or failed to write. At most ``max_pending``
records are in flight; past it new ones are dropped and counted, so a slow disk never slows
the processor. A writer that dies is started again, and what it had not written is counted as
failed. A writer whose processor is gone (killed) reads the end of its pipe, writes what it
has and exits.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import site
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import orjson

from otel_plumb.model.text import record_json
from otel_plumb.store.config import StoreConfig
from otel_plumb.store.db import TrajectoryStore

log = logging.getLogger("otel_plumb.store")

# Records per transaction, and how often retention runs.
BATCH = 1000
EXPIRE_EVERY = 60.0
# How long the writer process may take to open the store.
START_TIMEOUT = 60.0

# outcome ("written", "dropped", "failed"), count
Outcome = Callable[[str, int], None]

# A frame: its length (4 bytes, big-endian), then a JSON list of records; length 0 ends the input.
_LENGTH = struct.Struct(">I")
# Where the package is imported from, for the writer process to import the same.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def _writer_env() -> dict[str, str]:
    """This environment, with the folder the package was imported from first on PYTHONPATH when
    it is a source tree. Not a site-packages folder: the writer finds an installed package as
    this process did, and a site-packages folder put before the standard library would let an
    old backport there shadow a standard module."""
    installed = {str(Path(p).resolve()) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if _PACKAGE_ROOT in installed:
        return dict(os.environ)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}


class StoreWriter:
    def __init__(self, config: StoreConfig, outcome: Outcome | None = None) -> None:
        self.config = config
        self._outcome = outcome or (lambda _o, _n: None)
        self._lock = threading.Lock()
        self._pending = 0  # records offered, not yet written or failed
        self._capacity = config.max_pending  # 0 once no writer can be started
        self._frames: queue.Queue[tuple[bytes, int] | None] = queue.Queue()
        self._process: subprocess.Popen[bytes] | None = None
        self._unanswered = 0  # records sent to the running writer, not yet answered
        self._sender: threading.Thread | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        """Start the writer process and wait for it to open the store (errors surface here, at
        start), then the threads that feed it and read its answers."""
        self._spawn()
        self._sender = threading.Thread(target=self._send, name="otel-plumb-store-send", daemon=True)
        self._sender.start()

    def offer(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Queue records for writing; returns how many were taken (the rest are counted as
        dropped: ``max_pending`` records are in flight)."""
        with self._lock:
            taken = max(0, min(len(records), self._capacity - self._pending))
            self._pending += taken
        if taken:
            self._frames.put((record_json(records[:taken]), taken))
        if taken < len(records):
            self._outcome("dropped", len(records) - taken)
        return taken

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued (for at most ``timeout``), then stop the writer process."""
        if self._sender is None:
            return
        self._frames.put(None)
        deadline = time.monotonic() + timeout
        self._sender.join(timeout)
        if self._reader is not None:
            self._reader.join(max(0.0, deadline - time.monotonic()))
        process = self._process
        if process is not None:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # stuck on the disk: what it held is lost with it
                process.kill()
                process.wait()
        self._sender = None

    # ---- the writer process, from this side ------------------------------------------------------

    def _spawn(self) -> None:
        command = [sys.executable, "-m", "otel_plumb.store", str(self.config.path),
                   repr(self.config.max_age), str(self.config.max_bytes)]  # fmt: skip
        # A session of its own: Ctrl-C in a terminal reaches the processor, which stops its writer.
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_writer_env(),
                                   start_new_session=True)  # fmt: skip
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT)
        answer = orjson.loads(process.stdout.readline() or b'["error", 0, ""]') if ready else None
        if answer is None or answer[0] != "ready":
            process.kill()
            process.wait()
            why = "did not start in time" if answer is None else answer[2] or f"exited ({process.returncode})"
            raise OSError(why if why.startswith("store.path") else f"store.path: the store's writer {why}")
        self._process, self._unanswered = process, 0
        self._reader = threading.Thread(target=self._read, args=(process,), name="otel-plumb-store-read", daemon=True)
        self._reader.start()

    def _send(self) -> None:
        while True:
            item = self._frames.get()
            process = self._process
            if process is not None and process.poll() is not None:
                process = self._process if self._restart(process) else None
            if process is None:  # no writer: what is offered is lost
                if item is None:
                    return
                self._settle(item[1], 0, "failed")
                continue
            assert process.stdin is not None
            try:
                if item is None:
                    process.stdin.write(_LENGTH.pack(0))
                    process.stdin.close()
                    return
                frame, count = item
                with self._lock:
                    self._unanswered += count
                process.stdin.write(_LENGTH.pack(len(frame)) + frame)
                process.stdin.flush()
            except (BrokenPipeError, ValueError):  # it died mid-frame: counted when it is restarted
                if item is None:
                    return

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            try:
                what, count, message = orjson.loads(line)
            except ValueError:  # not an answer (its output is its own): logged, not taken for one
                log.warning("the store's writer printed %r", line[:200])
                continue
            if message:
                log.error("%s", message)
            if count:
                self._settle(count, count, what)

    def _settle(self, count: int, answered: int, outcome: str) -> None:
        with self._lock:
            self._pending -= count
            self._unanswered -= answered
        self._outcome(outcome, count)

    def _restart(self, died: subprocess.Popen[bytes]) -> bool:
        """The writer process died: count what it had not written as failed, start another."""
        if self._reader is not None:
            self._reader.join(1.0)  # its last answers first
        with self._lock:
            lost = self._unanswered
        log.error("the store's writer process exited (%s); %d records not written; starting it again",
                  died.returncode, lost)  # fmt: skip
        if lost:
            self._settle(lost, lost, "failed")
        try:
            self._spawn()
        except OSError as exc:
            log.error("cannot start the store's writer again; decided trajectories are no longer stored: %s", exc)
            self._process = None
            with self._lock:
                self._capacity = 0
            return False
        return True


# ---- the writer process ----------------------------------------------------------------------------


def serve(path: str, max_age: float, max_bytes: int, frames: int, answers: IO[bytes]) -> None:
    """Open the store, then write the records of each frame read from file descriptor
    ``frames`` until the end of the input."""

    def answer(what: str, count: int = 0, message: str = "") -> None:
        answers.write(orjson.dumps([what, count, message]) + b"\n")
        answers.flush()

    try:
        store = TrajectoryStore(path)
        store.expire(max_age, max_bytes)
    except (sqlite3.Error, OSError) as exc:
        answer("error", 0, f"store.path: cannot open {path} as a trajectory store: {exc}")
        return
    answer("ready")
    next_expiry = time.monotonic() + EXPIRE_EVERY
    done = False
    while not done:
        batch, done = _take(frames)
        if batch:
            try:
                store.add(batch, "live")
            except Exception as exc:  # a full disk loses these records, never the processor
                answer("failed", len(batch), f"cannot write {len(batch)} trajectories to the store {path}: {exc}")
            else:
                answer("written", len(batch))
        if time.monotonic() >= next_expiry:
            next_expiry = time.monotonic() + EXPIRE_EVERY
            try:
                store.expire(max_age, max_bytes)
            except Exception as exc:
                answer("retention", 0, f"store retention failed on {path}: {exc}")
    store.close()


def _take(frames: int) -> tuple[list[Mapping[str, Any]], bool]:
    """The records of the frames that have arrived on file descriptor ``frames``, up to about
    ``BATCH``, waiting up to a second for the first; True at the end of the input."""
    batch: list[Mapping[str, Any]] = []
    timeout = 1.0
    while len(batch) < BATCH and select.select([frames], [], [], timeout)[0]:
        header = _read_exactly(frames, _LENGTH.size)
        length = _LENGTH.unpack(header)[0] if len(header) == _LENGTH.size else 0
        if not length:
            return batch, True
        batch += orjson.loads(_read_exactly(frames, length))
        timeout = 0.0
    return batch, False


def _read_exactly(fd: int, size: int) -> bytes:
    """``size`` bytes, fewer only at the end of the input (unbuffered: ``select`` sees what is left)."""
    parts, left = [], size
    while left:
        part = os.read(fd, left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)
