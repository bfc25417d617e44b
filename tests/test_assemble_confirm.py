"""A complete trace taken back to wait for late spans (``Assembler.wait_for_late_spans``): a
span of it arriving in the wait is part of its trajectory, a resend is still a duplicate, and
it is let go once more, never held twice."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_assemble import ns

from otel_plumb.assemble import AddOutcome, Assembler, AssemblyLimits, Finished


def _decided_once(asm: Assembler) -> Finished:
    asm.add(ns("b", "a", 1), "pb", now=0.0, fingerprint=7, size=100)
    asm.add(ns("a", None, 0), "pa", now=0.0, fingerprint=8, size=50)
    (done,) = asm.due(1.0)
    assert done.complete and not done.waited and asm.is_decided("t1")
    return done


def test_a_span_arriving_in_the_wait_is_taken_in_and_the_trace_let_go_when_the_wait_ends() -> None:
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=100, confirm_wait_s=5.0))
    done = _decided_once(asm)
    assert asm.wait_for_late_spans(done, 1.0)
    assert not asm.is_decided("t1") and asm.traces_in_flight == 1
    assert (asm.spans_buffered, asm.bytes_buffered) == (2, 150)
    assert asm.due(3.0) == []
    # a resend of a span it had is a duplicate; a new span is taken
    assert asm.add(ns("b", "a", 1), "again", now=3.0, fingerprint=7)[0] is AddOutcome.DUPLICATE
    assert asm.add(ns("c", "a", 2), "pc", now=3.0, fingerprint=9, size=10)[0] is AddOutcome.ACCEPTED
    assert asm.due(4.0) == []  # idle after the late span, but late spans may still come: the wait goes on
    assert asm.add(ns("d", "a", 3), "pd", now=4.5, fingerprint=10, size=0)[0] is AddOutcome.ACCEPTED  # and one does
    assert asm.due(5.9) == []
    (again,) = asm.due(6.0)  # the end of the wait
    assert again.waited and again.complete
    assert [s.span_id for s in again.spans] == ["b", "a", "c", "d"] and again.payloads == ["pb", "pa", "pc", "pd"]
    assert again.size == 160 and (asm.spans_buffered, asm.bytes_buffered) == (0, 0)
    assert not asm.wait_for_late_spans(again, 6.0)  # once only
    assert asm.is_decided("t1") and asm.traces_in_flight == 0
    assert asm.add(ns("c", "a", 2), "pc", now=5.0, fingerprint=9)[0] is AddOutcome.DUPLICATE


def test_a_span_arriving_at_the_end_of_the_wait_gets_its_idle_timeout() -> None:
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=100, confirm_wait_s=5.0))
    assert asm.wait_for_late_spans(_decided_once(asm), 1.0)
    asm.add(ns("c", "a", 2), None, now=5.5)
    assert asm.due(6.0) == [] and asm.due(6.4) == []
    (again,) = asm.due(6.5)
    assert [s.span_id for s in again.spans] == ["b", "a", "c"]


def test_without_a_late_span_the_trace_is_let_go_at_the_end_of_the_wait() -> None:
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=100, confirm_wait_s=5.0))
    done = _decided_once(asm)
    assert asm.wait_for_late_spans(done, 1.0)
    asm.add(ns("x", None, 0, trace="t2"), None, now=2.0)  # another trace, due before the wait ends
    assert [f.key for f in asm.due(3.0)] == ["t2"]
    assert asm.due(5.9) == []
    (again,) = asm.due(6.0)
    assert again.key == "t1" and again.waited and len(again.spans) == 2


def test_a_waiting_trace_is_still_let_go_at_max_wait_and_when_drained() -> None:
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=3.0, confirm_wait_s=5.0))
    assert asm.wait_for_late_spans(_decided_once(asm), 1.0)
    assert [(f.key, f.incomplete_reason) for f in asm.due(3.0)] == [("t1", "max_wait")]
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=100, confirm_wait_s=5.0))
    assert asm.wait_for_late_spans(_decided_once(asm), 1.0)
    assert [(f.key, f.complete) for f in asm.drain(2.0)] == [("t1", True)]


def test_only_complete_traces_not_in_sessions_wait() -> None:
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=2.0, confirm_wait_s=5.0))
    asm.add(ns("b", "a", 1), None, now=0.0)
    asm.add(ns("d", "x", 1), None, now=0.0)  # two top spans: a root is missing
    (cut,) = asm.due(2.0)  # let go at max_wait: incomplete
    assert not cut.complete and not asm.wait_for_late_spans(cut, 2.0)
    assert asm.is_decided("t1")
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, group_by="session", session_idle_timeout_s=1.0,
                                   confirm_wait_s=5.0))  # fmt: skip
    asm.add(ns("a", None, 0, session_id="s1"), None, now=0.0)
    assert asm.due(1.0) == []  # its trace is done; the session idles
    (session,) = asm.due(2.0)
    assert session.complete and not asm.wait_for_late_spans(session, 2.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 2), st.integers(0, 5), st.booleans()),
    st.tuples(st.just("tick"), st.floats(0.1, 3.0), st.booleans()),
), max_size=40))  # fmt: skip
def test_however_traces_are_taken_back_every_span_is_let_go_once(ops: list[tuple[Any, ...]]) -> None:
    """Spans of three traces arrive, resent and late, between ticks; any trace let go may be
    taken back to wait. Every span taken is in exactly one trajectory let go for good, and
    nothing stays buffered."""
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=8.0, confirm_wait_s=2.0, decided_ttl_s=1e9))
    now = 0.0
    taken: set[tuple[str, str]] = set()
    let_go: list[tuple[str, str]] = []

    def finish(done: list[Finished], wait: bool) -> None:
        for f in done:
            if wait and asm.wait_for_late_spans(f, now):
                continue
            let_go.extend((f.key, s.span_id) for s in f.spans)

    for op in ops:
        if op[0] == "add":
            _, trace, span, root = op
            tid, sid = f"t{trace}", "root" if root else f"s{span}"
            outcome, evicted = asm.add(ns(sid, None if root else "root", span, trace=tid), None, now)
            if outcome is AddOutcome.ACCEPTED:
                taken.add((tid, sid))
            finish(evicted, False)
        else:
            _, step, wait = op
            now += step
            finish(asm.due(now), wait)
    finish(asm.drain(now), False)
    assert sorted(let_go) == sorted(taken)  # each once
    assert (asm.spans_buffered, asm.bytes_buffered, asm.traces_in_flight, asm.traces_waiting) == (0, 0, 0, 0)


def test_to_make_room_a_trace_waiting_for_late_spans_goes_first_and_complete() -> None:
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=100, max_traces=2, confirm_wait_s=5.0))
    assert asm.wait_for_late_spans(_decided_once(asm), 1.0)
    asm.add(ns("x", None, 0, trace="t2"), None, now=1.5)  # in flight, older than the next
    _, let_go = asm.add(ns("y", None, 0, trace="t3"), None, now=2.0)
    assert [(f.key, f.complete, f.waited) for f in let_go] == [("t1", True, True)]
    assert asm.evictions == {} and asm.traces_in_flight == 2
