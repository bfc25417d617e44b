"""The receive journal and the export queue: bodies in segment files beside the queue file,
indexed in it.

What they must do whatever the order of their operations: give back, after a restart, exactly
the requests journaled and not released and the batches queued and not deleted, byte for byte;
never give back bytes that are not the body (damaged, cut short, a reused file's old bytes);
keep their files bounded by what is live; and take over the bodies an earlier version kept in
the database itself."""

from __future__ import annotations

import asyncio
import os
import resource
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_plumb.export import segments
from otel_plumb.export.queue import DiskQueue


def opened(path: Path) -> DiskQueue:
    q = DiskQueue(path)
    q._open()
    return q


def journal(q: DiskQueue, body: bytes) -> int:
    [journal_id] = q._journal([body])
    return journal_id


def segment_files(path: Path, kind: str = "journal") -> list[Path]:
    return sorted(Path(f"{path}-segments", kind).glob("*.seg"))


def queued(q: DiskQueue) -> dict[int, tuple[bytes, int]]:
    return {batch_id: (body, spans) for batch_id, body, spans in q._load(0, 1 << 30)}


@pytest.fixture
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    # Segments of 4 KiB: a few requests each, so that rolls, reuse and compaction all happen.
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 4096)


def test_a_restart_gives_back_what_was_not_released(tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite"
    q = opened(path)
    bodies = [os.urandom(n) for n in (10, 70_000, 1, 300)]
    ids = q._journal(bodies)
    q._put([(b"batch", 1)], [(ids[1], b"t" * 16)], [ids[0]])
    # Traces of one request done in one submit share a row; a later submit adds to them.
    q._put([(b"more", 2)], [(ids[2], b"u" * 16 + b"v" * 16), (ids[1], b"u" * 16)], [])
    q._release([ids[3]])
    q._close()
    q = opened(path)
    assert q._journaled() == [(ids[1], bodies[1], {b"t" * 16, b"u" * 16}), (ids[2], bodies[2], {b"u" * 16, b"v" * 16})]
    assert q.unreadable == []
    # Released, a request's traces go with it.
    q._release([ids[1]])
    assert q._db is not None
    assert q._db.execute("SELECT COUNT(*) FROM journal_traces_done WHERE jid = ?", (ids[1],)).fetchone()[0] == 0
    q._close()


def test_decided_traces_written_with_their_spans_are_given_back_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite"
    q = opened(path)
    t1, t2, t3 = "1" * 32, "2" * 32, "3" * 32
    a, b, c, d, e = (ch * 16 for ch in "abcde")
    q._put([(b"batch", 2)], [], [], [(t1, 100.0, a + b), (t2, 200.0, c)])
    q._put([(b"late", 1)], [], [], [(t1, 300.0, d)])  # a late span adds to its trace's row
    q._put([(b"more", 1)], [], [], [(t3, 400.0, e)])
    q._close()
    q = opened(path)
    # Oldest first, a trace at the time of its decision, with every span id queued for it.
    assert q._decided(0.0, 10) == [(t1, 100.0, a + b + d), (t2, 200.0, c), (t3, 400.0, e)]
    assert q._decided(150.0, 10) == [(t2, 200.0, c), (t3, 400.0, e)]
    assert q._decided(0.0, 1) == [(t3, 400.0, e)], "the last decided, when there are more"
    q._forget_decided(150.0, 10)
    assert [t for t, _, _ in q._decided(0.0, 10)] == [t2, t3]
    q._forget_decided(0.0, 1)
    assert [t for t, _, _ in q._decided(0.0, 10)] == [t3]
    q._close()


def test_a_failed_put_remembers_no_decided_trace(tmp_path: Path) -> None:
    q = opened(tmp_path / "q.sqlite")
    with pytest.raises(sqlite3.Error):
        # A row SQLite refuses (no time) fails the whole put: neither the batch nor any trace is kept.
        q._put([(b"batch", 1)], [], [], [("1" * 32, 1.0, "a" * 16), ("2" * 32, None, "b" * 16)])  # type: ignore[list-item]
    assert q._decided(0.0, 10) == [] and queued(q) == {}
    q._close()


def test_a_restart_gives_back_the_batches_not_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite"
    q = opened(path)
    batches = [(os.urandom(n), spans) for spans, n in enumerate((5, 300_000, 2_000, 40), start=1)]
    ids = q._put(batches[:2], [], []) + q._put(batches[2:], [], [])
    q._delete([ids[0], ids[2]])
    q._close()
    q = DiskQueue(path)
    first, count, spans, size = q._open()
    assert (first, count, spans, size) == (ids[1], 2, 2 + 4, 300_000 + 40)
    assert queued(q) == {ids[1]: batches[1], ids[3]: batches[3]}
    assert [row[0] for row in q._load(ids[1], 1)] == [ids[3]]  # after an id, up to a span count
    q._close()


@pytest.mark.parametrize("damage", ["flip", "cut", "gone"])
def test_journaled_bytes_that_are_not_the_request_are_never_given_back(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "q.sqlite"
    q = opened(path)
    kept, damaged = b"k" * 5000, b"d" * 5000
    kept_id, damaged_id = q._journal([kept, damaged])
    q._close()
    [segment] = segment_files(path)
    if damage == "flip":  # what an OS crash leaves when the index was written and the file not
        with open(segment, "r+b") as f:
            f.seek(len(kept) + 100)
            f.write(b"x")
    elif damage == "cut":
        os.truncate(segment, len(kept) + 10)
    else:
        segment.unlink()
    q = opened(path)
    entries = q._journaled()
    if damage == "gone":
        assert entries == [] and [lost.row_id for lost in q.unreadable] == [kept_id, damaged_id]
    else:
        assert entries == [(kept_id, kept, set())]
        [lost] = q.unreadable
        assert (lost.table, lost.row_id) == ("journal", damaged_id)
        assert "checksum" in lost.why if damage == "flip" else "cut short" in lost.why, lost.why
    q.unreadable.clear()
    # A new segment does not take the number of a missing one the index pointed at.
    [later] = q._journal([b"later" * 100])
    q._close()
    # Dropped from the index: the next start does not report them again.
    q = opened(path)
    assert q._journaled() == [*entries, (later, b"later" * 100, set())] and q.unreadable == []
    q._close()


def test_a_damaged_batch_is_dropped_and_reported_not_sent(tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite"
    q = opened(path)
    [good, bad] = q._put([(b"g" * 4000, 3), (b"b" * 4000, 5)], [], [])
    q._close()
    [segment] = segment_files(path, "batches")
    with open(segment, "r+b") as f:
        f.seek(4000 + 1234)
        f.write(b"x")
    q = opened(path)
    assert queued(q) == {good: (b"g" * 4000, 3)}
    [lost] = q.unreadable
    assert (lost.table, lost.row_id, lost.spans, lost.length) == ("batches", bad, 5, 4000)
    q._close()
    q = DiskQueue(path)
    assert q._open() == (good, 1, 3, 4000)  # gone from the counts of the next start too
    q._close()


@pytest.mark.usefixtures("small_segments")
def test_freed_segments_are_reused_not_multiplied(tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite"
    q = opened(path)
    inodes: set[int] = set()
    for _ in range(200):
        [jid] = q._journal([os.urandom(1500)])
        inodes |= {p.stat().st_ino for p in segment_files(path)}
        q._release([jid])
    # 200 requests of 1.5 KB went through 4 KiB segments: about 100 segments, in a few files.
    assert len(inodes) <= 2 + segments.SPARE_SEGMENTS, len(inodes)
    q._close()


@pytest.mark.usefixtures("small_segments")
def test_a_queue_of_many_segments_holds_one_file_open(tmp_path: Path) -> None:
    # A queue of gigabytes during an outage is hundreds of segments: one descriptor each would
    # run into the process's limit of open files.
    path = tmp_path / "q.sqlite"
    q = opened(path)
    before = len(os.listdir("/proc/self/fd"))
    batches = [(os.urandom(3000), 1) for _ in range(300)]
    ids = [batch_id for batch in batches for batch_id in q._put([batch], [], [])]
    assert len(segment_files(path, "batches")) >= 100
    assert len(os.listdir("/proc/self/fd")) <= before + 1
    assert queued(q) == dict(zip(ids, batches, strict=True))  # read back from the closed segments
    q._close()


@pytest.mark.usefixtures("small_segments")
def test_spares_are_deleted_once_kept_long_enough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "q.sqlite"
    q = opened(path)
    ids = [journal(q, os.urandom(1500)) for _ in range(40)]
    busiest = len(segment_files(path))
    monkeypatch.setattr(segments, "SPARE_KEEP_S", 0.0)
    q._release(ids)
    journal(q, b"one more")
    # What was needed at the peak is not kept once the load is gone.
    assert busiest >= 10 and len(segment_files(path)) <= 1 + segments.SPARE_SEGMENTS
    q._close()


@pytest.mark.usefixtures("small_segments")
def test_a_segment_held_by_a_few_requests_is_compacted(tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite"
    q = opened(path)
    bodies = {}
    for i in range(300):
        body = os.urandom(1000)
        jid = journal(q, body)
        bodies[jid] = body
        if i % 8:  # one request in eight stays, a trace that is still waiting for its root
            q._release([jid])
            del bodies[jid]
    live = sum(map(len, bodies.values()))
    on_disk = sum(p.stat().st_size for p in segment_files(path))
    # Without compaction every segment would be kept for its one live request: 300 KB of files.
    assert on_disk <= 4 * live + (2 + segments.SPARE_SEGMENTS) * 2 * segments.SEGMENT_BYTES, (on_disk, live)
    q._close()
    q = opened(path)
    assert {jid: body for jid, body, _ in q._journaled()} == bodies
    q._close()


def test_a_failed_write_takes_nothing_and_the_next_one_goes_over_it(tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite"
    q = opened(path)
    first = journal(q, b"a" * 3000)
    saved = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, saved[1]))  # a write past 4 KiB fails (EFBIG)
    try:
        with pytest.raises(OSError):
            journal(q, b"b" * 3000)  # 1 KiB of it is written before the limit
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, saved)
    second = journal(q, b"c" * 3000)
    q._close()
    q = opened(path)
    assert q._journaled() == [(first, b"a" * 3000, set()), (second, b"c" * 3000, set())]
    q._close()


def test_requests_journaled_in_the_database_by_an_earlier_version_are_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite"
    with sqlite3.connect(path) as db:  # the tables as earlier versions made them
        db.execute("CREATE TABLE batches (id INTEGER PRIMARY KEY AUTOINCREMENT, spans INTEGER, body BLOB)")
        db.execute("CREATE TABLE journal (id INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB)")
        db.execute("CREATE TABLE journal_done (jid INTEGER, trace_id BLOB, PRIMARY KEY (jid, trace_id)) WITHOUT ROWID")
        db.executemany("INSERT INTO journal (id, body) VALUES (?, ?)", [(7, b"seven" * 1000), (9, b"nine")])
        db.executemany("INSERT INTO journal_done VALUES (?, ?)", [(7, b"t" * 16), (7, b"u" * 16), (9, b"v" * 16)])
        db.executemany("INSERT INTO batches (id, spans, body) VALUES (?, ?, ?)", [(4, 2, b"four" * 999), (5, 1, b"5")])
    q = DiskQueue(path)
    assert q._open() == (4, 2, 3, 4 * 999 + 1)
    assert q._journaled() == [(7, b"seven" * 1000, {b"t" * 16, b"u" * 16}), (9, b"nine", {b"v" * 16})]
    assert queued(q) == {4: (b"four" * 999, 2), 5: (b"5", 1)}
    assert q._db is not None
    earlier_tables = "SELECT name FROM sqlite_master WHERE name IN ('journal', 'batches', 'journal_done')"
    assert q._db.execute(earlier_tables).fetchall() == []
    # New ids follow the old ones: journal_traces_done must not pair a new request with an old trace,
    # and the sender sends batches in id order.
    assert journal(q, b"new") > 9
    assert q._put([(b"six", 1)], [], []) == [6]
    q._close()


operations = st.lists(
    st.one_of(
        st.tuples(st.just("journal"), st.integers(0, 10_000)),
        st.tuples(st.just("release"), st.integers(0, 50)),
        st.tuples(st.just("queue"), st.integers(0, 10_000)),
        st.tuples(st.just("acknowledge"), st.integers(0, 50)),
        st.tuples(st.just("restart"), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops=operations)
def test_any_sequence_of_operations_gives_back_exactly_what_is_live(ops: list[tuple[str, int]]) -> None:
    """Requests and batches of any size through 4 KiB segments: rolls, reuse and compaction."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(segments, "SEGMENT_BYTES", 4096)
        path = Path(tmp) / "q.sqlite"
        q = opened(path)
        live: dict[int, bytes] = {}
        batches: dict[int, tuple[bytes, int]] = {}
        for n, (op, arg) in enumerate(ops):
            body = bytes([n % 251]) * arg
            if op == "journal":
                live[journal(q, body)] = body
            elif op == "queue":  # releasing a journaled request when there is one, as the processor does
                released = [sorted(live)[arg % len(live)]] if live else []
                put = [(body[: arg // (i + 1)], n + i) for i in range(1 + arg % 3)]  # one to three batches
                batches.update(zip(q._put(put, [], released), put, strict=True))
                for jid in released:
                    del live[jid]
            elif op == "release" and live:
                jid = sorted(live)[arg % len(live)]
                q._release([jid])
                del live[jid]
            elif op == "acknowledge" and batches:
                batch_id = sorted(batches)[arg % len(batches)]
                q._delete([batch_id])
                del batches[batch_id]
            elif op == "restart":
                q._close()
                q = opened(path)
                assert {jid: body for jid, body, _ in q._journaled()} == live
        q._close()
        q = opened(path)
        assert {jid: body for jid, body, _ in q._journaled()} == live and queued(q) == batches
        assert q.unreadable == []
        q._close()


async def test_requests_journaled_together_go_in_one_write_and_each_gets_its_own_id(tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite"
    q = DiskQueue(path)
    await q.open()
    writes: list[int] = []
    write = q._journal

    def counted(bodies: list[bytes]) -> list[int]:
        writes.append(len(bodies))
        return write(bodies)

    q._journal = counted  # type: ignore[method-assign]
    bodies = [os.urandom(n) for n in range(1000, 1020)]
    ids = [await q.journal(bodies[0])]  # alone: written at once
    first = asyncio.ensure_future(q.journal(bodies[1]))
    await asyncio.sleep(0)  # its write is on the storage thread: the others wait for the next
    ids += [await first, *await asyncio.gather(*(q.journal(body) for body in bodies[2:]))]
    assert writes == [1, 1, 18]
    assert len(set(ids)) == len(bodies)
    await q.close()
    q = opened(path)
    assert q._journaled() == [(i, body, set()) for i, body in sorted(zip(ids, bodies, strict=True))]
    q._close()


async def test_a_failed_journal_write_fails_its_group_and_the_next_group_is_written(tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite"
    q = DiskQueue(path)
    await q.open()
    write, failures = q._journal, [OSError(28, "No space left on device")]

    def failing_once(bodies: list[bytes]) -> list[int]:
        if failures:
            raise failures.pop()
        return write(bodies)

    q._journal = failing_once  # type: ignore[method-assign]
    first = asyncio.ensure_future(q.journal(b"first"))
    await asyncio.sleep(0)  # its write is on the storage thread: the next two make a group
    rest = [asyncio.ensure_future(q.journal(body)) for body in (b"second", b"third")]
    with pytest.raises(OSError, match="No space left"):
        await first
    second, third = await asyncio.gather(*rest)
    await q.close()
    q = opened(path)
    assert q._journaled() == [(second, b"second", set()), (third, b"third", set())]
    q._close()
