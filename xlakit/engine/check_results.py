"""Reading a step's in-graph checks (checks.py), and what a failed check poisons.

A step's checks come back as one small array, read once per step: right after
the execution when config.wait_for_execution is set, otherwise at the next
read of a value or xlakit.wait(), so that tracing the next step still overlaps
this one. Until then the outputs that depend on a check are *waiting*; a later
step that reads one makes its own outputs that depend on it wait on the same
step (no sync for that either). Past UNREAD_LIMIT unread steps (a loop that
never reads), the older half's checks are read then, which waits for those
steps only: a passed step is forgotten; a failed one has every step read and
what depends on it poisoned there, and its exception is raised at the next
read, where it would have been.

When a check failed, every value that depends on it is poisoned with eager's
exception (reading it raises), and the rest of the step stands, as when a
node cannot be lowered (engine). One exception: a tensor the user made on the
device or named (tensor.own: `.to`, factories, module parameters, optimizer
state, xlakit.label) that the step updated in place only with ops recorded
at or after the first failed op gets back its value from before the step, as
eager leaves it: eager stops at that op (a training step whose batch holds a
bad token id loses no weights). Where the step donated that old buffer, the
executable itself kept the old value in the aliased output (to_jax._as_jax),
so nothing is lost to donation either. A tensor updated before that op too,
or overwritten, held a value there that xlakit does not have: it is poisoned.
The same holds for such a tensor written after that op by ops that do not read
the failed op's result (nothing waits on the check there): given back where
its old buffer was not donated, poisoned where it was.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..core import sources
from ..core.checks import StepChecks
from ..core.ir import DeviceData, Graph, operand_data, pending_nodes

# Steps whose checks may stay unread (each holds its graph, ~50 KB).
UNREAD_LIMIT = 64
# `Ledger.bound`'s previous buffer of a user tensor whose value from before the step nothing
# holds any more (overwritten, or never computed): it has nothing to give back
GONE = object()


class Step:
    """One executed step whose check flags are not read yet. `nodes`: its
    GraphInfo's NodeInfos (for messages); `graph`: its Graph, where it is known."""

    def __init__(self, flags, checks: StepChecks, nodes, graph: Graph | None = None):
        self.flags, self.checks, self.nodes, self.graph = flags, checks.checks, nodes, graph
        self.failed = 0                   # after read(): the bit mask of the checks that failed
        self.errors: dict[int, Exception] = {}   # eager's exception per failed check

    @property
    def unread(self) -> bool:
        return self.flags is not None

    def read(self) -> Exception | None:
        """Read the flags (once; later calls repeat the outcome); eager's exception
        for the first failed check, or None."""
        if self.unread:
            rows, self.flags = np.asarray(self.flags), None
            for k in np.flatnonzero(rows[:, 0] == 0).tolist():
                check = self.checks[k]
                node = self.nodes[check.node]
                self.errors[k] = check.exception(int(rows[k, 1]), node.op, sources.describe(node.source))
                self.failed |= 1 << k
            if not self.failed:  # only a failed step's graph is needed (messages, poisoning)
                self.graph = self.nodes = None
        return self.error(self.failed)

    def error(self, mask: int) -> Exception | None:
        """The exception of the failed check among those in `mask` whose op was recorded first
        (eager stops at the first bad op it runs), or of the first in check order without a graph."""
        failed = [k for k in self.errors if (self.failed & mask) >> k & 1]
        if not failed:
            return None
        if self.graph is None:
            return self.errors[min(failed)]
        return self.errors[min(failed, key=lambda k: self.graph.nodes[self.checks[k].node].seq)]

    def first_failed(self, mask: int) -> int:
        """The recording order (Node.seq) of the earliest op among the failed checks in `mask`."""
        return min(self.graph.nodes[check.node].seq for k, check in enumerate(self.checks)
                   if (self.failed & mask) >> k & 1)


class Ledger:
    """The steps whose checks are not read yet, and per device buffer the
    checks its value waits on, as (step, bit mask) pairs, with the value to
    give back if one of them failed."""

    def __init__(self):
        self.steps: list[Step] = []
        # per waiting buffer: (the (step, mask) pairs it waits on, those a later step that reads it
        # waits on too, the buffer its tensor held before the step, its step if the executable kept
        # that old value in it should one of its own checks fail, the node it is an output of)
        self.waiting: weakref.WeakKeyDictionary[DeviceData, tuple] = weakref.WeakKeyDictionary()
        # per user tensor's buffer that a step with checks wrote without waiting on them:
        # (the step, the buffer its tensor held before, the node it is an output of)
        self.written: weakref.WeakKeyDictionary[DeviceData, tuple] = weakref.WeakKeyDictionary()
        # steps added since `waiting` was last brought up to date: a step whose checks are
        # read right after it ran (config.wait_for_execution) needs `waiting` only if one failed
        self._added: list = []
        # per user tensor (tensor.own), the buffer of its last computed value: held weakly,
        # a buffer nothing reads any more is not kept for this
        self.latest: weakref.WeakValueDictionary[int, DeviceData] = weakref.WeakValueDictionary()
        # the exception of a step that failed when its checks were read early (read_oldest),
        # for the next read to raise
        self.failure: Exception | None = None
        # after a failed read: the recording order (Node.seq) of the op eager stopped at
        self.stopped_at: int | None = None

    def unread(self) -> bool:
        """Whether the next read has checks to read or a failure to raise."""
        return bool(self.steps) or self.failure is not None

    def bound(self, outputs: list[DeviceData], targets) -> list:
        """A step's results were bound to `targets` (LiveValues): note each user
        tensor's new buffer; returns per output the buffer its tensor held before
        (GONE where none is held; None for an output that is no user tensor's)."""
        owned = {id(t.data): t for t in targets if t.owner is not None and t.data is not None}
        previous = []
        for data in outputs:
            t = owned.get(id(data))
            previous.append(None if t is None else GONE if t.previous is None else t.previous)
            if t is not None:
                self.latest[t.owner], t.previous = data, None
        return previous

    def inherited(self, graph: Graph) -> list[frozenset] | None:
        """Per root of `graph`, the unread checks of the outputs it reads (None: it reads none)."""
        self._settle()
        if not self.waiting:
            return None
        per_param = [_unread(self.waiting[p][1]) if p in self.waiting else frozenset() for p in graph.params]
        if not any(per_param):
            return None
        per_node = []
        for wires in graph.wiring:
            waits = frozenset()
            for w in wires:
                waits |= per_param[w] if w.__class__ is int else per_node[w[0]]
            per_node.append(waits)
        return [per_node[n] for n, _ in graph.roots]

    def add(self, graph: Graph, donors: tuple[int, ...], outputs: list[DeviceData], previous: list, checks: StepChecks,
            flags, nodes, inherited: list[frozenset] | None) -> None:
        """Record a step just run: `outputs` are its roots' buffers, `previous`
        what `bound` returned, `flags` its checks' output (None if it has none)."""
        step = None
        if checks.checks:
            step = Step(flags, checks, nodes, graph)
            self.steps.append(step)
        self._added.append((graph, donors, outputs, previous, step, checks.root_masks, inherited))

    def _settle(self) -> None:
        """Bring `waiting` up to date with the steps added."""
        for graph, donors, outputs, previous, step, masks, inherited in self._added:
            for k, data in enumerate(outputs):
                taint = frozenset(inherited[k]) if inherited else frozenset()
                own = frozenset({(step, masks[k])}) if step is not None and masks[k] else frozenset()
                if taint or own:
                    # a donated root that took its own old buffer holds that value if its step's
                    # check fails: valid either way, it taints no later step
                    kept = k < len(donors) and previous[k] is graph.params[donors[k]]
                    self.waiting[data] = (taint | own, taint if kept else taint | own, previous[k],
                                          step if kept else None, graph.nodes[graph.roots[k][0]])
                elif step is not None and previous[k] is not None:
                    self.written[data] = (step, previous[k], graph.nodes[graph.roots[k][0]])
        self._added.clear()

    def verify(self, live) -> Exception | None:
        """Read every unread step's checks; poison (or give back) the live
        values (`live()` lists them) that depend on a failed one. Returns the
        first failure's exception."""
        steps, self.steps = self.steps, []
        first, self.failure, self.stopped_at = self.failure, None, None
        for step in steps:
            error = step.read()
            first = first or error
        try:
            if any(step.failed for step in steps):
                self._settle()
                self._poison(steps, live())
        finally:
            self.waiting.clear()   # every step is read now
            self.written.clear()
            self._added.clear()
        return first

    def read_oldest(self, live) -> None:
        """Past UNREAD_LIMIT unread steps, read the older half's checks (module docstring)."""
        if len(self.steps) <= UNREAD_LIMIT:
            return
        oldest, self.steps = self.steps[:UNREAD_LIMIT // 2], self.steps[UNREAD_LIMIT // 2:]
        for step in oldest:
            if step.read() is not None:
                self.steps[:0] = oldest   # verify reads the rest and poisons
                self.failure = self.verify(live)
                return
        self._settle()
        for data, (waits, *_) in list(self.waiting.items()):
            if not _unread(waits):   # its value is checked now
                del self.waiting[data]
        for data, (step, *_) in list(self.written.items()):
            if not step.unread:
                del self.written[data]

    def _poison(self, steps: list[Step], live) -> None:
        order = {step: i for i, step in enumerate(steps)}
        # eager stops at the first bad op it runs: the earliest recorded among those that failed
        first = self.stopped_at = min(step.first_failed(step.failed) for step in steps if step.failed)
        bad = {}
        for data, (waits, _, previous, kept_by, node) in self.waiting.items():
            failed = [(step, mask) for step, mask in waits if step.failed & mask]
            if failed:
                step, mask = min(failed, key=lambda f: order[f[0]])
                back = previous if previous is not None and _updated_after(node, previous, first) else None
                kept = kept_by is not None and all(s is kept_by for s, _ in failed)
                bad[id(data)] = (step.error(mask), back, kept)
        for data, (step, previous, node) in self.written.items():
            if step.failed and id(data) not in bad and node.seq >= first:   # eager never wrote it
                bad[id(data)] = (step.error(step.failed), previous if _updated_after(node, previous, first) else None,
                                 False)
        for value in live:
            value.resolve()
            if value.data is not None and id(value.data) in bad:
                error, previous, kept = bad[id(value.data)]
                if previous is not None and kept:
                    pass   # the executable kept the old value in this very buffer
                elif previous is not None and previous.array is not None and id(previous) not in bad:
                    value.data = previous   # a tensor updated in place: its value before the step
                    if value.owner is not None:
                        self.latest[value.owner] = previous
                else:
                    value.fail(error)
            elif value.node is not None:
                error = _reads(value.node, bad)
                if error is not None:
                    value.fail(error)


def _unread(waits: frozenset) -> frozenset:
    """The (step, mask) pairs of steps whose checks are not read yet (a read one passed)."""
    return frozenset(pair for pair in waits if pair[0].unread)


def _updated_after(node, previous: DeviceData, first: int) -> bool:
    """Whether the in-place updates that made `node`'s output from `previous`
    were all recorded at or after the failed op `first`: then
    eager, stopped by that op, left the tensor at `previous`. An in-place op's
    functional form takes the old value first (add(self, other), index_put(self,
    ...)): the updates are the first-operand chain from root back to previous.
    A chain that does not reach previous (the tensor overwritten, e.g. by
    copy_) or that holds an earlier update gives nothing back: poisoned."""
    while True:
        if node.seq < first or not node.operands:
            return False
        operand = node.operands[0]
        data = operand_data(operand)
        if data is not None:
            return data is previous
        node = operand[0]


def _reads(node, bad: dict) -> Exception | None:
    """The error of a poisoned buffer that pending `node` reads (the first in
    dependency order), or None."""
    for n in pending_nodes([node]):
        for operand in n.operands:
            data = operand_data(operand)
            if data is not None and id(data) in bad:
                return bad[id(data)][0]
    return None
