"""Numerics, computed inside a step's executable: where the first non-finite
value came from (config.check_nans) and how large each node's values got
(config.record_ranges).

With check_nans alone, a step's executable only *guards* its outputs (`Guard`):
per floating output, whether it holds a NaN or an infinity, one read of each
output, and it donates as any step does. Only a step whose outputs hold one runs
the per-node search below, in a second executable on the same inputs, which the
guard kept (engine/numerics.py): the search reduces every value the step makes,
which on the GPU nearly doubled the Llama step (+90%), where the guard reads the
outputs alone. JAX's jax_debug_nans works the same way: it checks a jitted
function's outputs, and runs it again op by op only when they hold a NaN. So a
NaN the step makes and then drops (`where(x > 0, x.log(), 0)`) is not reported,
as eager would not notice it either.

Per floating value of the step (an input, a node's output): whether it holds
a NaN, whether it holds an infinity, its min and its max. A node is an
*origin* when it made a NaN from inputs that hold none, or an infinity from
inputs that are all finite, unless its own arguments ask for one
(masked_fill(mask, -inf), full(nan)). Of the origins, the first in recording
order is picked in-graph (the ranks are constants of the executable;
keys.compile_flags keys them), and the min and max of its first inputs are
gathered with it: one small float32 vector per step,

    [position or -1, kind (1: NaN, 2: infinity), min 0, max 0, min 1, max 1, ...]

then, with ranges, the absolute maximum of each node's floating outputs (NaN
for a node that has none). engine/numerics.py reads it back.
Nothing here changes a value the step computes.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from ..core.ir import Graph, Node, op_name
from .factories import FILLS

# Inputs of the first origin whose ranges are reported.
INPUTS = 4


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a numerics output holds (kept with the executable): the first origin
    (`nans`), each node's absolute maximum (`ranges`), or, alone, one flag per
    floating output (`guard`)."""

    nans: bool
    ranges: bool
    guard: bool = False

    @property
    def nans_size(self) -> int:
        return 2 + 2 * INPUTS if self.nans else 0


# Ops that only move, copy or select values: they make no NaN or infinity, so none
# is an origin, and their outputs' stats are their floating inputs' (no reduction of
# their own). A NaN a slice leaves out still counts as an input's: it was made
# earlier, by an origin found first, or came with the step's inputs.
MOVES = frozenset({
    "view", "view_copy", "_unsafe_view", "reshape", "t", "t_copy", "transpose", "transpose_copy", "permute",
    "permute_copy", "expand", "expand_copy", "slice", "slice_copy", "select", "select_copy", "unsqueeze",
    "unsqueeze_copy", "squeeze", "squeeze_copy", "alias", "alias_copy", "clone", "cat", "stack",
    "slice_backward", "select_backward", "embedding", "index_select", "gather", "as_strided", "as_strided_copy",
    "split", "split_copy", "split_with_sizes", "split_with_sizes_copy", "unbind", "unbind_copy", "repeat",
    "flip", "roll", "diagonal", "diagonal_copy", "narrow", "narrow_copy", "detach", "detach_copy",
    "lift_fresh_copy", "unfold", "unfold_copy", "mark_sharding",
})


# Ops whose values do not depend on their operands' values (only on their shapes).
SHAPE_ONLY = FILLS | {"rand_like", "randn_like", "fill", "new_empty_strided", "empty_strided", "arange",
                      "linspace", "logspace", "eye"}


def _floating(aval) -> bool:
    return aval is not None and aval.dtype.is_floating_point


def _stats(x):
    """(code, min, max) of one array, as float32. Code 2 where it holds a NaN, else
    1 where it holds an infinity, else 0.5 where it holds the dtype's largest
    magnitude, else 0 (XLA's min and max on CPU skip a NaN that comes first, so
    they cannot say). A NaN hides an infinity beside it, which an origin never
    needs: a NaN-free array is one whose infinities are known. The largest
    magnitude and the infinities are the fill values of masks (transformers fills
    a causal mask with finfo.min), which say nothing of how close computed values
    came to overflowing: the min and max leave them out. One variadic reduction,
    one pass over the array (three separate ones doubled the bytes XLA's cost
    analysis counts on the quick Llama step of bench/numerics.py: 4.1e8 against 1.9e8)."""
    if x.size == 0:
        return jnp.float32(0), jnp.float32(0), jnp.float32(0)
    largest = np.array(jnp.finfo(x.dtype).max, x.dtype)
    computed = jnp.abs(x) < largest   # False for NaN and infinities too
    code = jnp.where(computed, 0, jnp.where(jnp.isnan(x), 2, jnp.where(jnp.isinf(x), 1, 0.5))).astype(x.dtype)
    inf = np.array(np.inf, x.dtype)
    code, low, high = jax.lax.reduce((code, jnp.where(computed, x, inf), jnp.where(computed, x, -inf)),
                                     (np.array(0, x.dtype), inf, -inf),
                                     lambda a, b: (jnp.maximum(a[0], b[0]), jnp.minimum(a[1], b[1]),
                                                   jnp.maximum(a[2], b[2])), tuple(range(x.ndim)))
    return code.astype(jnp.float32), low.astype(jnp.float32), high.astype(jnp.float32)


class Guard:
    """check_nans alone: a step that donates as usual and keeps what a search needs.

    The donated buffers are written by the step's in-place updates (an optimizer's
    step); once written, the step's inputs are gone. So the graph is traced in two
    parts: first every node that reads no donated update's result (the forward,
    the backward), then the rest (`order`). Between the two, one flag says whether
    the first part's outputs, and the values it hands to the second part (the
    gradients an optimizer reads), are all finite; each donated output then takes
    its new value only where they are, and keeps its old one otherwise (a select
    fused into the update, as a failed check's). A NaN or infinity made before the
    updates therefore leaves the step's inputs intact, and the engine searches the
    step on them (engine/numerics.py). A NaN made inside the updates themselves, from
    finite values, finds them written: it is reported by the outputs that hold it.
    An assert that reads a donated update's result halts every node traced after it
    (core/checks.py): such a graph keeps its order, and its updates keep nothing."""

    def __init__(self, graph: Graph, donors: tuple[int, ...]):
        self.graph = graph
        self.donated = {root: donor for root, donor in zip(graph.roots, donors)}
        updated = {node for node, _ in self.donated}
        tainted = []   # per node: whether it reads a donated update's result (or is one)
        for position, wires in enumerate(graph.wiring):
            tainted.append(position in updated or any(w.__class__ is not int and tainted[w[0]] for w in wires))
        if any(t and op_name(graph.nodes[k].op) == "_assert_async" for k, t in enumerate(tainted)):
            tainted = [False] * len(tainted)
        self.tainted = tainted
        self.order = [k for k, t in enumerate(tainted) if not t] + [k for k, t in enumerate(tainted) if t]
        self.first_update = next((k for k in self.order if tainted[k]), None)
        donated_params = set(donors)
        # per node: whether it computes from a donated buffer's old value and the step's inputs alone
        # (AdamW's param * (1 - lr * wd), exp_avg_sq * beta2): a NaN it makes is one of the updates',
        # and leaving it out saves a read of the whole optimizer state (XLA's bytes accessed on the
        # Llama step of bench/numerics.py: +13.4% over off with it, +8.1% without, as much as the
        # guard that donated nothing)
        local: list[bool] = []
        for position, wires in enumerate(graph.wiring):
            local.append(not tainted[position] and all(w.__class__ is int or local[w[0]] for w in wires)
                         and any(w in donated_params if w.__class__ is int else local[w[0]] for w in wires))
        # the floating values the first part hands to the second, roots aside
        roots = set(map(tuple, graph.roots))
        boundary = set()
        for position, wires in enumerate(graph.wiring):
            if tainted[position]:
                for w in wires:
                    if w.__class__ is int:
                        if w not in donated_params and _floating(graph.params[w].aval):
                            boundary.add(w)
                    elif not tainted[w[0]] and not local[w[0]] and tuple(w) not in roots \
                            and _floating(_aval(graph, w)):
                        boundary.add(tuple(w))
        self.boundary = sorted(boundary, key=lambda w: (-1, w) if w.__class__ is int else w)
        self._flags: dict[int, jax.Array] = {}   # per root index of the first part: its flag

    def keep(self, outputs: list, params) -> jax.Array:
        """Whether the first part's outputs and the values it hands on are all finite (traced
        once every node of the first part is)."""
        constant = constant_nodes(self.graph)
        found = []
        for k, ((position, i), aval) in enumerate(zip(self.graph.roots, self.graph.root_avals)):
            if _floating(aval) and not self.tainted[position]:
                self._flags[k] = _nonfinite(outputs[position][i], constant[position])
                found.append(self._flags[k])
        for w in self.boundary:
            found.append(_nonfinite(params[w], False) if w.__class__ is int
                         else _nonfinite(outputs[w[0]][w[1]], constant[w[0]]))
        return ~jnp.any(jnp.stack(found)) if found else jnp.bool_(True)

    def output(self, roots, keep) -> jax.Array:
        """Per floating root, 1 where it holds a NaN or an infinity; then 1 where the donated
        outputs kept their old values (float32)."""
        constant = constant_nodes(self.graph)
        flags = [self._flags[k] if k in self._flags else _nonfinite(root, constant[position])
                 for k, ((position, _), root, aval) in enumerate(zip(self.graph.roots, roots, self.graph.root_avals))
                 if _floating(aval)]
        kept = jnp.bool_(False) if keep is None else ~keep
        return jnp.stack([*flags, kept]).astype(jnp.float32)


def _nonfinite(value, constant: bool) -> jax.Array:
    if constant:   # not folded at compile time: see Watch._of
        value = jax.lax.optimization_barrier(value)
    return jnp.any(~jnp.isfinite(value))


def constant_nodes(graph: Graph) -> list[bool]:
    """Per node, whether its values follow from constants alone (a factory, or ops on factories' values)."""
    constant: list[bool] = []
    for node, wires in zip(graph.nodes, graph.wiring):
        constant.append(op_name(node.op) in SHAPE_ONLY or all(w.__class__ is not int and constant[w[0]] for w in wires))
    return constant


def _asks_for_nonfinite(node: Node) -> bool:
    """Whether a constant argument of the node is itself NaN or infinite (a mask fill)."""
    args, kwargs = node.template
    return any(isinstance(v, float) and not math.isfinite(v) for v in (*args, *(v for _, v in kwargs)))


class Watch:
    """Collects, while a graph is traced (to_jax._as_jax), what its numerics output needs:
    one (code, min, max) per floating value, and per node the values it reads and
    makes, by index. The per-node logic runs once, on arrays, in `output`: as scalar
    ops per node it was ~20 HLO ops a node, which tripled the Llama step's compile time."""

    def __init__(self, graph: Graph, ranks: tuple[int, ...] | None, ranges: bool):
        self.graph, self.ranks, self.ranges = graph, ranks, ranges
        self._stats: list = []        # per value: _stats
        self._index: dict = {}        # value (param index or (node, output)) -> the indices of its stats
        self._constant = constant_nodes(graph)
        # per node position (a search traces nodes in its guard's order): the stats indices of its
        # floating outputs, and of its floating operands (() for a move)
        self._makes: dict[int, tuple] = {}
        self._reads: dict[int, tuple] = {}
        # per candidate origin: (node position, stats indices of all its floating inputs, of each of its first
        # INPUTS operands)
        self._candidates: list = []

    def layout(self) -> Layout:
        return Layout(self.ranks is not None, self.ranges)

    def _of(self, where, array) -> tuple[int, ...]:
        if where not in self._index:
            if where.__class__ is not int and self._constant[where[0]]:
                # XLA would fold the reduction of a constant at compile time, in its slow evaluator
                # (measured: 10 s for one Llama zeros_like); computed when the step runs instead
                array = jax.lax.optimization_barrier(array)
            self._index[where] = (len(self._stats),)
            self._stats.append(_stats(array))
        return self._index[where]

    def _read(self, wires, operands) -> list[tuple[int, ...]]:
        """Per operand, the indices of its stats (() where it is not floating)."""
        return [self._of(w if w.__class__ is int else tuple(w), o) if _floating(_aval(self.graph, w)) else ()
                for w, o in zip(wires, operands)]

    def node(self, position: int, wires, operands: list, results: list) -> None:
        node = self.graph.nodes[position]
        if op_name(node.op) in MOVES:
            sources = tuple(i for ids in self._read(wires, operands) for i in ids)
            if sources:
                for i, aval in enumerate(node.avals):
                    if _floating(aval):
                        self._index[(position, i)] = sources
                self._makes[position] = ()   # counted where the values were made
                self._reads[position] = ()
                return
        makes = tuple(i for k, (r, aval) in enumerate(zip(results, node.avals))
                      if r is not None and _floating(aval) for i in self._of((position, k), r))
        self._makes[position] = makes
        reads = self._read(wires, operands)
        self._reads[position] = tuple(i for ids in reads for i in ids)
        if self.ranks is None or not makes or not wires or _asks_for_nonfinite(node):
            return   # a factory's values are constants
        self._candidates.append((position, self._reads[position], reads[:INPUTS]))

    def output(self):
        """The step's numerics vector (module docstring)."""
        # the stats, and one more entry that pads index arrays: finite, empty
        codes = jnp.stack([s[0] for s in self._stats] + [jnp.float32(0)])
        lows = jnp.stack([s[1] for s in self._stats] + [jnp.float32(jnp.inf)])
        highs = jnp.stack([s[2] for s in self._stats] + [jnp.float32(-jnp.inf)])
        pad = len(self._stats)
        parts = []
        if self.ranks is not None:
            parts.append(self._first_origin(codes, lows, highs, pad))
        if self.ranges:
            positions = range(len(self.graph.nodes))
            made = _padded([self._makes[p] for p in positions], pad)
            read = _padded([self._reads[p] for p in positions], pad)
            absmax = jnp.max(jnp.maximum(-lows[made], highs[made]), axis=1)
            # NaN for a node that made no floating value, made it from constants alone (a mask's
            # zeros, which would read as an underflow), or read a mask's fill (scores + mask: its
            # values are the mask's, a hair inside the dtype's largest)
            left_out = (absmax < 0) | jnp.any(codes[read] > 0, axis=1) | jnp.asarray(self._constant)
            parts.append(jnp.where(left_out, jnp.nan, absmax))
        return jnp.concatenate(parts)

    def _first_origin(self, codes, lows, highs, pad):
        if not self._candidates:
            return jnp.asarray([-1.0, 0.0] + [np.nan] * (2 * INPUTS), jnp.float32)
        positions = [p for p, _, _ in self._candidates]
        made, read = _padded([self._makes[p] for p in positions], pad), _padded([c[1] for c in self._candidates], pad)
        in_nan, in_inf = jnp.any(codes[read] == 2, axis=1), jnp.any(codes[read] == 1, axis=1)
        new_nan = jnp.any(codes[made] == 2, axis=1) & ~in_nan
        origin = new_nan | (jnp.any(codes[made] == 1, axis=1) & ~in_nan & ~in_inf)
        never = len(self.ranks)
        ranks = jnp.where(origin, jnp.asarray([self.ranks[p] for p in positions]), never)
        pick = jnp.argmin(ranks)
        seen = ranks[pick] < never
        # the picked node's first operands: each the min and max over the values it holds
        operands = [list(c[2]) + [()] * (INPUTS - len(c[2])) for c in self._candidates]
        width = max(1, max(len(ids) for c in operands for ids in c))
        table = np.full((len(operands), INPUTS, width), pad, np.int32)
        for k, c in enumerate(operands):
            for i, ids in enumerate(c):
                table[k, i, :len(ids)] = ids
        chosen = jnp.asarray(table)[pick]
        low, high = jnp.min(lows[chosen], axis=1), jnp.max(highs[chosen], axis=1)
        ranges = jnp.where((low > high)[:, None], jnp.nan, jnp.stack([low, high], axis=1)).reshape(-1)
        head = jnp.stack([jnp.where(seen, jnp.asarray(positions, jnp.float32)[pick], -1.0),
                          jnp.where(seen, jnp.where(new_nan[pick], 1.0, 2.0), 0.0)])
        return jnp.concatenate([head, ranges])


def _padded(rows: list[tuple[int, ...]], pad: int):
    """Rows of indices as one int32 array, short rows padded with `pad`."""
    width = max(1, max((len(r) for r in rows), default=1))
    table = np.full((len(rows), width), pad, np.int32)
    for k, r in enumerate(rows):
        table[k, :len(r)] = r
    return jnp.asarray(table)


def _aval(graph: Graph, wire):
    if wire.__class__ is int:
        return graph.params[wire].aval
    return graph.nodes[wire[0]].avals[wire[1]]


def recording_ranks(graph: Graph) -> tuple[int, ...]:
    """Each node's place in recording order (Node.seq) among the graph's nodes."""
    order = sorted(range(len(graph.nodes)), key=lambda k: graph.nodes[k].seq)
    ranks = [0] * len(order)
    for rank, k in enumerate(order):
        ranks[k] = rank
    return tuple(ranks)
