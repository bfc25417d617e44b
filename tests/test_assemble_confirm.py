"""A complete trace taken back to wait for late spans (``Assembler.wait_for_late_spans``): a
span of it arriving in the wait is part of its trajectory, a resend is still a duplicate, and
it is let go once more, never held twice."""

from __future__ import annotations

from test_assemble import ns

from otel_plumb.assemble import AddOutcome, Assembler, AssemblyLimits, Finished


def _decided_once(asm: Assembler) -> Finished:
    asm.add(ns("b", "a", 1), "pb", now=0.0, fingerprint=7, size=100)
    asm.add(ns("a", None, 0), "pa", now=0.0, fingerprint=8, size=50)
    (done,) = asm.due(1.0)
    assert done.complete and not done.waited and asm.is_decided("t1")
    return done


def test_a_span_arriving_in_the_wait_is_taken_in_and_the_trace_decided_idle_timeout_after_it() -> None:
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=100, confirm_wait_s=5.0))
    done = _decided_once(asm)
    assert asm.wait_for_late_spans(done, 1.0)
    assert not asm.is_decided("t1") and asm.traces_in_flight == 1
    assert (asm.spans_buffered, asm.bytes_buffered) == (2, 150)
    assert asm.due(3.0) == []
    # a resend of a span it had is a duplicate; a new span is taken
    assert asm.add(ns("b", "a", 1), "again", now=3.0, fingerprint=7)[0] is AddOutcome.DUPLICATE
    assert asm.add(ns("c", "a", 2), "pc", now=3.0, fingerprint=9, size=10)[0] is AddOutcome.ACCEPTED
    assert asm.due(3.9) == []
    (again,) = asm.due(4.0)  # idle_timeout after the late span, not the end of the wait
    assert again.waited and again.complete
    assert [s.span_id for s in again.spans] == ["b", "a", "c"] and again.payloads == ["pb", "pa", "pc"]
    assert again.size == 160 and (asm.spans_buffered, asm.bytes_buffered) == (0, 0)
    assert not asm.wait_for_late_spans(again, 4.0)  # once only
    assert asm.is_decided("t1") and asm.traces_in_flight == 0
    assert asm.add(ns("c", "a", 2), "pc", now=5.0, fingerprint=9)[0] is AddOutcome.DUPLICATE


def test_without_a_late_span_the_trace_is_let_go_at_the_end_of_the_wait() -> None:
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=100, confirm_wait_s=5.0))
    done = _decided_once(asm)
    assert asm.wait_for_late_spans(done, 1.0)
    asm.add(ns("x", None, 0, trace="t2"), None, now=2.0)  # another trace, due before the wait ends
    assert [f.key for f in asm.due(3.0)] == ["t2"]
    assert asm.due(5.9) == []
    (again,) = asm.due(6.0)
    assert again.key == "t1" and again.waited and len(again.spans) == 2


def test_a_waiting_trace_is_still_let_go_at_max_wait_by_eviction_and_when_drained() -> None:
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=3.0, confirm_wait_s=5.0))
    assert asm.wait_for_late_spans(_decided_once(asm), 1.0)
    assert [(f.key, f.incomplete_reason) for f in asm.due(3.0)] == [("t1", "max_wait")]
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=100, max_traces=1, confirm_wait_s=5.0))
    assert asm.wait_for_late_spans(_decided_once(asm), 1.0)
    _, evicted = asm.add(ns("y", None, 0, trace="t2"), None, now=2.0)
    assert [(f.key, f.complete) for f in evicted] == [("t1", False)]
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
