"""The lazy IR: device buffers, nodes, and the graph cut out of them at a sync.

Structure (op, attributes, avals, operand wiring) lives in `Node.signature`
and the operand tuple; source metadata lives beside it in `Node.source` and
never reaches the cache key.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import itertools
import weakref
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
    """One device buffer (a jax.Array) and what is known about who may reuse it. Read-only
    data kept on the host (a lifted scalar; a compiled call's host input or random draw) holds
    a numpy array, which the call of the executable that reads it moves (core/transfer.host_data)."""

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
                 source: Source | None, signature: bytes, seq: int | None = None):
        self.op = op
        self.operands = operands
        self.template = template
        self.avals = avals
        self.source = source
        self.signature = signature
        self.results: list[DeviceData | None] | None = None
        self.seq = next(Node._ids) if seq is None else seq

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
        nodes.append(Node(node.op, (), node.template, node.avals, node.source, node.signature, node.seq))
    return Graph(nodes, [DeviceData(None, p.aval) for p in graph.params], list(graph.roots), list(graph.wiring))


def instantiate(graph: Graph, operands: list) -> Instance:
    """`graph` (a `structure`) recorded again, pending, reading `operands` (per param: device
    data or a pending (node, output)) where the graph read its params: one more run of the same
    computation, as part of whatever step computes it. Its nodes are made as `Instance` says."""
    return Instance(graph, operands)


class Instance:
    """A compiled graph recorded again (`instantiate`). Of its nodes, only those whose outputs
    something asks for are made at first (`root`: the outputs the compiled call returns as
    tensors), each a DeferredNode; the others, and the roots' operands, when something first
    reads a root's operands or asks for another node (`expand`). A step the tape replays whole
    (engine/tape.py) walks none of them and lowers nothing: a compiled Llama step's ~1,950
    nodes were made every step (1.1–2.3 ms, and what Python's cyclic collector then walks).

    The instance holds its roots weakly (a root holds its instance: a cycle would leave the
    roots' device buffers to the collector); a root that died is made again, unread by anyone,
    if the instance expands. Its nodes take the seqs `first_seq` on, in graph order, as
    recording them one by one did."""

    __slots__ = ("graph", "operands", "first_seq", "start", "made", "nodes")

    def __init__(self, graph: Graph, operands: list):
        self.graph, self.operands = graph, operands
        n = len(graph.nodes)
        self.first_seq = next(Node._ids) if n else recording_mark()
        collections.deque(itertools.islice(Node._ids, max(n - 1, 0)), maxlen=0)  # the rest of its seqs, taken in C
        self.start = 0     # its first node's position in the run that recorded it (engine/tape.py)
        self.made: dict[int, weakref.ref] = {}  # node position -> its root, while not expanded
        self.nodes: list[Node] | None = None    # every node, once expanded

    def root(self, position: int) -> Node:
        """The node at `position`, made without its operands where the instance is not expanded."""
        if self.nodes is not None:
            return self.nodes[position]
        ref = self.made.get(position)
        node = ref() if ref is not None else None
        if node is None:
            node = DeferredNode(self.graph.nodes[position], self.first_seq + position, self)
            self.made[position] = weakref.ref(node)
        return node

    def entries(self) -> list:
        """Per node position, its root where made, else this instance: what a run keeps for them."""
        entries = [self] * len(self.graph.nodes)
        for position, ref in self.made.items():
            node = ref()
            if node is not None:
                entries[position] = node
        return entries

    def node(self, offset: int) -> Node:
        """The node at this position, the instance expanded (the nodes it reads are needed with it)."""
        return self.expand()[offset]

    def operand(self, offset: int, k: int):
        """Operand `k` of the node at `offset`, without expanding where it is one of the operands."""
        if self.nodes is None:
            w = self.graph.wiring[offset][k]
            if w.__class__ is int:
                return self.operands[w]
        return self.node(offset).operands[k]

    def expand(self) -> list[Node]:
        """Every node, made once, wired as the graph is (its roots made before keep their identity)."""
        if self.nodes is None:
            graph, made, first = self.graph, self.made, self.first_seq
            nodes: list[Node] = []
            # what the nodes read, by Graph.instancing's numbers: the params, then each (node, output)
            # read, made once for all its readers (one tuple per output, not per operand)
            refs = list(self.operands)
            pair = refs.append
            for k, (node, (reads, outputs)) in enumerate(zip(graph.nodes, graph.instancing)):
                operands = tuple([refs[r] for r in reads])
                ref = made.get(k)
                root = ref() if ref is not None else None
                if root is None:
                    root = Node(node.op, operands, node.template, node.avals, node.source, node.signature, first + k)
                else:
                    root.operands, root.instance = operands, None
                nodes.append(root)
                for i in outputs:
                    pair((root, i))
            self.nodes, self.made, self.operands = nodes, {}, ()
        return self.nodes


class DeferredNode(Node):
    """A node of an `Instance` made before its operands: reading them expands the instance."""

    __slots__ = ("instance",)

    def __init__(self, node: Node, seq: int, instance: Instance):  # `node`: the graph's, by structure
        super().__init__(node.op, (), node.template, node.avals, node.source, node.signature, seq)
        self.instance = instance

    @property
    def operands(self) -> tuple:
        if self.instance is not None:
            self.instance.expand()
        return _OPERANDS.__get__(self)

    @operands.setter
    def operands(self, operands: tuple) -> None:
        _OPERANDS.__set__(self, operands)


_OPERANDS = Node.__dict__["operands"]  # the slot itself, behind DeferredNode's property


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
