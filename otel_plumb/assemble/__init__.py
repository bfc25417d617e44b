"""Assemble stage: normalised spans -> trajectories.

``buffers`` groups spans per trace (and per session) with bounded memory and decides when a
trace is complete; ``trajectory`` orders the spans of one group into steps. Both are pure:
the caller supplies the clock, so replay and the live processor share them.
"""

from otel_plumb.assemble.buffers import AddOutcome, Assembler, AssemblyLimits, Finished, Tombstone
from otel_plumb.assemble.trajectory import build_trajectory

__all__ = ["AddOutcome", "Assembler", "AssemblyLimits", "Finished", "Tombstone", "build_trajectory"]
