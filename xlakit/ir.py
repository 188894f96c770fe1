"""The lazy IR: device buffers, nodes, and the graph cut out of them at a sync.

Structure (op, attributes, avals, operand wiring) lives in `Node.signature`
and the operand tuple; source metadata lives beside it in `Node.source` and
never reaches the cache key.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
from typing import Any

import torch


@dataclasses.dataclass(frozen=True, slots=True)
class Aval:
    """Abstract value: what the compiler needs to know about a tensor."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def __str__(self) -> str:
        return f"{dtype_name(self.dtype)}[{','.join(map(str, self.shape))}]"

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


_SHORT_DTYPES = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16",
    torch.bfloat16: "bf16", torch.int64: "s64", torch.int32: "s32",
    torch.int16: "s16", torch.int8: "s8", torch.uint8: "u8", torch.bool: "pred",
    torch.complex64: "c64", torch.complex128: "c128",
}


def dtype_name(dtype: torch.dtype) -> str:
    return _SHORT_DTYPES.get(dtype, str(dtype).removeprefix("torch."))


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    """Where the user wrote an op. Metadata: shown, never hashed into the key."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


class DeviceData:
    """One device buffer (a jax.Array) and what is known about who may reuse it."""

    __slots__ = ("array", "aval", "label", "read_only", "donated", "__weakref__")

    def __init__(self, array, aval: Aval, *, label: str | None = None, read_only: bool = False):
        self.array = array
        self.aval = aval
        self.label = label
        self.read_only = read_only
        self.donated = False

    def __repr__(self) -> str:
        state = "donated" if self.donated else "live"
        return f"DeviceData({self.aval}, {self.label or 'unlabelled'}, {state})"


class Node:
    """One recorded aten op.

    operands: the tensor inputs, each a `DeviceData` or a `(Node, output_index)`.
    template: how to rebuild (args, kwargs) from operands; its constant leaves
    are attributes. signature: canonical bytes of op, attributes and output
    avals, computed once at record time so hashing a graph stays cheap.
    results: device buffers of outputs already computed by an earlier sync.
    """

    __slots__ = ("op", "operands", "template", "avals", "source", "signature", "results", "__weakref__")

    _ids = itertools.count()

    def __init__(self, op, operands: tuple, template: Any, avals: tuple[Aval, ...],
                 source: Source | None, signature: bytes):
        self.op = op
        self.operands = operands
        self.template = template
        self.avals = avals
        self.source = source
        self.signature = signature
        self.results: list[DeviceData | None] | None = None

    def __repr__(self) -> str:
        return f"Node({self.op}, {', '.join(map(str, self.avals))})"


@dataclasses.dataclass
class Graph:
    """A computation cut out of the IR for one execution.

    nodes are in topological order; params are the device buffers it reads, in
    first-use order; roots are the (node position, output index) it returns.
    wiring holds, per node, where each operand comes from: ("p", param index)
    or ("n", node position, output index).
    """

    nodes: list[Node]
    params: list[DeviceData]
    roots: list[tuple[int, int]]
    wiring: list[tuple[tuple, ...]]

    @property
    def param_avals(self) -> list[Aval]:
        return [p.aval for p in self.params]

    @property
    def root_avals(self) -> list[Aval]:
        return [self.nodes[n].avals[i] for n, i in self.roots]


def build_graph(root_values: list[tuple[Node, int]]) -> Graph:
    """Walk back from the roots; stop at device data and at computed outputs."""
    node_pos: dict[int, int] = {}
    param_pos: dict[int, int] = {}
    nodes: list[Node] = []
    params: list[DeviceData] = []
    wiring: list[tuple[tuple, ...]] = []

    def operand_ref(operand) -> tuple | None:
        if isinstance(operand, DeviceData):
            return _param_ref(operand)
        node, index = operand
        if node.results is not None and node.results[index] is not None:
            return _param_ref(node.results[index])
        pos = node_pos.get(id(node))
        return None if pos is None else ("n", pos, index)

    def _param_ref(data: DeviceData) -> tuple:
        pos = param_pos.get(id(data))
        if pos is None:
            pos = param_pos[id(data)] = len(params)
            params.append(data)
        return ("p", pos)

    # Iterative post-order walk: graphs of thousands of nodes must not hit
    # Python's recursion limit.
    for root, _ in root_values:
        if id(root) in node_pos:
            continue
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in node_pos:
                continue
            if not expanded:
                stack.append((node, True))
                for operand in reversed(node.operands):
                    if isinstance(operand, DeviceData):
                        continue
                    producer, index = operand
                    if producer.results is not None and producer.results[index] is not None:
                        continue
                    if id(producer) not in node_pos:
                        stack.append((producer, False))
                continue
            wiring.append(tuple(operand_ref(o) for o in node.operands))
            node_pos[id(node)] = len(nodes)
            nodes.append(node)

    roots = [(node_pos[id(node)], index) for node, index in root_values]
    return Graph(nodes=nodes, params=params, roots=roots, wiring=wiring)


def digest(*parts: bytes) -> str:
    """Stable 128-bit digest; never Python's hash(), which is salted per process."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()
