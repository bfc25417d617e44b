"""A child process for tests/test_compiled_core.py: reads pickled lists of SpanRecords from
stdin, one length-prefixed frame each, and writes for each the canonical text of what the core
makes of them (every normalised span's fields, the trajectory and its verdicts, or what was
raised), also length-prefixed. Run with OTEL_PLUMB_PURE_PYTHON=1 for the interpreted core, and
with the same PYTHONHASHSEED for both: the text shows sets."""

from __future__ import annotations

import dataclasses
import pickle
import sys
from pathlib import Path
from typing import Any

import otel_plumb
from otel_plumb.assemble import build_trajectory
from otel_plumb.check import decide, load_policy
from otel_plumb.check.early import EarlyWatch, in_flight, new_early_failures
from otel_plumb.model.span import SpanRecord
from otel_plumb.model.trajectory import NormalisedSpan
from otel_plumb.normalise import normalise
from otel_plumb.report.records import decided_record

POLICIES = [load_policy(Path(__file__).parent / "fixtures" / "compiled_core_policy.yaml")]
WATCH = EarlyWatch(POLICIES)
FIELDS = [f.name for f in dataclasses.fields(NormalisedSpan)]


def canonical(spans: list[SpanRecord]) -> str:
    out: list[Any] = []
    normalised: list[NormalisedSpan] = []
    for span in spans:
        try:
            n = normalise(span)
        except Exception as exc:  # the same input must raise the same way in both
            out.append(["raised", type(exc).__name__, str(exc)])
            continue
        normalised.append(n)
        out.append([repr(getattr(n, name)) for name in FIELDS])
    try:
        state = WATCH.state()
        for n in normalised:
            state.add(n)
        out.append(["may fail", WATCH.may_fail(state, set())])
        partial = in_flight(build_trajectory("t", normalised, complete=False, incomplete_reason="in_flight"))
        early = new_early_failures(POLICIES, partial, set(), None, WATCH, state.services)
        out.append(["early", [repr(v) for v in early]])
        decided = decide(POLICIES, build_trajectory("t", normalised))
        out.append(decided_record(decided))
    except Exception as exc:
        out.append(["raised", type(exc).__name__, str(exc)])
    return repr(out)  # not JSON: a value from a span may be a dict with tuple keys


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(otel_plumb.core().encode().ljust(16))
    stdout.flush()
    while header := stdin.read(8):
        spans = pickle.loads(stdin.read(int.from_bytes(header, "big")))
        text = canonical(spans).encode()
        stdout.write(len(text).to_bytes(8, "big") + text)
        stdout.flush()


if __name__ == "__main__":
    main()
