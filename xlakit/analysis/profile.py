"""A step's measured op times joined to what made them: nodes, modules, lines.

JAX's profiler times each instruction of the optimized HLO that runs ("fusion.3",
"dot_general.7"); each node knows the instructions it became (NodeInfo.hlo_ops,
read from the node scopes in their metadata), fused ones included. A top-level
instruction's nodes are its own and those of the instructions inside the
computations it calls (a fusion's body). A node's estimated FLOPs (analysis/flops.py)
go to the instructions that compute something of it, not to those that only move its
result (a matmul's output bitcast or transposed in a copy fusion: given half the
matmul's FLOPs, a 55 us transpose showed 610 GFLOP/s on a 2-core CPU). An
instruction's time goes to its nodes by their share of its FLOPs (by output bytes
where none has FLOPs there), and from them to their modules and user lines. An instruction no node made
(a layout copy, a tuple) is XLA's own and says so.
"""
from __future__ import annotations

from collections import defaultdict

from ..core import hlo, sources
from ..core.record import GraphInfo, ProfiledOp, ProfileInfo, StepRecord
from .flops import node_flops
from .footprint import aval_bytes

TOP_LEVEL = "(top level)"
XLA_OWN = "(XLA's own)"

# what XLA's own instructions are, by opcode
_OWN = {"copy": "a layout copy XLA added", "copy-start": "an asynchronous copy XLA added",
        "copy-done": "an asynchronous copy XLA added", "tuple": "XLA's tuple of the outputs",
        "get-tuple-element": "XLA's read of a tuple", "bitcast": "a reinterpretation, no data moved",
        "parameter": "an input", "constant": "a constant"}
# opcodes that move or re-view data, computing none of a node's FLOPs
_MOVES = frozenset({"parameter", "constant", "bitcast", "copy", "transpose", "reshape", "broadcast", "slice",
                    "dynamic-slice", "dynamic-update-slice", "concatenate", "pad", "tuple", "get-tuple-element",
                    "reverse", "iota", "copy-start", "copy-done", "convert"})


def _inside(name: str, module: hlo.Module) -> list[str]:
    """`name` and every instruction of the computations it calls, transitively."""
    found, stack, seen = [name], [name], set()
    while stack:
        instruction = module.instructions.get(stack.pop())
        for computation in instruction.called() if instruction else ():
            if computation not in seen and computation in module.computations:
                seen.add(computation)
                names = [inner.name for inner in module.computations[computation].instructions]
                found.extend(names)
                stack.extend(names)
    return found


def join(record: StepRecord, seconds: dict[str, float], *, device_seconds: float, runs: int,
         overhead_seconds: float, platform: str) -> ProfileInfo:
    """The ProfileInfo of `record`'s executable from `seconds`, each HLO instruction's measured
    time in one run (the median of `runs`)."""
    graph = record.graph
    module = hlo.parse(record.hlo)
    made_by = defaultdict(list)  # HLO instruction -> the nodes it came from
    for index, node in enumerate(graph.nodes):
        for name in node.hlo_ops:
            made_by[name].append(index)
    nodes_of, computes = {}, {}  # per timed instruction: its nodes, and those it computes something of
    for op in seconds:
        inner = [(module.instructions.get(name), made_by.get(name, ())) for name in _inside(op, module)]
        nodes_of[op] = sorted({n for _, nodes in inner for n in nodes})
        computes[op] = {n for instruction, nodes in inner if instruction is not None
                        and instruction.opcode not in _MOVES for n in nodes}
    # a node's FLOPs are shared among the instructions that compute it (all that hold it where none does)
    places = defaultdict(list)
    for op, nodes in nodes_of.items():
        for n in nodes:
            places[n].append(op)
    sharing = {n: [op for op in ops if n in computes[op]] or ops for n, ops in places.items()}

    ops, by_module, by_line = [], defaultdict(float), defaultdict(float)
    for op, time in sorted(seconds.items(), key=lambda item: -item[1]):
        nodes = nodes_of[op]
        instruction = module.instructions.get(op)
        opcode = instruction.opcode if instruction else ""
        flops = [node_flops(graph, graph.nodes[n]) / len(sharing[n]) if op in sharing[n] else 0.0 for n in nodes]
        shares = _shares(graph, nodes, flops)
        for n, share in zip(nodes, shares):
            node = graph.nodes[n]
            by_module[node.module or TOP_LEVEL] += time * share
            if node.source is not None and node.source.user is not None:
                by_line[sources.short(node.source.user)] += time * share  # "cell 4 line 3", "train.py:12"
        if not nodes:
            by_module[XLA_OWN] += time
        main = graph.nodes[nodes[max(range(len(nodes)), key=shares.__getitem__)]] if nodes else None
        ops.append(ProfiledOp(
            hlo_op=op, seconds=time, nodes=tuple(nodes), module=main.module if main else "",
            source=main.source if main else None,
            flops=sum(flops),
            bytes=float(_bytes(instruction, module)), opcode=opcode, split=len(nodes) > 1,
            xla_own="" if nodes else _own(instruction, module, graph)))
    op_seconds = sum(seconds.values())
    attributed = sum(op.seconds for op in ops if op.nodes)
    return ProfileInfo(device_seconds=device_seconds, op_seconds=op_seconds, ops=tuple(ops),
                       by_module=dict(sorted(by_module.items(), key=lambda item: -item[1])),
                       by_line=dict(sorted(by_line.items(), key=lambda item: -item[1])),
                       coverage=attributed / op_seconds if op_seconds else 0.0, runs=runs,
                       overhead_seconds=overhead_seconds, platform=platform)


def _own(instruction: hlo.Instruction | None, module: hlo.Module, graph: GraphInfo) -> str:
    """What an instruction no node made is: a copy of which input, a tuple, ..."""
    if instruction is None:
        return "an instruction XLA made, from no recorded op"
    if instruction.opcode == "copy" and instruction.operands:
        source = module.instructions.get(instruction.operands[0])
        index = None if source is None or source.opcode != "parameter" else _input(source)
        if index is not None:
            label = graph.params[index].label if index < len(graph.params) else None
            return f"a copy XLA made of input {index}" + (f" ({label})" if label else "")
    return _OWN.get(instruction.opcode, f"{instruction.opcode} XLA made, from no recorded op")


def _input(parameter: hlo.Instruction) -> int | None:
    """A parameter's input: the argument its metadata names (JAX leaves unused ones out of the numbering)."""
    named = parameter.op_name or ""
    if named.startswith("params[") and named.endswith("]") and named[7:-1].isdecimal():  # "params[3]"
        return int(named[7:-1])
    return int(parameter.arguments) if parameter.arguments.strip().isdigit() else None


def _shares(graph: GraphInfo, nodes: list[int], flops: list[float]) -> list[float]:
    """Each node's share of an instruction's time: by its FLOPs there, else by output bytes, else equal."""
    total = sum(flops)
    if total > 0:
        return [f / total for f in flops]
    weights = [sum(aval_bytes(a) or 0 for a in graph.nodes[n].avals) for n in nodes]
    total = sum(weights)
    if total > 0:
        return [w / total for w in weights]
    return [1 / len(nodes)] * len(nodes) if nodes else []


def _bytes(instruction: hlo.Instruction | None, module: hlo.Module) -> int:
    """Bytes an instruction reads and writes: its operands' results and its own."""
    if instruction is None:
        return 0
    return instruction.nbytes + sum(module.instructions[o].nbytes for o in instruction.operands
                                    if o in module.instructions)
