"""Verdicts at run time that overrule an op's registered policy (registry.py):
NeedsEager sends one call to eager CPU; FAILED, every later call of an op.
"""
from __future__ import annotations

from ..core.state import PROCESS

# -- state: lowerings that failed in this process ------------------------------------
# ids of ops whose lowering failed; the engine, which handles the failure, adds
# them, and the frontend then runs later calls eagerly at once.
FAILED: set[int] = PROCESS.seen("lowerings.verdicts: failed lowerings", 1 << 12,
                                "ops whose lowering failed here run eagerly at record time, not again at the sync")


def remember_failure(op) -> None:
    FAILED.add(id(op))


class NeedsEager(Exception):
    """A verdict at run time: eager torch, not XLA, must compute this call
    (data-dependent output shape, an argument XLA would treat differently)."""
