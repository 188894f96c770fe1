"""Reading a step's numerics output (lowerings/numerics.py) into rec.numerics,
and the error or warning for the op that made its first NaN or infinity.

Read right after the step ran (the vector is tens of bytes, or four per node
with ranges); with config.check_nans on, a step therefore waits for its
execution even where config.wait_for_execution is off. Nothing is poisoned or
given back: the values are what XLA computed, as eager torch would have them.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..config import config
from ..core import sources
from ..core.ir import dtype_name
from ..core.record import GraphInfo, ModuleRange, NonFinite, NumericsInfo
from ..lowerings.numerics import INPUTS, Layout

_FLOATING = {dtype_name(d): torch.finfo(d) for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16)}


def read(layout: Layout, vector, graph: GraphInfo) -> NumericsInfo:
    """The NumericsInfo of one step's numerics vector."""
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
