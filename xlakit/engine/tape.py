"""Record once, replay under guards: each run of ops between two syncs is matched,
op by op, against the run that followed the same sync last time.

A training loop records the same ops every step. While an op arrives as the
expected one did (the same op and constants, operands with the same avals and
layouts, each read from the same earlier op's output or the same input), the
recorder reuses that op's inferred outputs and signature instead of inferring
and describing them again (front/recorder.py). At a step marker, when every op
of the run matched and the same outputs are live, the cut, key and donor pairing of
the run it matched are reused: no graph walk, no digest of the graph, no walk back
from each output to the input it updates (stages.Plan.updates). The first mismatch
records from that op on, so what is replayed is what recording would make; the
guard only decides how much work recording skips. Source lines are taken anew
for every op: a replayed node shows this step's lines, and the metadata digest
is recomputed when one differs.

A torch.compile graph recorded again into the step (integrations/compiled_call.py) is matched
as one op: the same graph, its operands read from the same places. A compiled training
step is then one run of three such graphs, its cut and key reused from the step before; the
run keeps each graph's `Instance` where its nodes go, and the marker reads the cut's inputs
through it (`_Placed.operand`), so a graph's nodes that no tensor holds are never made.

Runs are found by the sync that began them (its trigger and line): a loop that
reads its loss with `.item()` mid-step alternates two runs, each matched with its
own. What such a partial sync left pending (transformers' models read a mask with
`.item()` after the embedding) the run after it reads by its position counted back
into the run before (a negative position), guarded by the operand's aval as well,
since that run may have differed; the marker's cut reaches into it only when that
run was the same as last time (`lineage`) and left the same nodes pending. What
a run keeps is per op (`Expected`), never the previous step's nodes or buffers
(a partial sync's run keeps its nodes until the sync after it), bounded by
`LIMIT` ops per run and `RUNS` runs.

Recording costs each op ~20% more than not, so a run is recorded only where one
may follow it: from the second run a sync begins (the first of a cell or a loop
runs as before, the second records, the third replays), and where the runs after
a sync keep differing (three in a row mostly recorded, not replayed), ever more
seldom: one in 2, 4, 8, 16.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import functools

import torch

from ..core import sources, transfer
from ..core.ir import Aval, DeferredNode, DeviceData, Graph, Instance, Node, Slot, operand_data
from ..core.record import Replay
from ..core.state import Memo
from . import keys, stages

LIMIT = 1 << 17   # ops per run kept for matching; a longer run records the rest
RUNS = 16         # runs kept, by the sync that began them; the oldest go first
BACKOFF = 16      # where runs keep differing, at least one in this many is recorded


class Expected:
    """One op as it was recorded: what the next run's op at its position must match,
    and what recording it gave (reused when it does).

    slots: per operand, where it came from: ("n", position, output) an earlier op
    of the run (negative: of the run before it, see Run.position); the run's ordinal-th distinct input buffer, as ("d", ordinal) a
    device tensor's, ("f", ordinal) a Python float's or ("c", ordinal) a CPU
    scalar tensor's (lifted: transfer.lifted_scalar); ("x",) anything else,
    which never matches."""

    __slots__ = ("op", "template", "slots", "layouts_in", "avals_in", "default_dtype", "avals", "structure",
                 "signature", "layouts", "source")  # layouts: per output, None where contiguous from offset 0

    def __init__(self, op, template, slots, layouts_in, avals_in, default_dtype, avals, structure, signature,
                 layouts, source):
        self.op, self.template, self.slots, self.layouts_in, self.avals_in = op, template, slots, layouts_in, avals_in
        self.default_dtype, self.avals, self.structure, self.signature = default_dtype, avals, structure, signature
        self.layouts, self.source = layouts, source


class _GraphNode:
    """One node of a compiled graph recorded again (ir.instantiate, integrations/compiled_call.py):
    the graph is matched as a whole, at its first node (`first`), by the graph's identity and
    where its operands come from (`slots`, as Expected's). No recorded op matches it."""

    __slots__ = ("op", "graph", "slots", "source", "first")

    def __init__(self, graph: Graph, slots: tuple, source, first: bool):
        self.op, self.graph, self.slots, self.source, self.first = _COMPILED_NODE, graph, slots, source, first


_COMPILED_NODE = "a compiled graph's node"  # _GraphNode.op: never an op the recorder sees


@dataclasses.dataclass
class _CutMemo:
    """What the marker of a fully matched run made, to be made again without a walk."""

    roots: tuple            # per cut root: (position, output, label)
    positions: list[int]    # the graph's nodes, by run position
    param_uses: list        # per param: (graph node, operand) that first reads it
    wiring: list
    graph_roots: list
    labels: list            # the params' labels (metadata)
    donors: tuple
    planned_roots: list     # the roots in the order the plan gave them
    flags: dict
    key: keys.Key
    updates: tuple | None           # per root, the param it updates (stages.Plan.updates)
    before_lineage: object = None   # positions < 0 read the run before: its lineage then
    before_nodes: tuple = ()        # the graph's nodes of that run (each must still be pending)


class Run:
    """The ops recorded between two syncs, matched against the run that followed the same sync before."""

    def __init__(self, start, expected: Run | None, *, recording: bool = True, why: str = "",
                 before: Run | None = None):
        self.start = start                       # the sync that began it: (trigger, line)
        self.expected = expected                 # the run it is matched against, or None
        self.before = before                     # the run a partial sync ended just before it, or None
        self.kept = False                        # ended by a partial sync: its nodes kept for the next run
        self.lineage = None                      # set at its close: its expected's if it matched it whole
        self.recording = recording               # False: its ops are only counted (see the module's doc)
        self.recorded: list[Expected] = []       # this run, as the next one will match it
        self.nodes: list[Node] = []              # dropped once it is closed and cut
        self.first_seq = -1
        self.inputs: dict[DeviceData, int] = {}  # input buffer -> ordinal; dropped with nodes
        self.input_avals: list[Aval] = []
        self._memo: _CutMemo | None = None
        self.ops = 0
        self.replayed = 0
        self.why = why or ("" if expected is not None else "no earlier run began at this step marker")
        self.sources_changed = False
        self.misses = 0                          # runs in a row at its sync, this one included, mostly recorded
        self.wait = 0                            # runs at its sync left unrecorded before one records again

    def position(self, node: Node) -> int | None:
        """The node's position in this run; negative in the run before it (-1 its last node);
        None if recorded elsewhere (earlier, or beside it)."""
        position = node.seq - self.first_seq
        nodes = self.nodes
        if 0 <= position < len(nodes) and (nodes[position] is node or _holds(nodes[position], node)):
            return position
        before = self.before
        if before is not None:
            nodes = before.nodes
            position = node.seq - before.first_seq
            if 0 <= position < len(nodes) and (nodes[position] is node or _holds(nodes[position], node)):
                return position - len(nodes)
        return None

    def replay(self) -> Replay:
        return Replay(replayed=self.replayed, recorded=self.ops - self.replayed, why=self.why if self.ops else "")

    # -- at the marker that closed it ------------------------------------------------
    def cut(self, targets) -> stages.Cut | None:
        """The marker's cut, made from the matched run's without a walk; None unless
        every op matched and the same outputs are to be computed."""
        memo = self._matched_memo()
        if memo is None:
            return None
        roots, labels, seen = [], [], set()
        for t in targets:
            position = self.position(t.node)
            if position is None:
                return None
            if (position, t.index) not in seen:
                seen.add((position, t.index))
                roots.append((position, t.index, t.label))
                labels.append(t.label)
        if tuple(roots) != memo.roots:
            return None
        earlier = ()
        if memo.before_lineage is not None:  # the same run before, and what its partial sync computed the same
            before = self.before
            if before is None or before.lineage is not memo.before_lineage:
                return None
            earlier = before.nodes
        graph_nodes = _Placed(self.nodes, earlier, memo.positions)
        for n in memo.before_nodes:
            if graph_nodes[n].results is not None:
                return None
        params = [operand_data(graph_nodes.operand(n, k)) for n, k in memo.param_uses]
        for p in params:
            if p.__class__ is not DeviceData or p.donated:
                return None  # the walk decides (stages.cut says what is wrong)
        graph = Graph(nodes=graph_nodes, params=params, roots=list(memo.graph_roots), wiring=memo.wiring)
        # no sharding marks: a cut is remembered only where it runs on one device (a mark places it on a mesh)
        return stages.Cut(graph, [(graph_nodes.at(p), i) for p, i, _ in roots], labels, marks=[], updates=memo.updates)

    def key(self, graph: Graph, donors: tuple, flags: dict) -> keys.Key | None:
        """The matched run's key, if this graph (made by `cut`) is planned as it was."""
        memo = self._matched_memo()
        if memo is None or donors != memo.donors or flags != memo.flags or graph.roots != memo.planned_roots:
            return None
        changed = self.sources_changed or (memo.before_lineage is not None and self.before.sources_changed)
        if not changed and [p.label for p in graph.params] == memo.labels:
            return memo.key
        return dataclasses.replace(memo.key, metadata_digest=keys.metadata_digest(graph))

    def _matched_memo(self) -> _CutMemo | None:
        if self.why or self.expected is None or len(self.recorded) != len(self.expected.recorded):
            return None
        return self.expected._memo

    def remember(self, cut: stages.Cut, planned: stages.Plan, flags, key) -> None:
        """Keep what the marker made of this run, for the next run that matches it."""
        if not self.recording:
            return
        memo = self._matched_memo()
        if memo is not None and key.key == memo.key.key and cut.graph.wiring is memo.wiring:  # made from it
            self._memo = memo if key is memo.key else dataclasses.replace(memo, key=key, labels=[
                p.label for p in cut.graph.params])
        else:
            self._memo = self._cut_memo(cut, planned, flags, key)

    def release(self) -> None:
        """After its sync: drop what only the sync needed (a partial sync's run keeps its
        nodes for the run after it, which drops them at its own sync)."""
        if self.before is not None:
            self.before.nodes = []
        self.inputs, self.expected, self.before = {}, None, None
        if not self.kept:
            self.nodes = []

    def back_off(self) -> None:
        """Count this recorded run as a miss when most of it was recorded, not replayed;
        the runs after a sync that keep missing are recorded ever more seldom."""
        missed = self.replayed * 2 < self.ops and self.expected is not None and bool(self.expected.recorded)
        self.misses = self.expected.misses + 1 if missed else 0
        self.wait = min(2 ** (self.misses - 2), BACKOFF) - 1 if self.misses > 2 else 0

    def _cut_memo(self, cut: stages.Cut, planned: stages.Plan, flags, key) -> _CutMemo | None:
        graph = cut.graph
        positions = [self.position(node) for node in graph.nodes]
        if None in positions:
            return None  # a node recorded before the run before it (kept pending by partial syncs)
        before_nodes = tuple(n for n, p in enumerate(positions) if p < 0)
        if any(graph.nodes[n].results is not None for n in before_nodes):
            return None  # partly computed by the partial sync: the walk decides
        roots = tuple((positions[n], i, label) for (n, i), label in zip(graph.roots, cut.labels))
        uses: dict[int, tuple[int, int]] = {}
        for n, wires in enumerate(graph.wiring):
            for k, w in enumerate(wires):
                if w.__class__ is int and w not in uses:
                    uses[w] = (n, k)
        return _CutMemo(roots=roots, positions=positions, param_uses=[uses[i] for i in range(len(graph.params))],
                        wiring=graph.wiring, graph_roots=list(graph.roots), labels=[p.label for p in graph.params],
                        donors=planned.donors, planned_roots=list(planned.graph.roots), flags=flags, key=key,
                        updates=planned.updates,
                        before_lineage=self.before.lineage if before_nodes else None, before_nodes=before_nodes)


class _Placed(collections.abc.Sequence):
    """A replayed cut's nodes, in graph order, read from the run's list where asked: the marker
    makes no list of the step's nodes (8000 a step: 0.3 ms), and only a step that is lowered
    or shown (a cache miss, a new source line) reads them all."""

    __slots__ = ("_nodes", "_earlier", "_positions")

    def __init__(self, nodes: list, earlier, positions: list[int]):
        self._nodes, self._earlier, self._positions = nodes, earlier, positions

    def at(self, position: int) -> Node:
        """The node at this run position (negative: of the run before)."""
        node = self._nodes[position] if position >= 0 else self._earlier[position]
        if node.__class__ is Instance:
            return node.node(self._offset(node, position))
        return node

    def operand(self, n: int, k: int):
        """Operand `k` of graph node `n`, read without making a compiled graph's nodes."""
        position = self._positions[n]
        node = self._nodes[position] if position >= 0 else self._earlier[position]
        if node.__class__ is Instance:
            return node.operand(self._offset(node, position), k)
        if node.__class__ is DeferredNode and node.instance is not None:
            return node.instance.operand(node.seq - node.instance.first_seq, k)
        return node.operands[k]

    def _offset(self, instance: Instance, position: int) -> int:
        return (position if position >= 0 else len(self._earlier) + position) - instance.start

    def __len__(self) -> int:
        return len(self._positions)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.at(p) for p in self._positions[i]]
        return self.at(self._positions[i])

    def __iter__(self):
        return map(self.at, self._positions)


class Tape:
    """The run being recorded, and the last run each sync began (what a new run is matched against)."""

    def __init__(self, values: dict, refs: dict):
        self._runs: Memo = Memo(RUNS)  # the sync that began a run -> the last run it began
        self._run = Run(None, None, recording=False)
        self._values = values          # the engine's registry: a tensor's TensorImpl -> its LiveValue
        self._refs = refs              # and -> its reference, with the layout it was made with (plain_layout)

    def clear(self) -> None:
        self._runs.clear()
        self._run = Run(None, None, recording=False)

    def size(self) -> int:
        return sum(len(r.recorded) for r in self._runs.values())

    # -- at record time ---------------------------------------------------------
    def replay(self, op, args, kwargs, check=None, skip: int = 1) -> tuple[Expected, Node] | None:
        """When the run it follows had `op` at this position on arguments from the same places:
        that recording (`Expected`) and the new node on this run's operands, recorded as
        replayed at the line `skip` frames up (sources.capture). Else None, and the run records
        from here on, saying why. `check(aval)`: what a fresh record checks against the op's
        first output (its Python scalars), run once the operands say that output is the
        recorded one; what it raises leaves the run as it found it. One call an op: the
        replayed op's Python is the step's (bench/tracing.py)."""
        run = self._run
        if run.why:
            return None
        position = len(run.recorded)
        if position >= len(run.expected.recorded):
            run.why = f"op {position} `{_name(op)}` is new: the run it follows had {position} ops"
            return None
        expected = run.expected.recorded[position]
        if expected.op is not op:
            run.why = f"op {position} is now `{_name(op)}`, was `{_name(expected.op)}`" + _at(expected)
            return None
        if expected.default_dtype is not torch.get_default_dtype():
            run.why = f"op {position} `{_name(op)}`: the default dtype changed" + _at(expected)
            return None
        inputs = len(run.inputs)
        operands = self._matched(expected, args, kwargs)
        if operands is None:
            return None
        if check is not None:
            try:
                check(expected.avals[0])
            except BaseException:
                self._forget_inputs(inputs)
                raise
        source = sources.capture(skip + 1)
        node = Node(op, operands, expected.template, expected.avals, source, expected.signature)
        run.ops += 1
        if run.first_seq < 0:
            run.first_seq = node.seq
        if position >= LIMIT:  # (a replayed run records, so it is one being recorded)
            run.why = f"the run is longer than {LIMIT} ops: the rest is recorded"
            return expected, node
        run.nodes.append(node)
        run.replayed += 1
        if source is not expected.source:
            run.sources_changed = True
        run.recorded.append(expected)
        return expected, node

    def _forget_inputs(self, count: int) -> None:
        """Forget the run's inputs after its first `count` (met by an op that then raised)."""
        run = self._run
        for data in list(run.inputs)[count:]:
            del run.inputs[data]
        del run.input_avals[count:]

    def _matched(self, expected: Expected, args, kwargs) -> tuple | None:
        template_args, template_kwargs = expected.template
        if len(args) != len(template_args) or len(kwargs) != len(template_kwargs):
            return self._mismatch(expected, "now has other arguments")
        operands = [None] * len(expected.slots)
        position = 0
        for value, want in zip(args, template_args):
            if not (self._same_operand(value, want.index, expected, operands) if want.__class__ is Slot
                    else self._same(value, want, expected, operands)):
                return self._mismatch(expected, _difference(position, value, want, expected))
            position += 1
        for name, want in template_kwargs:
            value = kwargs.get(name, _MISSING)
            if not self._same(value, want, expected, operands):
                return self._mismatch(expected, _difference(name, value, want, expected))
        return tuple(operands)

    def _same(self, value, want, expected: Expected, operands: list) -> bool:
        kind = want.__class__
        if kind is Slot:
            return self._same_operand(value, want.index, expected, operands)
        if kind is tuple:
            if not (isinstance(value, (list, tuple)) and len(value) == len(want)):
                return False
            for v, w in zip(value, want):  # a loop, not all(...): a size's ints compared here, no call each
                if not (v.__class__ is int and v == w if w.__class__ is int else self._same(v, w, expected, operands)):
                    return False
            return True
        if value.__class__ is not kind:
            return False
        if kind is float or kind is complex:  # exact: 0.0 == -0.0, yet 1 / x tells them apart
            return transfer.scalar_key(value) == transfer.scalar_key(want)
        return value == want

    def _same_operand(self, value, slot: int, expected: Expected, operands: list) -> bool:
        where = expected.slots[slot]
        kind = where[0]
        if value.__class__ is _LAZY:
            # LiveValue.operand(), inlined (this runs for every operand of every replayed op)
            key = value._cdata
            state = self._values[key]
            if state.error is not None:
                state.check_usable()  # raises as a fresh record does
            node = state.node
            if node is not None:
                results = node.results
                if results is not None and results[state.index] is not None:
                    state.resolve()
                    node = None
            if node is not None:
                index = state.index
                if kind != "n" or where[2] != index:
                    return False
                position = where[1]
                if position >= 0:
                    nodes = self._run.nodes
                    if position >= len(nodes) or nodes[position] is not node:
                        return False
                # the run before may have differed: its node's aval, as a fresh record would infer from
                elif self._run.position(node) != position or node.avals[index] != expected.avals_in[slot]:
                    return False
                operand = (node, index)
            else:
                operand = state.data
                if kind != "d" or not self._same_input(operand, where[1]):
                    return False
            # the layout it was made with (Engine.register): a LazyTensor's stride() and
            # storage_offset() cost 0.3 µs an operand, a tenth of a replayed op
            if self._refs[key].layout != expected.layouts_in[slot]:
                return False
        elif kind == "f" and value.__class__ is float:
            operand = transfer.lifted_scalar(value, expected.avals_in[slot].dtype)
            if not self._same_input(operand, where[1]):
                return False
        elif kind == "c" and isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() == 0 \
                and value.dtype == expected.avals_in[slot].dtype:
            operand = transfer.lifted_scalar(value.item(), value.dtype)
            if not self._same_input(operand, where[1]):
                return False
        else:
            return False
        operands[slot] = operand
        return True

    def _same_input(self, data: DeviceData, ordinal: int) -> bool:
        """Whether `data` is the run's ordinal-th input, as the expected run's was (by first use:
        f(a, a) and f(a, b) read one input and two)."""
        run = self._run
        seen = run.inputs.get(data)
        if seen is not None:
            return seen == ordinal
        known = run.expected.input_avals
        if ordinal != len(run.inputs) or ordinal >= len(known) or data.aval != known[ordinal]:
            return False
        run.inputs[data] = ordinal
        run.input_avals.append(data.aval)
        return True

    def _mismatch(self, expected: Expected, what: str) -> None:
        run = self._run
        where = sources.describe(sources.capture())
        run.why = (f"op {len(run.recorded)} `{_name(expected.op)}`: {what}" + (f" at {where}" if where else "")
                   + _at(expected, unless=where))

    def add(self, node: Node, *, template=None, tensors=(), structure=None, layouts=(), default_dtype=None) -> None:
        """Note a node recorded fresh (its operand tensors, template, ...); a replayed one: `replay`."""
        run = self._run
        run.ops += 1
        if run.first_seq < 0:
            run.first_seq = node.seq
        if not run.recording:  # its nodes only: the run after a partial sync may read them (Run.position)
            run.nodes.append(node)
            return
        if len(run.recorded) >= LIMIT:
            run.why = run.why or f"the run is longer than {LIMIT} ops: the rest is recorded"
            return
        run.nodes.append(node)
        slots, layouts_in, avals_in = [], [], []
        for t, operand in zip(tensors, node.operands):
            slots.append(self._slot(t, operand))
            # read off the tensor, not the registry: a layout recorded wrong never replays
            layouts_in.append(plain_layout(t.shape, (t.stride(), t.storage_offset())) if t.__class__ is _LAZY else None)
            avals_in.append(_aval_of(operand))
        layouts = tuple(layout if aval is None else plain_layout(aval.shape, layout)
                        for layout, aval in zip(layouts, node.avals))
        run.recorded.append(Expected(node.op, template, tuple(slots), tuple(layouts_in), tuple(avals_in),
                                     default_dtype, node.avals, structure, node.signature, layouts, node.source))

    def add_graph(self, graph: Graph, operands: list, instance: Instance) -> None:
        """Note `graph` (a structure) recorded again on `operands` (per param: device data or a
        pending (node, output)) as `instance`: replayed, as one, if the run it follows recorded
        the same graph here on operands from the same places. The run keeps the instance's roots
        made so far, and the instance where its other nodes go (`_Placed` and `Run.position` read
        through it): nothing here makes them."""
        run = self._run
        size = len(graph.nodes)
        run.ops += size
        if not size:
            return
        if run.first_seq < 0:
            run.first_seq = instance.first_seq
        if run.recording and len(run.recorded) + size > LIMIT:
            run.why = run.why or f"the run is longer than {LIMIT} ops: the rest is recorded"
            return
        instance.start = len(run.nodes)
        run.nodes.extend(instance.entries())
        if not run.recording:
            return
        slots = tuple(self._graph_slot(operand) for operand in operands)
        position = len(run.recorded)
        if not run.why:
            expected = run.expected.recorded[position] if position < len(run.expected.recorded) else None
            same_graph = expected.__class__ is _GraphNode and expected.first and expected.graph is graph
            if same_graph and expected.slots == slots and ("x",) not in slots and self._same_new_inputs(run):
                run.replayed += size
                run.recorded.extend(run.expected.recorded[position:position + size])
                return
            if same_graph:
                run.why = f"op {position}: a compiled graph recorded again on inputs from other places"
            elif expected is not None:
                run.why = f"op {position}: a compiled graph recorded again where the run it follows had another op"
            else:
                run.why = f"op {position}: a compiled graph is new: the run it follows had {position} ops"
        run.recorded.extend(_GraphNode(graph, slots, node.source, k == 0) for k, node in enumerate(graph.nodes))

    def _graph_slot(self, operand) -> tuple:
        """Where a compiled graph's operand came from (see Expected.slots)."""
        if operand.__class__ is tuple:
            position = self._run.position(operand[0])
            return ("n", position, operand[1]) if position is not None and position >= 0 else ("x",)
        return ("d", self._ordinal(operand))

    @staticmethod
    def _same_new_inputs(run: Run) -> bool:
        """Whether the inputs this run has read so far have the avals the expected run's had."""
        known = run.expected.input_avals
        return len(run.input_avals) <= len(known) and run.input_avals == known[:len(run.input_avals)]

    def _slot(self, t, operand) -> tuple:
        """Where a recorded operand came from (see Expected.slots)."""
        if operand.__class__ is tuple:
            position = self._run.position(operand[0])
            return ("n", position, operand[1]) if position is not None and t.__class__ is _LAZY else ("x",)
        if t.__class__ is _LAZY:
            kind = "d"
        elif t.__class__ is float:
            kind = "f"
        elif isinstance(t, torch.Tensor) and t.dim() == 0 and t.device.type == "cpu":
            kind = "c"
        else:
            return ("x",)  # a CPU index tensor: uploaded anew each time
        return (kind, self._ordinal(operand))

    def _ordinal(self, data: DeviceData) -> int:
        """The run's number for an input buffer: distinct buffers in order of first use."""
        run = self._run
        ordinal = run.inputs.get(data)
        if ordinal is None:
            ordinal = run.inputs[data] = len(run.inputs)
            run.input_avals.append(data.aval)
        return ordinal

    # -- at a sync ----------------------------------------------------------------
    def close(self, start, *, full: bool) -> Run:
        """End the run at a sync, which `start`s the next one; the sync cuts and remembers the closed run.
        After a partial sync (`full` False) the next run may read what this one left pending."""
        run = self._run
        expected = run.expected
        whole = run.recording and not run.why and expected is not None and len(run.recorded) == len(expected.recorded)
        run.lineage = expected.lineage if whole else object()
        run.kept = not full
        before = run if run.kept else None
        if run.recording:
            run.back_off()
            self._runs[run.start] = run
        elif run.start not in self._runs:
            self._runs[run.start] = run  # the first run at its sync: the next one records
        last = self._runs.get(start)
        if last is None:
            self._run = Run(start, None, recording=False,
                            why="the first run of the code after this step marker: traced, not kept for replay")
        elif not last.recording:
            self._run = Run(start, last, why="the second run of the code after this step marker: kept, the next runs replay it",
                            before=before)
        elif last.wait == 0:
            self._run = Run(start, last, before=before)
        else:
            last.wait -= 1
            self._run = Run(start, last, recording=False,
                            why=f"not kept for replay: the last {last.misses} runs of the code after this step marker "
                                f"each differed from the one before")
        if not self._run.recording:
            run.kept = False  # nothing will read its nodes
        return run


_MISSING = object()
_LAZY = None   # front.tensor.LazyTensor (front imports engine, not the reverse): set_tensor_class


def set_tensor_class(cls) -> None:
    global _LAZY
    _LAZY = cls


def plain_layout(shape, layout):
    """A (strides, storage offset) layout as the tape keeps it: None where contiguous from offset 0
    (as a tensor made without strides is laid out), else (strides as a tuple, offset)."""
    if layout is None or layout[1] == 0 and tuple(layout[0]) == _contiguous(tuple(shape)):
        return None
    return tuple(layout[0]), layout[1]


@functools.lru_cache(maxsize=4096)
def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A new tensor's strides, as a tensor made without strides gets them: a replayed output of
    this layout is made so (Expected.layouts holds None), ~0.3 µs less an op."""
    return torch.empty(shape, device="meta").stride()


def _holds(entry, node: Node) -> bool:
    """Whether a run's entry that is not `node` is the Instance `node` was made by, expanded."""
    return entry.__class__ is Instance and entry.nodes is not None and 0 <= node.seq - entry.first_seq < len(
        entry.nodes) and entry.nodes[node.seq - entry.first_seq] is node


def _aval_of(operand) -> Aval | None:
    if operand.__class__ is tuple:
        return operand[0].avals[operand[1]]
    return operand.aval if operand.__class__ is DeviceData else None


def _name(op) -> str:
    return str(op).removesuffix(".default")


def _at(expected: Expected, unless: str = "") -> str:
    was = sources.describe(expected.source)
    return f" (recorded at {was})" if was and was != unless else ""


def _difference(argument, value, want, expected: Expected) -> str:
    """In words, how one argument differs from the expected one (once per run)."""
    if want.__class__ is Slot:
        was = expected.avals_in[want.index]
        if isinstance(value, torch.Tensor):
            now = Aval(tuple(value.shape), value.dtype)
            if was is not None and now != was:
                return f"argument {argument} now {now}, was {was}"
            layout = expected.layouts_in[want.index]
            strides = layout[0] if layout is not None else _contiguous(tuple(value.shape))
            if value.__class__ is _LAZY and value.stride() != strides:
                return f"argument {argument} now has strides {value.stride()}, was {strides}"
            return f"argument {argument} ({now}) now reads another value"
        return f"argument {argument} now {value!r}"
    return f"argument {argument} now {_plain(value)}, was {_plain(want)}"


def _plain(value):
    if value is _MISSING:
        return "(not given)"
    return repr(tuple(value) if isinstance(value, list) else value)  # as the template keeps it
