"""What the recorder knows of one aten op, read once from its registration and schema and
memoized (OpInfo): its policy and implementations, which arguments are lifted to inputs,
and its functional, per-tensor (foreach) and view variants.
"""
from __future__ import annotations

import torch

from ..core.state import PROCESS
from ..lowerings import registry
from ..lowerings.registry import Handling

aten = torch.ops.aten


_OP_INFO: dict = PROCESS.memo("front.op_info: op info", 1 << 14,
                              "per op overload, how it is recorded (read from its policy and schema once)")


def _functional_of_inplace(op):
    """`add_.Tensor` -> `add.Tensor`; None for ops that mutate nothing."""
    schema = op._schema
    if not schema.arguments or not (schema.arguments[0].alias_info and schema.arguments[0].alias_info.is_write):
        return None
    name = op._overloadpacket.__name__
    if not name.endswith("_") or name.startswith("_foreach"):
        return None
    packet = getattr(aten, name[:-1], None)
    if packet is None or op._overloadname not in packet.overloads():
        return None
    return getattr(packet, op._overloadname)


# `_foreach_add.List` -> `add.Tensor`: how foreach overload names map to the per-tensor op's.
_FOREACH_OVERLOADS = {"List": ("Tensor", "default"), "ScalarList": ("Scalar", "default", "Tensor"),
                      "Scalar": ("Scalar", "default", "Tensor"), "Tensor": ("Tensor", "default"),
                      "default": ("default",)}


def _per_tensor_of_foreach(op):
    """(per-tensor op, positions of list arguments) for a functional `_foreach_*` op."""
    name = op._overloadpacket.__name__
    if not name.startswith("_foreach_") or name.endswith("_"):
        return None
    packet = getattr(aten, name.removeprefix("_foreach_"), None)
    if packet is None:
        return None
    for overload in _FOREACH_OVERLOADS.get(op._overloadname, (op._overloadname,)):
        if overload in packet.overloads():
            positions = tuple(i for i, a in enumerate(op._schema.arguments)
                              if a.type.kind() == "ListType")
            return getattr(packet, overload), positions
    return None


def _view_of_copy(op):
    """`t_copy` -> `t`, `split_copy` -> `split`, ...: the view op that functionalization records
    as `op`; None for other ops."""
    name = op._overloadpacket.__name__
    packet = getattr(aten, name.removesuffix("_copy"), None) if name.endswith("_copy") else None
    if packet is None or op._overloadname not in packet.overloads():
        return None
    view = getattr(packet, op._overloadname)
    returns = view._schema.returns
    return view if returns and returns[0].alias_info is not None and not returns[0].alias_info.is_write else None


class OpInfo:
    """What the frontend needs to know about one aten op, computed once: its
    registered policy (registry.policy), its implementations, and what the op's
    schema says."""

    __slots__ = ("special", "scalar_args", "scalar_kwargs", "lowerable", "eager_reason", "decomposition",
                 "functional", "foreach", "shape_only_random", "view", "cpu_indices", "opmath_scalar",
                 "checked_scalars", "fill")

    def __init__(self, op):
        policy = registry.policy(op)
        self.special = policy.implementation if policy.handling is Handling.FRONTEND else None
        lift = policy.lift_scalars
        # which positional / keyword arguments enter the graph as 0-d inputs: Scalar
        # arguments of arithmetic ops, and Python floats where a Tensor is expected
        # (PyTorch's decompositions pass them so; torch treats them as 0-d tensors)
        scalar = [(lift and str(a.type) in ("number", "Optional[number]")) or str(a.type) == "Tensor"
                  for a in op._schema.arguments]
        self.scalar_args = tuple(scalar)
        self.scalar_kwargs = frozenset(a.name for a, s in zip(op._schema.arguments, scalar) if s)
        self.lowerable = registry.has_lowering(op)
        self.eager_reason = policy.reason if policy.handling in (Handling.EAGER, Handling.RANDOM) \
            else "no XLA lowering"
        self.decomposition = registry.decomposition(op)
        self.functional = _functional_of_inplace(op) or _functional_of_out(op)
        self.foreach = _per_tensor_of_foreach(op)
        self.shape_only_random = policy.handling is Handling.RANDOM_LIKE
        self.view = _view_of_copy(op)
        self.cpu_indices = policy.cpu_indices
        found = registry.find(op)
        self.opmath_scalar = found.opmath_scalar if found else ""
        # (position, name) of each Scalar argument eager checks (registry.Policy.checked_scalars)
        self.checked_scalars = tuple((i, a.name) for i, a in enumerate(op._schema.arguments)
                                     if a.name in policy.checked_scalars)
        self.fill = policy.fill


def op_info(op) -> OpInfo:
    # Keyed by id: ops are process-wide singletons and OpOverload.__hash__ is Python code.
    info = _OP_INFO.get(id(op))
    if info is None:
        info = _OP_INFO[id(op)] = OpInfo(op)
    return info


def _functional_of_out(op):
    """`eye.m_out` -> `eye.m`; None unless the op writes one `out` argument."""
    outs = [a.name for a in op._schema.arguments if a.is_out]
    return functional_variant(op) if outs == ["out"] else None


def functional_variant(op):
    """`eye.m_out` -> `eye.m`: the overload named like the out= one, or else
    the one with the same positional arguments (`arange.start_out` ->
    `arange.start_step`: `arange.start` has no step)."""
    packet = op._overloadpacket
    name = op._overloadname.removesuffix("_out").removesuffix("out") or "default"
    name = name.rstrip("_") or "default"
    named = getattr(packet, name) if name in packet.overloads() else packet.default
    positional = _positional_names(op)
    if _positional_names(named) == positional:
        return named
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        if _positional_names(candidate) == positional and not any(a.is_out for a in candidate._schema.arguments):
            return candidate
    return named


def _positional_names(op) -> list[str]:
    return [a.name for a in op._schema.arguments if not a.kwarg_only]
