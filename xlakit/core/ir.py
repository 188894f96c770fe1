"""The lazy IR: device buffers, nodes, and the graph cut out of them at a sync.

Structure (op, attributes, avals, operand wiring) lives in `Node.signature`
and the operand tuple; source metadata lives beside it in `Node.source` and
never reaches the cache key.
"""
from __future__ import annotations

import dataclasses
import functools
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


# torch's float8 types that XLA casts to as eager does (one byte each; JAX and ml_dtypes name them
# alike). Not float8_e8m0fnu: XLA:CPU rounds casts to it otherwise than eager (0.5, 3.0, 100.0).
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz)

_SHORT_DTYPES = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16",
    torch.bfloat16: "bf16", torch.int64: "s64", torch.int32: "s32",
    torch.int16: "s16", torch.int8: "s8", torch.uint8: "u8", torch.bool: "pred",
    torch.complex64: "c64", torch.complex128: "c128",
    torch.uint16: "u16", torch.uint32: "u32", torch.uint64: "u64",
    **{dtype: "f8" + str(dtype).removeprefix("torch.float8_") for dtype in FLOAT8},  # XLA's f8e4m3fn, ...
}


def dtype_name(dtype: torch.dtype) -> str:
    return _SHORT_DTYPES.get(dtype, str(dtype).removeprefix("torch."))


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    """One line of Python code."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    """Where an op was recorded: the user's line and, when that line called
    into a library (transformers, ...), the library's innermost line; and the
    module path that ran it (module_paths.py). Metadata: shown, never hashed into the key."""

    user: Frame | None
    library: Frame | None = None
    module: str = ""
    # for an op of a backward pass: the Source of the forward op whose gradient it computes
    forward: Source | None = None
    # its text, made at the first str(): every sync digests every node's source
    # (keys.metadata_bytes), and interned sources recur in every step
    _text: str | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def __str__(self) -> str:
        if self._text is None:
            where = " -> ".join(str(f) for f in (self.user, self.library) if f is not None)
            object.__setattr__(self, "_text", f"{where} [{self.module}]" if self.module else where)
        return self._text


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


# -- a node's argument template ---------------------------------------------------
class Slot:
    """Placeholder in a node's argument template for its i-th tensor operand."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"${self.index}"


def fill(template, values):
    """Rebuild (args, kwargs) from a node template, putting values[i] at Slot(i)."""
    args, kwargs = template
    return [_fill_one(a, values) for a in args], {k: _fill_one(v, values) for k, v in kwargs}


def _fill_one(v, values):
    # Module-level: a recursive closure would be a reference cycle holding `values`.
    if isinstance(v, Slot):
        return values[v.index]
    if isinstance(v, tuple):
        return [_fill_one(x, values) for x in v]
    return v


class Node:
    """One recorded aten op.

    operands: the tensor inputs, each a `DeviceData` or a `(Node, output_index)`.
    template: how to rebuild (args, kwargs) from operands (`fill`): a pair
    (args tuple, kwargs tuple of (name, value)) with `Slot(i)` where operand i
    goes and lists as tuples; its constant leaves are attributes. signature: canonical bytes of op, attributes and output
    avals, computed once at record time so hashing a graph stays cheap.
    results: device buffers of outputs already computed by an earlier sync.
    seq: the order nodes were recorded in, the program's order (never in the key).
    """

    __slots__ = ("op", "operands", "template", "avals", "source", "signature", "results", "seq", "__weakref__")

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
        self.seq = next(Node._ids)

    def __repr__(self) -> str:
        return f"Node({self.op}, {', '.join(map(str, self.avals))})"


def recording_mark() -> int:
    """The `seq` the next node recorded will take, without taking it: a run's positions are its
    nodes' seqs, contiguous (engine/tape.py). itertools.count can tell its next value only in its
    repr ("count(5)"); a Python counter would cost every node a method call and a lock."""
    return int(repr(Node._ids)[len("count("):-1])


@dataclasses.dataclass
class Graph:
    """A computation cut out of the IR for one execution.

    nodes are in topological order; params are the device buffers it reads, in
    first-use order; roots are the (node position, output index) it returns.
    wiring holds, per node, where each operand comes from: an int is a param
    index, a pair is (node position, output index).
    """

    nodes: list[Node]
    params: list[DeviceData]
    roots: list[tuple[int, int]]
    wiring: list[tuple]

    @property
    def param_avals(self) -> list[Aval]:
        return [p.aval for p in self.params]

    @property
    def root_avals(self) -> list[Aval]:
        return [self.nodes[n].avals[i] for n, i in self.roots]

    @functools.cached_property
    def instancing(self) -> tuple:
        """How `instantiate` wires the graph again: per node, (its operands as numbers into a
        list of the params followed by each (node, output) that some node reads, in the order
        they are made; the outputs of this node read later, to append to that list)."""
        number = {}  # (node position, output) -> its number
        read_later = [set() for _ in self.nodes]
        for wires in self.wiring:
            for w in wires:
                if w.__class__ is not int:
                    read_later[w[0]].add(w[1])
        plan = []
        for k, wires in enumerate(self.wiring):
            reads = tuple(w if w.__class__ is int else number[w] for w in wires)
            outputs = tuple(sorted(read_later[k]))
            for i in outputs:
                number[(k, i)] = len(self.params) + len(number)
            plan.append((reads, outputs))
        return tuple(plan)


def op_name(op) -> str:
    """'ones_like' for aten.ones_like.default ('' for an op not named namespace.name)."""
    parts = str(op).split(".")
    return parts[1] if len(parts) > 1 else ""


def structure(graph: Graph) -> Graph:
    """The graph without its buffers (operands, results, inputs' arrays): what
    lowering it again needs, holding no device memory while it is kept."""
    nodes = []
    for node in graph.nodes:
        copy = Node(node.op, (), node.template, node.avals, node.source, node.signature)
        copy.seq = node.seq
        nodes.append(copy)
    return Graph(nodes, [DeviceData(None, p.aval) for p in graph.params], list(graph.roots), list(graph.wiring))


def instantiate(graph: Graph, operands: list) -> list[Node]:
    """The nodes of `graph` (a `structure`) recorded again, pending, reading `operands`
    (per param: device data or a pending (node, output)) where the graph read its params:
    one more run of the same computation, as part of whatever step computes it."""
    nodes: list[Node] = []
    append = nodes.append
    # what the nodes read, by Graph.instancing's numbers: the params, then each (node, output) read,
    # made once for all its readers (one tuple per output, not per operand: a compiled Llama
    # step's 1953 nodes made ~2.2 tuples each, and what a step keeps alive is what Python's
    # cyclic collector walks)
    refs = list(operands)
    pair = refs.append
    for node, (reads, outputs) in zip(graph.nodes, graph.instancing):
        made = Node(node.op, tuple([refs[r] for r in reads]), node.template, node.avals, node.source, node.signature)
        append(made)
        for i in outputs:
            pair((made, i))
    return nodes


def operand_data(operand) -> DeviceData | None:
    """The device data a node operand reads: the operand itself, or the output
    an earlier sync computed; None while its producer is pending."""
    if operand.__class__ is tuple:
        results = operand[0].results
        return None if results is None else results[operand[1]]
    return operand


def pending_nodes(roots, placed: dict[Node, int] | None = None) -> list[Node]:
    """The graph walk: the pending nodes that the `roots` (nodes) need, each
    once and after the pending nodes it reads: dependency order, which the key
    holds. It stops at device data, at outputs an earlier sync computed, and at
    the nodes already in `placed` (node -> position); each node it finds goes
    into `placed` at the next position.

    Iterative, not recursive: graphs of thousands of nodes must not hit
    Python's recursion limit. This runs at every sync, so it is kept tight.
    """
    if placed is None:
        placed = {}
    found = []
    for root in roots:
        stack = [root]
        while stack:
            node = stack[-1]
            if node.__class__ is tuple:  # marked: what went on the stack above it is placed now
                node = node[0]
            elif node in placed:
                stack.pop()
                continue
            else:
                depth = len(stack)
                for operand in node.operands:
                    if operand.__class__ is tuple:
                        producer = operand[0]
                        if producer not in placed and ((results := producer.results) is None  # operand_data, inlined
                                                       or results[operand[1]] is None):
                            stack.append(producer)
                if len(stack) > depth:  # its pending producers first; marked, it needs no second look
                    stack[depth - 1] = (node,)
                    continue
            stack.pop()
            placed[node] = len(placed)
            found.append(node)
    return found


def build_graph(root_values: list[tuple[Node, int]]) -> Graph:
    """The graph that computes the roots: the pending nodes they need, reading
    device data and computed outputs as parameters."""
    node_pos: dict[Node, int] = {}
    param_pos: dict[DeviceData, int] = {}
    params: list[DeviceData] = []
    wiring: list[tuple] = []
    nodes = pending_nodes([root for root, _ in root_values], node_pos)
    for node in nodes:
        wires = []
        for operand in node.operands:
            if operand.__class__ is tuple:
                results = operand[0].results  # operand_data, inlined: this is the hot loop
                data = None if results is None else results[operand[1]]
                if data is None:
                    wires.append((node_pos[operand[0]], operand[1]))
                    continue
                operand = data
            pos = param_pos.get(operand)
            if pos is None:
                pos = param_pos[operand] = len(params)
                params.append(operand)
            wires.append(pos)
        wiring.append(tuple(wires))
    roots = [(node_pos[node], index) for node, index in root_values]
    return Graph(nodes=nodes, params=params, roots=roots, wiring=wiring)


def digest(*parts: bytes) -> str:
    """Stable 128-bit digest; never Python's hash(), which is salted per process."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()
