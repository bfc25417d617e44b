"""The assembler's timers: a trace idle without a root, looked at once, waits out of the way
until a span of it arrives, and every completion rule still holds for it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_assemble import ns

from otel_plumb.assemble import Assembler, AssemblyLimits


def test_an_idle_rootless_trace_waits_then_completes_when_its_root_arrives() -> None:
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=100))
    asm.add(ns("b", "a", 1), None, now=0.0)
    asm.add(ns("c", "a", 2), None, now=0.0)
    asm.add(ns("d", "x", 3), None, now=0.0)  # a second top span: not one tree
    for t in (2.0, 3.0, 4.0):
        assert asm.due(t) == []
    asm.add(ns("a", None, 0), None, now=5.0)
    assert asm.due(5.5) == []  # idle only from the root's arrival on
    done = asm.due(6.0)
    assert [(f.key, f.complete, len(f.spans)) for f in done] == [("t1", True, 4)]
    assert asm.traces_in_flight == 0


def test_a_waiting_trace_is_still_let_go_at_max_wait_and_when_drained() -> None:
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=10))
    asm.add(ns("b", "a", 1), None, now=0.0)
    asm.add(ns("d", "x", 3), None, now=0.0)
    asm.add(ns("e", "y", 3, trace="t2"), None, now=0.0)
    asm.add(ns("f", "z", 3, trace="t2"), None, now=0.0)
    assert asm.due(2.0) == []
    asm.add(ns("g", "y", 4, trace="t2"), None, now=3.0)  # t2 back in the queue, waits again
    assert asm.due(5.0) == []
    assert [(f.key, f.incomplete_reason) for f in asm.due(10.0)] == [("t1", "max_wait"), ("t2", "max_wait")]
    asm.add(ns("h", "q", 1, trace="t3"), None, now=11.0)
    asm.add(ns("i", "r", 1, trace="t3"), None, now=11.0)
    assert asm.due(13.0) == []
    assert [f.key for f in asm.drain(14.0)] == ["t3"]


def _model_due(traces: dict[str, list[tuple[str, str | None, float]]], now: float, limits: AssemblyLimits) -> list:
    """The completion rules written out directly, looking at every trace on every tick."""
    out = []
    for key, spans in list(traces.items()):
        first, last = min(t for _, _, t in spans), max(t for _, _, t in spans)
        ids = {sid for sid, _, _ in spans}
        tops = sum(1 for _, parent, _ in spans if parent not in ids)
        rooted = any(parent is None for _, parent, _ in spans)
        if now - last >= limits.idle_timeout_s and (rooted or tops == 1):
            out.append((key, True, len(spans)))
        elif now - first >= limits.max_wait_s:
            out.append((key, False, len(spans)))
        else:
            continue
        del traces[key]
    return sorted(out)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(-1, 3), st.integers(0, 3)), min_size=1, max_size=40))
def test_each_tick_lets_go_what_the_completion_rules_say(events: list[tuple[int, int, int]]) -> None:
    """A tick at every arrival: the traces let go, complete or not, are those the rules name when
    every trace is looked at on every tick (parked or not)."""
    limits = AssemblyLimits(idle_timeout_s=2.0, max_wait_s=9)
    asm = Assembler(limits)
    model: dict[str, list[tuple[str, str | None, float]]] = {}
    decided: set[str] = set()
    now = 0.0
    for n, (trace, parent, gap) in enumerate(events):
        now += gap
        got = sorted((f.key, f.complete, len(f.spans)) for f in asm.due(now))
        want = _model_due(model, now, limits)
        assert got == want
        decided |= {k for k, _, _ in got}
        key = f"t{trace}"
        # parent -1: a root; else a span under s<parent> (in this trace or not: maybe a second top span)
        parent_id = None if parent < 0 else f"s{parent}"
        asm.add(ns(f"s{n}", parent_id, n, trace=key), None, now)
        if key not in decided:
            model.setdefault(key, []).append((f"s{n}", parent_id, now))
    for t in (now + 1, now + 3, now + 20):
        assert sorted((f.key, f.complete, len(f.spans)) for f in asm.due(t)) == _model_due(model, t, limits)
