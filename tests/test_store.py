"""The trajectory store: every filter against a plain Python filter of the same records
(property), keyset pages that neither skip nor repeat, retention by age and size, read-only
opening, and a live processor filling it with what it decided (redacted)."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_live_support import config, decide_demo_agent

from otel_plumb.demo.run import policy_path
from otel_plumb.model import SEVERITIES
from otel_plumb.processor import Processor
from otel_plumb.store import Filters, QueryError, StoreConfig, StoreWriter, TrajectoryStore

POLICIES = ("pay", "refund")
INVARIANTS = ("must-check", "no-double", "amount")
STATUSES = ("conformant", "violating", "indeterminate", "unchecked")


@st.composite
def records(draw: st.DrawFn, index: int) -> dict[str, Any]:
    status = draw(st.sampled_from(STATUSES))
    verdicts = []
    if status != "unchecked":
        for policy in draw(st.lists(st.sampled_from(POLICIES), min_size=1, max_size=2, unique=True)):
            for invariant in draw(st.lists(st.sampled_from(INVARIANTS), min_size=1, max_size=3, unique=True)):
                verdicts.append({
                    "policy": policy, "invariant": invariant,
                    "verdict": draw(st.sampled_from(["pass", "fail", "not_applicable", "indeterminate"])),
                    "severity": draw(st.sampled_from(SEVERITIES)), "step_index": None,
                })  # fmt: skip
    return {
        "trace_id": f"{index:032x}", "key": f"INV-{index % 7}", "agent": draw(st.sampled_from(["a", "b", None])),
        "service": draw(st.sampled_from(["svc1", "svc2"])), "status": status, "verdicts": verdicts, "steps": [],
    }  # fmt: skip


def expected(rows: list[tuple[float, dict[str, Any]]], f: Filters) -> list[str]:
    """The trace ids a filter must give, newest first, worked out without SQL."""
    out = []
    for at, r in rows:
        if any(getattr(f, k) is not None and r.get(k) != getattr(f, k) for k in ("status", "agent", "service", "key")):
            continue
        if (f.since is not None and at < f.since) or (f.until is not None and at >= f.until):
            continue
        vs = r["verdicts"]
        if f.policy is not None:
            vs = [v for v in vs if v["policy"] == f.policy]
        if f.invariant is not None:
            vs = [v for v in vs if v["invariant"] == f.invariant]
        if f.severity is not None:
            floor = SEVERITIES.index(f.severity)
            vs = [v for v in vs if v["verdict"] == "fail" and SEVERITIES.index(v["severity"]) <= floor]
        elif f.invariant is not None:
            vs = [v for v in vs if v["verdict"] == "fail"]
        if (f.policy or f.invariant or f.severity) and not vs:
            continue
        out.append((at, r["trace_id"]))
    return [t for _, t in sorted(out, reverse=True)]


@st.composite
def filters(draw: st.DrawFn) -> Filters:
    pick = lambda values: draw(st.sampled_from([None, *values]))  # noqa: E731
    since = draw(st.sampled_from([None, 3.0, 10.0]))
    return Filters(
        policy=pick(POLICIES), invariant=pick(INVARIANTS), severity=pick(SEVERITIES), status=pick(STATUSES),
        agent=pick(["a", "b"]), service=pick(["svc1", "svc2"]), key=pick(["INV-1", "INV-3"]), since=since,
        until=draw(st.sampled_from([None, 15.0])),
    )  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_every_filter_and_page_gives_what_a_plain_filter_gives(tmp_path_factory: pytest.TempPathFactory,
                                                                data: st.DataObject) -> None:  # fmt: skip
    store = TrajectoryStore(tmp_path_factory.mktemp("store") / "t.sqlite")
    n = data.draw(st.integers(0, 40))
    rows = []
    for i in range(n):
        at = float(data.draw(st.integers(0, 20)))  # ties in time on purpose: pages must still be exact
        record = data.draw(records(i))
        store.add([record], "live", decided_at=at)
        rows.append((at, record))
    for _ in range(4):
        f = data.draw(filters())
        limit = data.draw(st.integers(1, 7))
        got, cursor, pages = [], None, 0
        while True:
            items, cursor = store.find(f, limit=limit, cursor=cursor)
            assert len(items) <= limit
            got += [i["trace_id"] for i in items]
            pages += 1
            if cursor is None:
                break
            assert pages <= n + 1
        assert got == expected(rows, f)
    store.close()


def test_one_trajectory_by_id_trace_or_key_and_bad_queries(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path / "t.sqlite")
    record = {"trace_id": "ab" * 16, "key": "INV-9", "status": "violating", "steps": [{"name": "<script>"}],
              "verdicts": [{"policy": "p", "invariant": "i", "verdict": "fail", "severity": "high"}]}  # fmt: skip
    store.add([record], "replay", run_id="r1", decided_at=5.0)
    by_trace = store.get("ab" * 16)
    assert by_trace is not None and by_trace["steps"][0]["name"] == "<script>" and by_trace["source"] == "replay"
    assert store.get("INV-9") == by_trace == store.get(str(by_trace["id"]))
    assert store.get("nothing") is None
    with pytest.raises(QueryError, match="cursor"):
        store.find(Filters(), cursor="not-a-cursor")
    with pytest.raises(QueryError, match="limit"):
        store.find(Filters(), limit=0)
    with pytest.raises(QueryError, match="severity"):
        store.find(Filters(severity="urgent"))
    store.close()


def test_records_are_stored_compressed_and_uncompressed_ones_still_read(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    store = TrajectoryStore(path)
    steps = [{"index": i, "name": "execute_tool lookup_customer", "args": {"id": "C-1"}} for i in range(20)]
    record = {"trace_id": "cd" * 16, "key": "K-1", "status": "conformant", "steps": steps, "verdicts": []}
    store.add([record], "live", decided_at=1.0)
    assert (store.get("K-1") or {})["steps"] == steps
    store.close()
    db = sqlite3.connect(path)
    (blob,) = db.execute("SELECT record FROM decided").fetchone()
    assert len(blob) < len(json.dumps(record)) / 3  # twenty like steps
    # A row as an earlier version wrote it: the record as plain JSON.
    db.execute("UPDATE decided SET record = ?", (json.dumps(record).encode(),))
    db.commit()
    db.close()
    store = TrajectoryStore(path, readonly=True)
    stored = store.get("K-1")
    assert stored is not None and stored["steps"] == steps
    store.close()


def test_retention_by_age_and_by_size(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path / "t.sqlite")
    for i in range(300):
        # Arguments that do not compress, so the records fill pages.
        big = {"trace_id": f"{i:032x}", "status": "conformant", "verdicts": [],
               "steps": [{"args": random.Random(i).randbytes(2000).hex()}]}  # fmt: skip
        store.add([big], "live", decided_at=1000.0 + i)
    assert store.expire(max_age=100.0, max_bytes=1 << 30, now=1300.0) == 200  # older than 1200
    assert [r["trace_id"] for r in store.find(Filters(), limit=500)[0]][-1] == f"{200:032x}"
    before = store.bytes_used()
    limit = before // 3
    deleted = store.expire(max_age=1e9, max_bytes=limit, now=1300.0)
    assert deleted > 0 and store.bytes_used() <= limit
    newest = store.find(Filters(), limit=1)[0]
    assert newest[0]["trace_id"] == f"{299:032x}"  # the oldest went first
    store.close()


def test_the_console_opens_the_store_read_only(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    TrajectoryStore(path).close()
    reader = TrajectoryStore(path, readonly=True)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.add([{"trace_id": "x", "status": "conformant", "verdicts": []}], "live")
    reader.close()
    with pytest.raises(FileNotFoundError, match="no such store"):
        TrajectoryStore(tmp_path / "missing.sqlite", readonly=True)


def test_a_full_queue_drops_and_counts_and_never_waits(tmp_path: Path) -> None:
    outcomes: dict[str, int] = {}
    writer = StoreWriter(StoreConfig(path=str(tmp_path / "t.sqlite"), max_pending=3),
                         lambda o, n: outcomes.__setitem__(o, outcomes.get(o, 0) + n))  # fmt: skip
    # Not started: nothing takes from the queue.
    records = [{"trace_id": str(i), "status": "conformant", "verdicts": []} for i in range(5)]
    assert [writer.offer(records[:2]), writer.offer(records[2:])] == [2, 1] and outcomes == {"dropped": 2}
    writer.start()
    writer.stop()
    assert outcomes["written"] == 3
    reader = TrajectoryStore(tmp_path / "t.sqlite", readonly=True)
    assert len(reader.find(Filters())[0]) == 3
    reader.close()


def _counter() -> tuple[dict[str, int], Callable[[str, int], None]]:
    counts: dict[str, int] = {}
    return counts, lambda o, n: counts.__setitem__(o, counts.get(o, 0) + n)


def _until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.02)


def _record(i: int) -> dict[str, Any]:
    return {"trace_id": f"t{i}", "status": "conformant", "verdicts": []}


def test_a_store_that_cannot_be_opened_fails_at_start_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    writer = StoreWriter(StoreConfig(path=str(path)))
    with pytest.raises(OSError, match=r"store.path: cannot open .*store.sqlite as a trajectory store"):
        writer.start()
    writer.stop()  # nothing started: nothing to stop


def test_a_writer_process_that_dies_is_started_again_and_what_it_held_is_counted_failed(tmp_path: Path) -> None:
    counts, outcome = _counter()
    writer = StoreWriter(StoreConfig(path=str(tmp_path / "t.sqlite")), outcome)
    writer.start()
    try:
        assert writer.offer([_record(i) for i in range(3)]) == 3
        _until(lambda: counts.get("written") == 3)
        first = writer._process
        assert first is not None
        os.kill(first.pid, signal.SIGSTOP)  # two records reach it and are never answered
        writer.offer([_record(3), _record(4)])
        time.sleep(0.2)
        first.kill()
        first.wait()
        writer.offer([_record(5)])
        _until(lambda: counts.get("written") == 4 and counts.get("failed") == 2)
        assert writer._process is not None and writer._process.pid != first.pid
    finally:
        writer.stop()
    store = TrajectoryStore(tmp_path / "t.sqlite", readonly=True)
    assert sorted(i["trace_id"] for i in store.find(Filters())[0]) == ["t0", "t1", "t2", "t5"]
    store.close()


def test_a_batch_the_store_refuses_is_counted_failed_and_logged_and_writing_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    counts, outcome = _counter()
    writer = StoreWriter(StoreConfig(path=str(tmp_path / "t.sqlite")), outcome)
    writer.start()
    try:
        writer.offer([{"trace_id": {"not": "a string"}, "status": "conformant", "verdicts": []}])  # SQLite refuses it
        _until(lambda: counts.get("failed") == 1)
        writer.offer([_record(1)])
        _until(lambda: counts.get("written") == 1)
    finally:
        writer.stop()
    assert any("cannot write 1 trajectories to the store" in r.getMessage() for r in caplog.records)


def test_a_writer_whose_processor_was_killed_writes_what_it_has_and_exits(tmp_path: Path) -> None:
    """No writer process is left behind: it reads the end of its pipe."""
    script = f"""
import os, signal, sys, time
from otel_plumb.store import StoreConfig, StoreWriter
writer = StoreWriter(StoreConfig(path={str(tmp_path / "t.sqlite")!r}), lambda o, n: None)
writer.start()
writer.offer([{{"trace_id": f"t{{i}}", "status": "conformant", "verdicts": []}} for i in range(50)])
time.sleep(0.3)  # the frame is in the pipe
print(writer._process.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == -signal.SIGKILL, run.stderr
    pid = int(run.stdout.strip())

    def gone() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(") ")[1].startswith("Z")  # exited, not yet reaped by init
        except FileNotFoundError:
            return True

    _until(gone)
    store = TrajectoryStore(tmp_path / "t.sqlite", readonly=True)
    assert len(store.find(Filters(), limit=100)[0]) == 50
    store.close()


async def test_a_running_processor_stores_what_it_decided(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    redaction = {"patterns": ["email"], "paths": [{"path": "vendor", "action": "hash"}]}
    processor = Processor(config(tmp_path, policies=[str(policy_path())], store={"path": str(path)},
                                 redaction=redaction))  # fmt: skip
    await processor.start()
    try:
        decided = await decide_demo_agent(processor)
    finally:
        await processor.stop()
    store = TrajectoryStore(path, readonly=True)
    items, _ = store.find(Filters(), limit=500)
    assert sorted(i["trace_id"] for i in items) == sorted(d.trajectory.trace_id for d in decided)
    vendors: list[str] = []
    for d in decided:
        stored = store.get(d.trajectory.trace_id)
        assert stored is not None and stored["status"] == d.status
        assert [(v["invariant"], v["verdict"]) for v in stored["verdicts"]] == [
            (v.invariant, v.verdict) for v in d.verdicts
        ]
        vendors += [s["args"]["vendor"] for s in stored["steps"] if s["name"] == "check_vendor_status" and s["args"]]
    assert vendors and all(v.startswith("[hmac:") for v in vendors)  # what leaves the processor is redacted
    violating = {d.trajectory.trace_id for d in decided if d.status == "violating"}
    assert {i["trace_id"] for i in store.find(Filters(status="violating"), limit=500)[0]} == violating
    store.close()


def test_replay_and_campaign_runs_write_to_the_same_store(tmp_path: Path) -> None:
    """``replay --store`` adds its trajectories as a replay run; a campaign's trials land in the
    same tables of its own store file, once each even when a trial is saved again."""
    db = tmp_path / "console.sqlite"
    fixtures = sorted((Path(__file__).parent / "fixtures" / "ap").glob("*.jsonl"))
    done = subprocess.run(
        [sys.executable, "-m", "otel_plumb", "replay", *map(str, fixtures), "--policy", str(policy_path()),
         "--json", str(tmp_path / "r.json"), "--store", str(db)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert "stored" in done.stdout
    store = TrajectoryStore(db, readonly=True)
    items, _ = store.find(Filters(source="replay"), limit=500)
    assert sorted(i["trace_id"] for i in items) == sorted(t["trace_id"] for t in report["trajectories"])
    assert len({i["run_id"] for i in items}) == 1
    violating = [t["trace_id"] for t in report["trajectories"] if t["status"] == "violating"]
    assert sorted(i["trace_id"] for i in store.find(Filters(status="violating", source="replay"), limit=500)[0]) == (
        sorted(violating)
    )
    store.close()

    from otel_plumb.campaign.store import Store, TrialRow

    campaign = Store(db)
    record = report["trajectories"][0]
    row = TrialRow("t-1", "id-1", "naive", "INV-1", "v1", "baseline", 0, record["trace_id"], "ok")
    campaign.save_trial("run-1", row, record)
    campaign.save_trial("run-1", row, record)  # resumed: saved again
    campaign.close()
    store = TrajectoryStore(db, readonly=True)
    (stored,) = store.find(Filters(source="campaign", run_id="run-1"))[0]
    assert stored["trial_id"] == "t-1" and store.trial("run-1", "t-1") is not None
    store.close()


def test_records_json_cannot_hold_are_stored_as_text_with_their_batch(tmp_path: Path) -> None:
    """A tool's arguments may hold what orjson refuses: a 30-digit number, a Python repr's int
    keys, nesting 300 deep, a lone surrogate. Such a record is stored with those values as text,
    and the records offered with it are not lost."""
    deep: Any = "bottom"
    for _ in range(300):
        deep = [deep]
    odd = {"trace_id": "odd", "status": "violating", "verdicts": [],
           "steps": [{"args": {"amount": 10**30, "ids": {7: "x"}, "deep": deep, "to": "\ud800@x.org"}}]}  # fmt: skip
    plain = [{"trace_id": f"t{i}", "status": "conformant", "verdicts": []} for i in range(2)]
    outcomes, count = _counter()
    writer = StoreWriter(StoreConfig(path=str(tmp_path / "t.sqlite")), count)
    writer.start()
    assert writer.offer([plain[0], odd, plain[1]]) == 3
    writer.stop()
    assert outcomes.get("written") == 3, outcomes
    reader = TrajectoryStore(tmp_path / "t.sqlite", readonly=True)
    stored = reader.get("odd")
    assert stored is not None
    args = stored["steps"][0]["args"]
    assert args["amount"] == str(10**30) and args["ids"] == {"7": "x"} and args["to"] == "\\ud800@x.org"
    nested = args["deep"]
    while isinstance(nested, list):
        nested = nested[0]
    assert isinstance(nested, str) and json.loads(nested) is not None and "bottom" in nested  # the deepest, as text
    assert {r["trace_id"] for r in reader.find(Filters())[0]} == {"odd", "t0", "t1"}
    reader.close()
