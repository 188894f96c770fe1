"""Python reads answered on the host: a pending value computed from host uploads alone.

transformers reads its attention mask in Python every step (masking_utils: `padding_mask.all()`,
`fast_all(padding_mask)`, to skip the mask or let sdpa use is_causal): one or two executions
of their own per training step, a device round trip each. torch_xla avoids them only because
transformers checks for it. The mask came from the host this step, and the host kept a copy
of it (core/transfer.keep_host_copy): eager torch computes the read from that copy, with no
execution.

Only where eager's value is the device's, bit for bit: every op of the computation has integer
or bool inputs and outputs, draws nothing, and is not an `empty` (undefined values). Floats never: XLA:CPU reads subnormals as zero
(`tensor([1e-40]) > 0` is False on the device, True in eager). A value whose inputs are not all
kept host copies (a buffer computed on the device, one donated, an upload over
config.host_copy_bytes) is read from the device, as any other.
"""
from __future__ import annotations

import warnings

import torch

from ..core import transfer
from ..core.ir import DeviceData, Node, operand_data
from ..core.state import PROCESS
from ..engine.values import LiveValue
from ..lowerings import eager

# ops whose values are undefined: eager's are whatever memory held, the device's zeros
_UNDEFINED = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::empty_permuted",
                        "aten::new_empty", "aten::new_empty_strided"})
# The most nodes a read is computed from on the host: the mask's reads take 2-6; a longer
# integer computation is rare and its host time would grow with it.
_NODES = 64


def answer(value: LiveValue) -> torch.Tensor | None:
    """`value` as a dense host tensor computed by eager torch from host copies, or None: the
    device must compute it (or eager raised: the device path gives xlakit's own error)."""
    value.resolve()
    if value.error is not None:
        return None
    if value.node is None:
        host = transfer.host_copy(value.data)
        return None if host is None else host.clone()
    order: list[Node] = []
    if not _collect(value.node, set(), order):
        return None
    key = _computation(order, value)
    answered = _ANSWERS.get(key)
    if answered is None:
        results: dict[int, list] = {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a deprecation eager would warn about is the device path's to say
                for node in order:
                    results[id(node)] = eager.run_node(node, [_host(o, results) for o in node.operands])
        except Exception:  # noqa: BLE001 - out of range, division by zero: the device's checks raise them
            return None
        answered = _ANSWERS[key] = results[id(value.node)][value.index].clone(memory_format=torch.contiguous_format)
    return answered.clone()


# The answers of the computations read before, by all that decides them (_computation). transformers'
# models read the same one every step (find_packed_sequence_indices: 14 ops from an arange), which eager
# took 0.75-1.1 ms to run again (bench/RESULTS.md, fifteenth round).
_ANSWERS = PROCESS.memo("front.host_reads: answers", 64,
                        "a read computed on the host before, from the same ops and host values, is not run again")


def _computation(order: list[Node], value: LiveValue) -> tuple:
    """What decides the read's answer: each node's op, constants and output avals (its signature),
    where each operand comes from, each host copy read by its value, and the output read. Every op
    is exact (_exact), so the same key is the same answer."""
    place = {id(node): k for k, node in enumerate(order)}
    parts: list = []
    for node in order:
        parts.append(node.signature)
        for operand in node.operands:
            data = operand_data(operand)
            if data is None:
                parts.append((place[id(operand[0])], operand[1]))
            else:
                host = transfer.host_copy(data)
                parts.append((host.dtype, tuple(host.shape), host.numpy().tobytes()))
    parts.append((place[id(value.node)], value.index))
    return tuple(parts)


def _collect(node: Node, seen: set, order: list) -> bool:
    """Add `node` and the pending nodes it reads to `order` (inputs first); False where one
    cannot be computed exactly on the host or an input has no host copy."""
    if id(node) in seen:
        return True
    if len(seen) == _NODES or not _exact(node):
        return False
    seen.add(id(node))
    for operand in node.operands:
        data = operand_data(operand)
        if data is not None:
            if transfer.host_copy(data) is None:
                return False
        elif not _collect(operand[0], seen, order):
            return False
    order.append(node)
    return True


def _exact(node: Node) -> bool:
    op = node.op
    if (not isinstance(op, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded in op.tags
            or op._schema.name in _UNDEFINED):
        return False
    return (all(aval is None or _integral(aval.dtype) for aval in node.avals)
            and all(_integral(_dtype(o)) for o in node.operands))


def _integral(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex)


def _dtype(operand) -> torch.dtype:
    return operand.aval.dtype if operand.__class__ is DeviceData else operand[0].avals[operand[1]].dtype


def _host(operand, results: dict) -> torch.Tensor:
    data = operand_data(operand)
    return transfer.host_copy(data) if data is not None else results[id(operand[0])][operand[1]]
