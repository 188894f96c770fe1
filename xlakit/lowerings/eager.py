"""The one eager path: an op the lazy device cannot compute through XLA runs
in eager torch on CPU, from host tensors, and says so once per op at the
user's line.

Two callers: the frontend at record time (no lowering, an output shape that
depends on the data, random ops; frontend.run_eagerly) and the engine at
lowering time (a node whose lowering failed; Engine._compute_eagerly). Each
syncs its own inputs to the host; the running and the warning are here.
"""
from __future__ import annotations

import torch

from ..core import sources
from ..core.ir import Node, fill
from ..core.state import PROCESS
from .dtypes import jax_dtype

# ops already announced: each op warns once per process, whichever caller ran it
WARNED: set = PROCESS.seen("lowerings.eager: warned ops", 1 << 12, "each op that runs eagerly says so once")


def warn_once(op, reason: str, source) -> None:
    """Announce that `op` runs eagerly (the first time only), at the user's line."""
    if op in WARNED:
        return
    WARNED.add(op)
    where = f" at {sources.describe(source)}" if source else ""
    sources.warn(f"xlakit: {op} runs eagerly on CPU ({reason}){where}; this splits the graph.", source)


# The keys that carry a tensor's lazy conjugate and negative bits (and zero tensors). Called
# from the lazy device's kernel, the dispatcher excludes every key above it, these too: a CPU
# kernel that makes a `conj()` view inside (linalg_lstsq's complex residuals) would read it
# unconjugated. Eager torch never runs without them.
_TENSOR_BITS = (torch._C.DispatchKey.Conjugate, torch._C.DispatchKey.Negative, torch._C.DispatchKey.ZeroTensor)


def run(op, args, kwargs):
    """Call `op` in eager torch on host arguments; the lazy device's names
    ("lazy", and "jax" in recorded templates) become the CPU."""
    excluded = torch._C._dispatch_tls_local_exclude_set()
    for key in _TENSOR_BITS:
        excluded = excluded.remove(key)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded):
        return op(*[_on_cpu(a) for a in args], **{k: _on_cpu(v) for k, v in kwargs.items()})


def _on_cpu(value):
    if isinstance(value, torch.device) and value.type in ("lazy", "jax"):
        return torch.device("cpu")
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    return value


def run_node(node: Node, operands: list) -> list:
    """Compute one recorded node from its operands as host tensors; returns its
    outputs as host tensors of the node's avals."""
    for aval in node.avals:
        if aval is not None:
            jax_dtype(aval.dtype)  # a dtype XLA lacks cannot live on the device
    args, kwargs = fill(node.template, operands)
    # the frontend lifts Scalar arguments to 0-d inputs: back to Python numbers
    schema = node.op._schema.arguments
    scalar = {a.name for a in schema if str(a.type) in ("number", "Optional[number]")}
    args = [_unlifted(v, i < len(schema) and schema[i].name in scalar) for i, v in enumerate(args)]
    kwargs = {k: _unlifted(v, k in scalar) for k, v in kwargs.items()}
    out = run(node.op, args, kwargs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    results = []
    for value, aval in zip(outs, node.avals):
        if aval is None:
            results.append(None)
            continue
        if tuple(value.shape) != aval.shape:
            raise RuntimeError(f"eager {node.op} returned shape {tuple(value.shape)}, its meta kernel {aval.shape}")
        results.append(value.to(aval.dtype))
    return results


def _unlifted(value, scalar: bool):
    if scalar and isinstance(value, torch.Tensor):
        return value.item()
    return value
