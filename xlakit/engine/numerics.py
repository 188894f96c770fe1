"""Reading a step's numerics output (lowerings/numerics.py) into rec.numerics,
and the error or warning for the op that made its first NaN or infinity.

Read right after the step ran (the vector is tens of bytes, or four per node
with ranges); with config.check_nans on, a step therefore waits for its
execution even where config.wait_for_execution is off. Nothing is poisoned or
given back: the values are what XLA computed, as eager torch would have them.

With check_nans alone the step's executable only guards its outputs and donates
as usual; a step whose outputs are not all finite is run again by a second
executable (`Search`) with every node watched, on the step's inputs: the ones
it did not donate, and the old values its donated outputs kept (numerics.Guard).
The search's outputs, the same computation's, are the step's then.
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
from ..lowerings.numerics import INPUTS, Guard, Layout, recording_ranks

_FLOATING = {dtype_name(d): torch.finfo(d) for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16)}


class Search:
    """The per-node search for the first NaN or infinity of a step whose guard
    found an output not finite: the step's graph, kept without its buffers,
    lowered with every node watched (its roots, its checks, then the numerics
    vector), donating what the step donates, compiled at the first such step
    and run on that step's inputs."""

    def __init__(self, graph: Graph, donors: tuple[int, ...], placement, check: bool):
        self.graph, self.donors, self.check = structure(graph), donors, check
        self.precision, self.placement = to_jax.matmul_precision(), placement
        self.compiled, self.layout = None, None
        # the guards whose search found no origin (a NaN that came with the inputs, a mask's
        # -inf among the outputs): a step that donates nothing is not searched again for them
        self.explained: set[bytes] = set()

    def find(self, outputs, checked, guard, arguments: list, graph: GraphInfo):
        """(the step's outputs, its checks' flags, its NumericsInfo): the search's where it ran."""
        values = np.asarray(guard, dtype=np.float32)
        flags, kept = values[:-1], bool(values[-1])
        if not flags.any():
            return outputs, checked, NumericsInfo(nans_checked=True)
        if self.donors and not kept:   # made in the updates: the donated inputs are written
            floating = [k for k, aval in enumerate(self.graph.root_avals) if aval.dtype.is_floating_point]
            nodes = tuple(self.graph.roots[k][0] for k, flag in zip(floating, flags) if flag)
            return outputs, checked, NumericsInfo(nans_checked=True, nonfinite_outputs=True, in_updates=nodes)
        if not self.donors and flags.tobytes() in self.explained:
            return outputs, checked, NumericsInfo(nans_checked=True, nonfinite_outputs=True)
        if self.compiled is None:
            lowered, _, self.layout = to_jax.lower(self.graph, self.donors, self.precision, self.placement,
                                                   check=self.check, nans=recording_ranks(self.graph),
                                                   order=Guard(self.graph, self.donors).order)
            self.compiled = to_jax.compile_lowered(lowered)
        inputs = list(arguments)
        for root, param in enumerate(self.donors):   # root j took donors[j]'s buffer, and kept its value
            inputs[param] = outputs[root]
        results = list(self.compiled(*inputs))
        vector = results.pop()
        if checked is not None:
            checked = results.pop()
        found = _first_nonfinite(np.asarray(vector, dtype=np.float32)[:self.layout.nans_size], graph)
        if found is None and not self.donors:
            self.explained.add(flags.tobytes())
        return results, checked, NumericsInfo(first_nonfinite=found, nans_checked=True, searched=True,
                                              nonfinite_outputs=True)


def read(entry, outputs, checked, vector, arguments: list, graph: GraphInfo):
    """(the step's outputs, its checks' flags, the NumericsInfo of its numerics vector): a guarded
    step whose outputs are not finite is searched on its `arguments` (Search.find)."""
    layout = entry.numerics
    if layout.guard:
        return entry.search.find(outputs, checked, vector, arguments, graph)
    values = np.asarray(vector, dtype=np.float32)
    first = _first_nonfinite(values[:layout.nans_size], graph) if layout.nans else None
    ranges = _ranges(values[layout.nans_size:], graph) if layout.ranges else None
    return outputs, checked, NumericsInfo(first_nonfinite=first, ranges=ranges, nans_checked=layout.nans)


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
    made the step's first NaN from finite inputs (input 0: min -0.031 max 4.2)...'; for a backward op,
    also the forward op whose gradient it computes ('..., in the gradient of the forward op at cell 7 line 2
    -> modeling_llama.py:171 in forward in model.layers.0.mlp made ...')."""
    where = sources.describe(found.source)
    module = f" in {found.module}" if found.module else ""
    made = "NaN from inputs that hold none" if found.kind == "nan" else "infinity from finite inputs"
    inputs = "; ".join(f"input {i}: min {r[0]:.4g} max {r[1]:.4g}" for i, r in enumerate(found.inputs)
                       if r is not None)
    forward = found.source.forward if found.source is not None else None
    gradient = (f", in the gradient of the forward op at {sources.describe(forward)}"
                f"{f' in {forward.module}' if forward.module else ''}") if forward is not None else ""
    return (f"xlakit: {found.op}{module}{f' at {where}' if where else ''}{gradient} made the step's first {made}"
            f"{f' ({inputs})' if inputs else ''}. The step's values are as XLA computed them; "
            "xlakit.config.check_nans = False turns this check off.")


def updates_message(info: NumericsInfo, graph: GraphInfo) -> str:
    """'xlakit: the step's outputs made by aten.addcdiv.default in optimizer at train.py:12 hold a NaN ...'"""
    made = "; ".join(f"{node.op}{f' in {node.module}' if node.module else ''}"
                     f"{f' at {sources.describe(node.source)}' if node.source else ''}"
                     for node in (graph.nodes[k] for k in info.in_updates[:3]))
    return (f"xlakit: the step's outputs made by {made} hold a NaN or an infinity, made in its in-place updates "
            "of buffers it donated, from values that are all finite. The op-by-op search needs those buffers' "
            "values from before the step, which it gave away: with xlakit.config.donate = False for one such "
            "step, it names the op. The step's values are as XLA computed them.")


def report(info: NumericsInfo, graph: GraphInfo) -> None:
    """Raise FloatingPointError (config.check_nans True) or warn ("warn") for the step's first non-finite value."""
    found = info.first_nonfinite
    if (found is None and not info.in_updates) or not config.check_nans:
        return
    text = message(found) if found is not None else updates_message(info, graph)
    source = found.source if found is not None else graph.nodes[info.in_updates[0]].source
    if config.check_nans == "warn":
        sources.warn(text, source, RuntimeWarning)
    else:
        raise FloatingPointError(text)
