"""Reading a step's numerics output (lowerings/numerics.py) into rec.numerics,
and the error or warning for the op that made its first NaN or infinity.

Read right after the step ran (the vector is tens of bytes, or four per node
with ranges); with config.check_nans on, a step therefore waits for its
execution even where config.wait_for_execution is off. Nothing is poisoned or
given back: the values are what XLA computed, as eager torch would have them.

With check_nans alone the step's executable only guards its outputs; a step
whose outputs are not all finite is searched by a second executable (`Search`),
run on the same inputs, which the guarded step did not donate. Its buffers
that would have been donated are released right after the guard is read.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..config import config
from ..core import sources
from ..core.ir import Graph, dtype_name, structure
from ..core.record import GraphInfo, ModuleRange, NonFinite, NumericsInfo
from ..lowerings import to_jax
from ..lowerings.numerics import INPUTS, Layout, recording_ranks

_FLOATING = {dtype_name(d): torch.finfo(d) for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16)}


class Search:
    """The per-node search for the first NaN or infinity of a step whose guard
    found an output not finite: the step's graph, kept without its buffers,
    lowered with every node watched (no outputs but the numerics vector),
    compiled at the first such step and run on that step's inputs."""

    def __init__(self, graph: Graph, placement):
        self.graph = structure(graph)
        self.graph.roots = []
        self.precision, self.placement = to_jax.matmul_precision(), placement
        self.compiled, self.layout = None, None
        # the guards whose search found no origin (a NaN that came with the inputs, a mask's
        # -inf among the outputs): such a step is not searched again at every run
        self.explained: set[bytes] = set()

    def find(self, guard, arguments: list, graph: GraphInfo) -> NumericsInfo:
        flags = np.asarray(guard, dtype=np.float32)
        if not flags.any():
            return NumericsInfo(nans_checked=True)
        if flags.tobytes() in self.explained:
            return NumericsInfo(nans_checked=True, nonfinite_outputs=True)
        if self.compiled is None:
            lowered, _, self.layout = to_jax.lower(self.graph, (), self.precision, self.placement, check=False,
                                                   nans=recording_ranks(self.graph))
            self.compiled = lowered.compile()
        vector, = self.compiled(*arguments)
        found = _first_nonfinite(np.asarray(vector, dtype=np.float32)[:self.layout.nans_size], graph)
        if found is None:
            self.explained.add(flags.tobytes())
        return NumericsInfo(first_nonfinite=found, nans_checked=True, searched=True, nonfinite_outputs=True)


def read(layout: Layout, vector, graph: GraphInfo, search: Search | None = None,
         arguments: list | None = None) -> NumericsInfo:
    """The NumericsInfo of one step's numerics vector; a guard's is searched
    with `search` on the step's `arguments` when an output is not finite."""
    if layout.guard:
        return search.find(vector, arguments, graph)
    values = np.asarray(vector, dtype=np.float32)
    first = _first_nonfinite(values[:layout.nans_size], graph) if layout.nans else None
    ranges = _ranges(values[layout.nans_size:], graph) if layout.ranges else None
    return NumericsInfo(first_nonfinite=first, ranges=ranges, nans_checked=layout.nans)


def _first_nonfinite(values, graph: GraphInfo) -> NonFinite | None:
    position = int(values[0])
    if position < 0:
        return None
    node = graph.nodes[position]
    pairs = values[2:].reshape(INPUTS, 2)
    inputs = tuple(None if math.isnan(lo) or math.isnan(hi) else (float(lo), float(hi))
                   for lo, hi in pairs[:len(node.operands)])
    return NonFinite(node=position, op=node.op, module=node.module, source=node.source,
                     kind="nan" if values[1] == 1 else "inf", inputs=inputs)


def _ranges(absmax, graph: GraphInfo) -> dict[str, ModuleRange]:
    """Per module path, the absolute maximum of its values in the dtype that came closest to overflowing."""
    per_module: dict[str, dict[str, float]] = {}
    for node, value in zip(graph.nodes, absmax.tolist()):
        dtype = next((a.partition("[")[0] for a in node.avals if a.partition("[")[0] in _FLOATING), None)
        if dtype is None or not math.isfinite(value):
            continue
        seen = per_module.setdefault(node.module, {})
        seen[dtype] = max(seen.get(dtype, 0.0), value)
    ranges = {}
    for module, seen in per_module.items():
        dtype, value = max(seen.items(), key=lambda item: item[1] / float(_FLOATING[item[0]].max))
        finfo = _FLOATING[dtype]
        ranges[module] = ModuleRange(absmax=value, dtype=dtype, limit=float(finfo.max), tiny=float(finfo.tiny))
    return ranges


def message(found: NonFinite) -> str:
    """'xlakit: aten.log.default in model.layers.0.mlp at cell 7 line 2 -> modeling_llama.py:171 in forward
    made the step's first NaN from finite inputs (input 0: min -0.031 max 4.2)...'"""
    where = sources.describe(found.source)
    module = f" in {found.module}" if found.module else ""
    made = "NaN from inputs that hold none" if found.kind == "nan" else "infinity from finite inputs"
    inputs = "; ".join(f"input {i}: min {r[0]:.4g} max {r[1]:.4g}" for i, r in enumerate(found.inputs)
                       if r is not None)
    return (f"xlakit: {found.op}{module}{f' at {where}' if where else ''} made the step's first {made}"
            f"{f' ({inputs})' if inputs else ''}. The step's values are as XLA computed them; "
            "xlakit.config.check_nans = False turns this check off.")


def report(info: NumericsInfo) -> None:
    """Raise FloatingPointError (config.check_nans True) or warn ("warn") for the step's first non-finite value."""
    found = info.first_nonfinite
    if found is None or not config.check_nans:
        return
    if config.check_nans == "warn":
        sources.warn(message(found), found.source, RuntimeWarning)
    else:
        raise FloatingPointError(message(found))
