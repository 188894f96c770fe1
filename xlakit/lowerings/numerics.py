"""Numerics, computed inside a step's executable: where the first non-finite
value came from (config.check_nans) and how large each node's values got
(config.record_ranges).

Per floating value of the step (an input, a node's output): whether it holds
a NaN, whether it holds an infinity, its min and its max. A node is an *origin* when it made a NaN
from inputs that hold none, or an infinity from inputs that are all finite,
unless its own arguments ask for one (masked_fill(mask, -inf), full(nan)).
Of the origins, the first in recording order is picked in-graph (its rank is a
constant of the executable; keys.compile_flags keys it), and the finite ranges
of its first inputs are gathered with it: one small float32 vector per step,

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

from ..core.ir import Graph, Node

# Inputs of the first origin whose ranges are reported.
INPUTS = 4


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a numerics output holds (kept with the executable)."""

    nans: bool
    ranges: bool

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
SHAPE_ONLY = frozenset({
    "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "fill", "new_zeros",
    "new_ones", "new_full", "new_empty", "new_empty_strided", "empty_strided", "empty", "zeros", "ones", "full",
    "arange", "scalar_tensor", "linspace", "logspace", "eye",
})


def _name(node: Node) -> str:
    """'log' for aten.log.default."""
    return str(node.op).split(".")[1]


def _joined(stats: list):
    """The stats of values that together hold what `stats`' values hold."""
    if len(stats) == 1:
        return stats[0]
    return jnp.max(jnp.stack([s[0] for s in stats])), jnp.min(jnp.stack([s[1] for s in stats])), jnp.max(jnp.stack([s[2] for s in stats]))


def _floating(aval) -> bool:
    return aval is not None and aval.dtype.is_floating_point


def _stats(x, nans: bool):
    """(code, min, max) of one array, as float32: code 2 where it holds a NaN, else
    1 where it holds an infinity, else 0 (XLA's min and max on CPU skip a NaN that
    comes first, so they cannot say; 0 unless `nans`). A NaN hides an infinity
    beside it, which an origin never needs: a NaN-free array is one whose
    infinities are known. One variadic reduction, one pass over the array
    (three separate ones cost 5x more on the Llama step, bench/numerics.py)."""
    if x.size == 0:
        return jnp.float32(0), jnp.float32(0), jnp.float32(0)
    code = jnp.where(jnp.isfinite(x), 0, jnp.where(jnp.isnan(x), 2, 1)).astype(x.dtype) if nans else \
        jnp.zeros_like(x)
    inf = np.array(np.inf, x.dtype)
    code, low, high = jax.lax.reduce((code, x, x), (np.array(0, x.dtype), inf, -inf),
                                     lambda a, b: (jnp.maximum(a[0], b[0]), jnp.minimum(a[1], b[1]),
                                                   jnp.maximum(a[2], b[2])), tuple(range(x.ndim)))
    return code.astype(jnp.float32), low.astype(jnp.float32), high.astype(jnp.float32)


def _has_nan(stats):
    return stats[0] == 2


def _has_inf(stats):
    """Whether a NaN-free array holds an infinity (see _stats)."""
    return stats[0] == 1


def _asks_for_nonfinite(node: Node) -> bool:
    """Whether a constant argument of the node is itself NaN or infinite (a mask fill)."""
    args, kwargs = node.template
    return any(isinstance(v, float) and not math.isfinite(v) for v in (*args, *(v for _, v in kwargs)))


class Watch:
    """Collects, while a graph is traced (to_jax._replay), what its numerics output needs."""

    def __init__(self, graph: Graph, ranks: tuple[int, ...] | None, ranges: bool):
        self.graph, self.ranks, self.ranges = graph, ranks, ranges
        self._stats: dict = {}        # value (param index or (node, output)) -> _stats
        self._origins: list = []      # per node: (is an origin, is a NaN origin, its inputs' ranges)
        self._absmax: list = []
        self._constant: list[bool] = []   # per node: whether its values follow from constants alone

    def layout(self) -> Layout:
        return Layout(self.ranks is not None, self.ranges)

    def _of(self, where, array):
        if where not in self._stats:
            if where.__class__ is not int and self._constant[where[0]]:
                # XLA would fold the reduction of a constant at compile time, in its slow evaluator
                # (measured: 10 s for one Llama zeros_like); computed when the step runs instead
                array = jax.lax.optimization_barrier(array)
            self._stats[where] = _stats(array, self.ranks is not None)
        return self._stats[where]

    def node(self, position: int, wires, operands: list, results: list) -> None:
        node = self.graph.nodes[position]
        self._constant.append(_name(node) in SHAPE_ONLY or all(
            w.__class__ is not int and self._constant[w[0]] for w in wires))
        if _name(node) in MOVES:
            ins = [self._of(w if w.__class__ is int else tuple(w), o) for w, o in zip(wires, operands)
                   if _floating(_aval(self.graph, w))]
            if ins:
                for i, aval in enumerate(node.avals):
                    if _floating(aval):
                        self._stats[(position, i)] = _joined(ins)
                if self.ranges:
                    self._absmax.append(jnp.float32(jnp.nan))   # counted where the values were made
                if self.ranks is not None:
                    self._origins.append(None)
                return
        outs = [self._of((position, i), r) for i, (r, aval) in enumerate(zip(results, node.avals))
                if r is not None and _floating(aval)]
        if self.ranges:
            self._absmax.append(jnp.max(jnp.stack([jnp.maximum(-s[1], s[2]) for s in outs]))
                                if outs else jnp.float32(jnp.nan))
        if self.ranks is None:
            return
        if not outs or not wires or _asks_for_nonfinite(node):   # a factory's values are constants
            self._origins.append(None)
            return
        ins = [self._of(w if w.__class__ is int else tuple(w), o) if _floating(_aval(self.graph, w)) else None
               for w, o in zip(wires, operands)]
        floats = [s for s in ins if s is not None]
        in_nan = jnp.any(jnp.stack([_has_nan(s) for s in floats])) if floats else False
        in_inf = jnp.any(jnp.stack([_has_inf(s) for s in floats])) if floats else False
        out_nan = jnp.any(jnp.stack([_has_nan(s) for s in outs]))
        out_inf = jnp.any(jnp.stack([_has_inf(s) for s in outs]))
        new_nan = out_nan & ~in_nan
        origin = new_nan | (out_inf & ~in_nan & ~in_inf)
        ranges = [v for s in ins[:INPUTS] for v in (s[1:] if s is not None else (jnp.nan, jnp.nan))]
        ranges += [jnp.float32(jnp.nan)] * (2 * INPUTS - len(ranges))
        self._origins.append((origin, new_nan, jnp.stack([jnp.asarray(v, jnp.float32) for v in ranges])))

    def output(self):
        """The step's numerics vector (module docstring)."""
        parts = []
        if self.ranks is not None:
            found = [(k, o) for k, o in enumerate(self._origins) if o is not None]
            if found:
                never = len(self.ranks)
                ranks = jnp.stack([jnp.where(o[0], self.ranks[k], never) for k, o in found])
                pick = jnp.argmin(ranks)
                seen = ranks[pick] < never
                positions = jnp.asarray([k for k, _ in found], jnp.float32)
                kinds = jnp.stack([jnp.where(o[1], 1.0, 2.0) for _, o in found])
                ranges = jnp.stack([o[2] for _, o in found])
                parts.append(jnp.concatenate([jnp.stack([jnp.where(seen, positions[pick], -1.0),
                                                         jnp.where(seen, kinds[pick], 0.0)]), ranges[pick]]))
            else:
                parts.append(jnp.asarray([-1.0, 0.0] + [np.nan] * (2 * INPUTS), jnp.float32))
        if self.ranges:
            parts.append(jnp.stack(self._absmax).astype(jnp.float32) if self._absmax
                         else jnp.zeros((0,), jnp.float32))
        return jnp.concatenate(parts)


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
