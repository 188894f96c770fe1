"""Sharding lazy tensors over a mesh, in torch_xla's words: `mark_sharding(t, mesh, spec)`,
and a module helper that shards every parameter (FSDP style).

Device data is moved to its sharding at once (JAX lays it out); a pending
value gets a MARK_SHARDING node (a sharding constraint inside the graph that
computes it). Either way the sharding travels with the value into the key
and the executable (sharding.py); GSPMD/Shardy propagate it to the rest.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..core import sources, transfer
from ..core.ir import Node, Slot
from ..core.sharding import MARK_SHARDING, Constraint, Mesh
from ..engine.executor import current
from ..engine.values import LiveValue
from .recorder import DEVICE, unwrap


def mark_sharding(tensor: torch.Tensor, mesh: Mesh, spec: Sequence) -> torch.Tensor:
    """Lay `tensor` out over `mesh`: `spec` has one entry per dim, a mesh axis
    name (or index), a tuple of them, or None (whole along that dim). Returns
    `tensor`, now sharded; its views and aliases taken before keep their own placement."""
    if tensor.device != DEVICE:
        raise ValueError(f"xlakit.mark_sharding: the tensor is on {tensor.device}; move it with "
                         f".to(xlakit.device()) first")
    inner = unwrap(tensor)
    value = inner._state
    value.check_usable()
    value.resolve()
    try:
        target = mesh.sharding(spec, value.aval.shape)
    except ValueError as e:
        where = sources.user_line()
        tensor_text = f"{value.label} {value.aval}" if value.label else str(value.aval)
        raise ValueError(f"{e} (the tensor {tensor_text}" + (f", at {where})" if where else ")")) from None
    if value.data is not None:  # computed: lay the buffer out now (one transfer; same value)
        value.data.array = transfer.place(value.data.array, target)
        return tensor
    aval = value.aval
    node = Node(MARK_SHARDING, (value.operand(),), ((Slot(0), Constraint(target, len(aval.shape))), ()),
                (aval,), sources.capture(), repr((str(MARK_SHARDING), (aval,))).encode())
    marked = LiveValue(aval, node, 0, None)
    marked.label = value.label
    current().register(inner, marked)
    return tensor


def shard_module(module: torch.nn.Module, mesh: Mesh, axis: str | int = 0) -> torch.nn.Module:
    """FSDP style: split every parameter of `module` over the mesh axis `axis`
    along its first dim that divides evenly (the others whole); a parameter
    with no such dim stays replicated. Buffers stay replicated. Returns `module`."""
    name = mesh.axis_names[axis] if isinstance(axis, int) else axis
    pieces = dict(zip(mesh.axis_names, mesh.shape))[name]
    for p in {id(p): p for p in module.parameters()}.values():  # a tied parameter once
        spec = [None] * p.dim()
        dim = next((d for d, size in enumerate(p.shape) if size % pieces == 0 and size >= pieces), None)
        if dim is not None:
            spec[dim] = name
            mark_sharding(p, mesh, spec)
    return module
