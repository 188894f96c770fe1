"""The stages of a sync, as plain values: cut -> plan -> key -> executable -> run.

`cut` takes the graph that computes some tensors out of the pending IR;
`plan` decides which buffers the execution donates and in which order the
graph returns its outputs (a pure function: it returns a new graph and can be
tested without JAX); the key (keys.compute_key) is computed from the planned
graph; the engine then finds or compiles the executable and runs it. Each stage
is a function of its inputs, so each can be called and tested alone.
"""
from __future__ import annotations

import collections
import dataclasses

from ..core.ir import Graph, Node, build_graph, operand_data, pending_nodes


@dataclasses.dataclass(frozen=True)
class Cut:
    """A graph cut out of the pending IR, and what each of its roots is."""

    graph: Graph
    roots: list[tuple[Node, int]]   # the node output behind each graph root, in root order
    labels: list[str | None]        # per root: the label of the tensor it computes, if any
    marks: list | None = None       # its sharding marks (sharding.constraints), where known without a walk
    updates: tuple | None = None    # per root, the param it is an update of (Plan.updates), where known so


@dataclasses.dataclass(frozen=True)
class Plan:
    """A cut with its donation decided: the graph's roots in the order JAX pairs donors with outputs."""

    graph: Graph
    roots: list[tuple[Node, int]]
    donors: tuple[int, ...]         # donated parameter indices, sorted
    note: str                       # why nothing (or not more) is donated
    updates: tuple | None = None    # per cut root, the param it is an update of (updated_from), or None


def cut(targets, live, *, full: bool) -> Cut:
    """The graph that computes `targets` (LiveValues with pending nodes). A
    partial sync also returns the values it computes that pending work outside
    it still reads (no extra computation), so later graphs start from them."""
    roots, labels, seen = [], [], set()
    for t in targets:
        if (id(t.node), t.index) not in seen:
            seen.add((id(t.node), t.index))
            roots.append((t.node, t.index))
            labels.append(t.label)
    graph = build_graph(roots)
    if not full:
        kept = read_later(graph, live)
        if kept:
            roots += kept
            labels += [None] * len(kept)
            graph = build_graph(roots)
    for p in graph.params:
        if p.donated:
            raise RuntimeError(
                f"xlakit internal error: {p} was donated but a pending graph still reads it. "
                "Please report this with the program that caused it."
            )
    return Cut(graph, roots, labels)


def read_later(graph: Graph, live) -> list[tuple[Node, int]]:
    """Outputs of `graph`'s nodes that live tensors, or pending IR outside the
    graph, still read. A partial sync returns them too, so later graphs start
    from them instead of computing them again: a decode loop that reads one
    flag per token would otherwise recompute every earlier token in each step,
    in an ever larger graph."""
    placed = {n: pos for pos, n in enumerate(graph.nodes)}
    inside = len(placed)
    found = set()
    for v in live:
        if v.node is not None and v.node in placed:
            found.add((placed[v.node], v.index))
    for node in pending_nodes([v.node for v in live if v.node is not None], placed):
        for operand in node.operands:
            # pending operands only; every pending producer is placed by now, a computed one never
            if operand.__class__ is tuple and placed.get(operand[0], inside) < inside \
                    and operand_data(operand) is None:
                found.add((placed[operand[0]], operand[1]))
    found.difference_update(graph.roots)
    return [(graph.nodes[pos], index) for pos, index in sorted(found)]


# -- the one rule of what may be donated, for lazy steps and compiled calls alike -----------
@dataclasses.dataclass(frozen=True)
class Holders:
    """What holds the buffers an execution could donate: per buffer (by id) the live tensors that
    hold it, counted per tensor (a clone shares its source's value, and holds its buffer too),
    and the buffers read by pending work outside the execution or fed to it twice."""

    tensors: collections.Counter
    read: frozenset = frozenset()


def holders(values, read=frozenset()) -> Holders:
    """`values`: the LiveValue of each live tensor, once per tensor."""
    return Holders(collections.Counter(id(v.data) for v in values if v.data is not None), frozenset(read))


STILL_HELD, STILL_READ, READ_ONLY = "still held", "still read", "read-only"


def why_not_donated(buffer, held: Holders, *, kept_by_update: int) -> str | None:
    """None where `buffer` may be donated: writable, held by no live tensor but the
    `kept_by_update` its update goes to, and read by nothing else. A lazy step's updated
    tensors already hold their pending updates (0); a compiled call's input still holds the
    buffer its graph updates in place (1). Else why not."""
    if buffer.read_only:
        return READ_ONLY
    if held.tensors[id(buffer)] > kept_by_update:
        return STILL_HELD
    if id(buffer) in held.read:
        return STILL_READ
    return None


def plan(cut: Cut, live, *, full: bool, donate: bool) -> Plan:
    """Donate a buffer iff this is a step marker, `why_not_donated` finds no reason
    (writable, no live tensor still holds it: `live`, the live tensors' values, may
    be deduplicated here, where any one holder keeps a buffer), and an output of the
    same shape and dtype can take its place.

    JAX aliases each output to the earliest unused donor of its shape, in output
    order; a parameter's buffer given to, say, a gradient that is written while
    the parameter is still read makes XLA copy donors first (measured on an
    MLP's AdamW step: 32 copies, execution 16.8 ms; paired by label: 3 copies,
    11.6 ms). So a donor goes to the output with its own label (the same
    parameter or optimizer state, updated), else to the output updated from it
    (`updated_from`: nothing names a function's parameters under
    torch.compile), and the roots are ordered so that JAX's pairing is this
    plan's pairing. A donated input's sharding passes to its output
    (sharding.plan): paired by shape alone, a sharded weight took over another
    tensor's layout and the next step compiled again. Labels and chains only
    choose the pairing: the key holds the resulting root order and donors, so
    the key alone still determines the executable.
    """
    graph = cut.graph
    if not full:
        return Plan(graph, cut.roots, (), "partial sync: never donates")
    if not donate:
        return Plan(graph, cut.roots, (), "donation turned off (xlakit.config.donate)")
    held = holders(live)
    root_avals = [node.avals[i] for node, i in cut.roots]  # graph.root_avals, read off the nodes at hand
    param_of = {id(p): i for i, p in enumerate(graph.params)}
    # a replayed cut's are its recording's (engine/tape.py): the same graph, its chains not walked again
    updates = cut.updates if cut.updates is not None else tuple(updated_from(*root, param_of) for root in cut.roots)
    by_update, by_label = {}, {}
    for k, (i, label) in enumerate(zip(updates, cut.labels)):
        if i is not None and graph.params[i].aval == root_avals[k]:
            by_update.setdefault(i, k)
        if label is not None:
            by_label.setdefault((label, root_avals[k]), k)
    taken: dict[int, int] = {}  # output -> donor
    candidates, still_read, read_only = [], 0, 0
    for i, p in enumerate(graph.params):
        why = why_not_donated(p, held, kept_by_update=0)
        if why == READ_ONLY:
            read_only += 1
        elif why is not None:
            still_read += 1
        else:
            k = by_label.get((p.label, p.aval)) if p.label is not None else None
            if k is None or k in taken:
                k = by_update.get(i)
            if k is not None and k not in taken:
                taken[k] = i
            else:
                candidates.append(i)
    free = collections.defaultdict(list)
    for k in range(len(graph.roots)):
        if k not in taken:
            free[root_avals[k]].append(k)
    unpaired = 0
    for i in candidates:  # the rest go to any free output of their shape
        outputs = free[graph.params[i].aval]
        if outputs:
            taken[outputs.pop(0)] = i
        else:
            unpaired += 1
    paired = sorted(taken, key=taken.get)
    order = paired + [k for k in range(len(graph.roots)) if k not in taken]
    reasons = []
    if still_read:
        reasons.append(f"{still_read} input(s) still referenced by live tensors")
    if read_only:
        reasons.append(f"{read_only} read-only input(s) (constants, scalars)")
    if unpaired:
        reasons.append(f"{unpaired} input(s) with no output of the same shape and dtype to reuse the buffer")
    planned = dataclasses.replace(graph, roots=[graph.roots[k] for k in order])
    return Plan(planned, [cut.roots[k] for k in order], tuple(sorted(taken.values())), "; ".join(reasons), updates)


CHAIN_LIMIT = 32  # ops between a root and its input: an optimizer's update of a parameter takes 2-6


def updated_from(node: Node, index: int, param_of: dict[int, int]) -> int | None:
    """The graph input (by position; `param_of`: id of a parameter -> it) that output `index` of
    `node` is an update of: an in-place op's functional form takes the old value first
    (add(self, other), lerp(self, end, weight)) and keeps its shape and dtype, and a `_foreach_`
    op's i-th output is its i-th first list's; the chain of those from a root back to an input.
    None where it reaches none, or passes a value of another shape or dtype (a gradient's
    matmul, whose first operand leads back to a weight, is no update of it)."""
    aval = node.avals[index]
    for _ in range(CHAIN_LIMIT):
        operands = node.operands
        if not operands or node.avals[index] != aval:
            return None
        operand = operands[index] if len(node.avals) > 1 and index < len(operands) else operands[0]
        data = operand_data(operand)
        if data is not None:
            i = param_of.get(id(data))
            return i if data.aval == aval else None
        node, index = operand
    return None
