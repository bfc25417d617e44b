"""Intake: the one way spans enter the core, for the live processor, replay and campaigns.

Decoded spans go in with where they came from (a ``Source``: a file, a request); the intake
normalises them, drops exact resends, records what could not be read, buffers them in the
assembler and hands back the traces that are due, as trajectories that say when their data
cannot be trusted whole.
"""

from otel_plumb.intake.intake import Intake, IntakeCounts, Source

__all__ = ["Intake", "IntakeCounts", "Source"]
