"""The export queue's file: the page size a new file gets, a file made with SQLite's default
pages (as earlier versions made it) opened as it is, its requests intact; a delete that does not
write the deleted bytes again; the state directory the exporter makes."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from otel_plumb.export import queue
from otel_plumb.export.queue import DiskQueue


def pragma(path: Path, name: str) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute(f"PRAGMA {name}").fetchone()[0])


async def test_a_new_queue_file_has_large_pages_and_a_checkpoint_in_bytes(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path / "queue.db")
    await q.open()
    journal_id = await q.journal(b"request" * 10_000)
    [batch_id] = await q.put([(b"batch" * 20_000, 3)], [(journal_id, b"t" * 16)], [journal_id])
    assert q._db is not None
    assert q._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == (16 << 20) // 16384
    assert await q.journaled() == []
    assert await q.load(0, 100) == [(batch_id, b"batch" * 20_000, 3)]
    await q.close()
    assert pragma(tmp_path / "queue.db", "page_size") == 16384 == queue.PAGE_SIZE


async def test_a_file_with_small_pages_keeps_them_and_its_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "queue.db"
    with monkeypatch.context() as patch:
        patch.setattr(queue, "PAGE_SIZE", 4096)
        q = DiskQueue(path)
        await q.open()
        journal_id = await q.journal(b"received" * 5_000)
        [batch_id] = await q.put([(b"queued" * 5_000, 2)], [(journal_id, b"a" * 16)], [])
        await q.close()
    assert pragma(path, "page_size") == 4096

    q = DiskQueue(path)
    first, count, spans, size = await q.open()
    assert (first, count, spans, size) == (batch_id, 1, 2, len(b"queued" * 5_000))
    assert await q.journaled() == [(journal_id, b"received" * 5_000, {b"a" * 16})]
    assert q._db is not None
    assert q._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == (16 << 20) // 4096
    # It goes on taking requests at its own page size.
    [later] = await q.put([(b"more" * 10_000, 1)], [], [journal_id])
    assert [row[0] for row in await q.load(0, 100)] == [batch_id, later]
    assert await q.journaled() == []
    await q.close()
    assert pragma(path, "page_size") == 4096


async def test_deleting_a_request_does_not_write_its_bytes_again(tmp_path: Path) -> None:
    # Builds of SQLite with secure_delete on by default (Debian's) overwrite every deleted byte
    # with zeros: a second write of each request, into the WAL and then the database.
    path = tmp_path / "queue.db"
    q = DiskQueue(path)
    await q.open()
    [batch_id] = await q.put([(os.urandom(2 << 20), 512)], [], [])
    assert q._db is not None
    q._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert Path(f"{path}-wal").stat().st_size == 0
    await q.delete([batch_id])
    # The pages of the row's chain are put on the free list as they are: a few pages written, not 2 MiB.
    assert Path(f"{path}-wal").stat().st_size < 256 << 10
    assert await q.load(0, 100) == []
    await q.close()


async def test_the_exporter_makes_its_state_directory_private(tmp_path: Path) -> None:
    from otel_plumb.export.config import OtlpExporterConfig
    from otel_plumb.export.metrics import Metrics
    from otel_plumb.export.otlp import OtlpExporter

    new, mounted = tmp_path / "new" / "state", tmp_path / "mounted"
    mounted.mkdir()
    mounted.chmod(0o755)  # whatever the umask: a volume mounted as its operator set it up
    for state_dir in (new, mounted):
        exporter = OtlpExporter(OtlpExporterConfig(endpoint="grpc://127.0.0.1:9", state_dir=str(state_dir)), Metrics())
        await exporter.start()
        await exporter.stop()
    assert stat.S_IMODE(new.stat().st_mode) == 0o700
    assert stat.S_IMODE(mounted.stat().st_mode) == 0o755
