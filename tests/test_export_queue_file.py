"""The export queue's files: request bodies are not written into the SQLite file (its WAL takes
only their index rows), an earlier version's file with its bodies in rows given back its pages,
and the state directory the exporter makes."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

from otel_plumb.export.queue import DiskQueue


async def test_bodies_go_to_the_segments_not_into_the_database(tmp_path: Path) -> None:
    # Kept in rows, a body was written into the WAL, again into the database at checkpoint, and
    # its chain of pages read once more to free it.
    path = tmp_path / "queue.db"
    q = DiskQueue(path)
    await q.open()
    journal_id = await q.journal(os.urandom(2 << 20))
    [batch_id] = await q.put([(os.urandom(2 << 20), 512)], [], [journal_id])
    await q.delete([batch_id])
    assert Path(f"{path}-wal").stat().st_size + path.stat().st_size < 256 << 10
    segments = sum(p.stat().st_size for p in Path(f"{path}-segments").rglob("*.seg"))
    assert segments >= 4 << 20  # the two bodies, written once each (the files are kept for reuse)
    await q.close()


async def test_an_earlier_versions_file_gives_back_the_pages_its_bodies_took(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    with sqlite3.connect(path) as db:  # the tables as earlier versions made them, a request in each
        db.execute("CREATE TABLE batches (id INTEGER PRIMARY KEY AUTOINCREMENT, spans INTEGER, body BLOB)")
        db.execute("CREATE TABLE journal (id INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB)")
        db.execute("INSERT INTO batches (spans, body) VALUES (1, ?)", (os.urandom(4 << 20),))
        db.execute("INSERT INTO journal (body) VALUES (?)", (os.urandom(4 << 20),))
    assert path.stat().st_size > 8 << 20
    q = DiskQueue(path)
    assert (await q.open())[1:3] == (1, 1)
    await q.close()
    assert path.stat().st_size < 1 << 20


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
