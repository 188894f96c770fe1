"""In-graph checks: what eager torch raises on, computed inside the step's executable.

XLA clamps, wraps or drops an out-of-range gather/scatter index, and an
integer division by zero gives a value, where eager torch raises. A lowering
states the condition eager checks (`require`); the step's executable returns
every check's flag, and its first offending value, as one small extra output
(lowerings/to_jax.py), which the engine reads once per step, when it waits for the
step's results, and turns into eager's exception. No host sync per op.

Which checks a graph has is a function of its structure, and whether checks
are on (config.checks) is in the key's `flags`: the key still determines the
executable.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Check:
    """One condition a node's lowering asked for."""

    node: int                              # the node's position in the graph (its op and source: the graph's)
    error: type[Exception]                 # what eager raises: IndexError, or RuntimeError
    message: str                           # eager's message; "{index}" stands for the offending value
    valid: tuple[int, int] | None = None   # the valid index range [low, high), when known
    # eager stops there (an assert): the nodes its graph places after it depend on it too, not
    # only those that read its operands, so what they update keeps its old value if it fails
    halts: bool = False

    def exception(self, bad: int, op: str, where: str) -> Exception:
        """Eager's exception, with the op, the offending value and the source line."""
        at = f"at {where}: " if where else ""
        detail = f", index {bad} outside [{self.valid[0]}, {self.valid[1]})" if self.valid else ""
        return self.error(f"{self.message.format(index=bad)} ({at}{op}{detail})")


@dataclasses.dataclass(frozen=True)
class StepChecks:
    """What tracing a graph found: its checks in order, and per graph root a
    bit mask of the checks that root depends on (bit k: checks[k])."""

    checks: tuple[Check, ...] = ()
    root_masks: tuple[int, ...] = ()


class Trace:
    """The checks found while tracing one graph: per check (Check, ok flag,
    offending value), the flags being tracers; per node, the bit mask of the
    checks its outputs depend on (bit k: the k-th check found). Every node traced
    after a check that halts depends on it: the engine cuts asserts first, so those are the
    nodes the assert does not need. By graph position, not by recording order, which the
    cache key does not hold: the key decides the executable, so its structure must decide
    the masks (a node recorded before the assert but not needed by it halts too)."""

    def __init__(self):
        self.found: list = []
        self.masks: dict[int, int] = {}   # per node position (a guard traces the nodes out of order)
        self._new = 0   # checks found before the node being traced
        self._halting = 0   # the bits of the checks found so far that halt
        self._all: dict = {}   # mask -> its all_ok (the donated outputs of a step mostly share one)

    def __bool__(self) -> bool:
        return bool(self.found)

    def depend(self, position: int, wires) -> int:
        """The mask of the node just traced, at `position`, whose operands come from `wires` (graph.wiring)."""
        mask = self._halting
        for k in range(self._new, len(self.found)):
            mask |= 1 << k
            if self.found[k][0].halts:
                self._halting |= 1 << k
        self._new = len(self.found)
        for w in wires:
            if w.__class__ is not int:
                mask |= self.masks[w[0]]
        self.masks[position] = mask
        return mask

    def all_ok(self, mask: int):
        """Whether the checks in `mask` all hold (a traced bool)."""
        if mask not in self._all:
            self._all[mask] = jnp.stack([ok for k, (_, ok, _) in enumerate(self.found) if mask >> k & 1]).all()
        return self._all[mask]

    def flags(self):
        """The executable's extra output: int64 [number of checks, 2], (ok, offending value) per check."""
        return jnp.stack([jnp.stack([ok.astype(jnp.int64), bad]) for _, ok, bad in self.found])

    def found_checks(self, roots) -> StepChecks:
        return StepChecks(tuple(c for c, _, _ in self.found), tuple(self.masks[n] for n, _ in roots))


class _Current(threading.local):
    trace: Trace | None = None
    node: int = -1


_CURRENT = _Current()


@contextlib.contextmanager
def collecting(trace: Trace | None):
    """Lowerings traced inside the block record their checks into `trace`
    (None: checks are off, `require` records nothing)."""
    before, _CURRENT.trace = _CURRENT.trace, trace
    try:
        yield
    finally:
        _CURRENT.trace = before


def on() -> bool:
    """Whether lowerings traced now record their checks."""
    return _CURRENT.trace is not None


def adopt(checks: list[Check] | None, flags) -> None:
    """File checks a node's lowering found apart (traced on its own, lowerings/to_jax.py),
    with their flags on this trace's tracers, under the node being lowered."""
    for check, (ok, bad) in zip(checks or (), flags):
        _CURRENT.trace.found.append((dataclasses.replace(check, node=_CURRENT.node), ok, bad))


def at_node(position: int) -> None:
    """The node whose lowering is traced next."""
    _CURRENT.node = position


def require(ok, error: type[Exception], message: str, *, index=None, valid: tuple[int, int] | None = None,
            halts: bool = False) -> None:
    """Eager raises `error(message)` unless `ok` (a boolean array) holds
    everywhere. `index`: the values checked (broadcastable to ok); the first
    one that fails is reported. `halts`: Check.halts."""
    trace = _CURRENT.trace
    ok = jnp.asarray(ok)
    if trace is None or ok.size == 0:
        return
    flat = ok.reshape(-1)
    first = jnp.argmin(flat)   # the first False, where there is one
    bad = jnp.zeros((), jnp.int64) if index is None else \
        jnp.broadcast_to(jnp.asarray(index), ok.shape).reshape(-1)[first].astype(jnp.int64)
    trace.found.append((Check(_CURRENT.node, error, message, valid, halts), flat.all(), bad))


def in_range(index, size: int, *, negative: bool):
    """Whether each index addresses one of `size` places: [-size, size) where
    eager wraps negative indices, [0, size) where it does not."""
    return ((index >= -size) if negative else (index >= 0)) & (index < size)
