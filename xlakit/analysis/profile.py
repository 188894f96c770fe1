"""A step's measured op times joined to what made them: nodes, modules, lines.

JAX's profiler times each instruction of the optimized HLO that runs ("fusion.3",
"dot_general.7"); each node knows the instructions it became (NodeInfo.hlo_ops,
read from the node scopes in their metadata), fused ones included. A top-level
instruction's nodes are its own and those of the instructions inside the
computations it calls (a fusion's body). Its time goes to those nodes by their
share of the estimated FLOPs (analysis/flops.py; by output bytes where none has
FLOPs), and from them to their modules and user lines. An instruction no node made
(a layout copy, a tuple) is XLA's own and says so.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict

from ..core import sources
from ..core.record import GraphInfo, ProfiledOp, ProfileInfo, StepRecord
from .flops import node_flops
from .footprint import aval_bytes

TOP_LEVEL = "(top level)"
XLA_OWN = "(XLA's own)"

_COMPUTATION = re.compile(r"(?:ENTRY )?%([\w.\-]+) .*\{$")
_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = ((?:\([^=]*?\))|\S+) ([\w\-]+)\(([^)]*)\)(.*)$")
_CALLED = re.compile(r"(?:calls|body|condition|to_apply)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_OPERAND = re.compile(r"%([\w.\-]+)")
_INPUT = re.compile(r'op_name="params\[(\d+)\]"')
_SHAPE = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
             "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
# what XLA's own instructions are, by opcode
_OWN = {"copy": "a layout copy XLA added", "copy-start": "an asynchronous copy XLA added",
        "copy-done": "an asynchronous copy XLA added", "tuple": "XLA's tuple of the outputs",
        "get-tuple-element": "XLA's read of a tuple", "bitcast": "a reinterpretation, no data moved",
        "parameter": "an input", "constant": "a constant"}


class _Instruction:
    __slots__ = ("name", "opcode", "result_bytes", "operands", "input", "called")

    def __init__(self, name: str, shape: str, opcode: str, operands: str, rest: str):
        self.name, self.opcode = name, opcode
        self.result_bytes = _shape_bytes(shape)
        self.operands = _OPERAND.findall(operands)
        # a parameter's input: the argument its metadata names (JAX leaves unused ones out of the numbering)
        named = _INPUT.search(rest)
        self.input = int(named.group(1)) if named else int(operands) if opcode == "parameter" and \
            operands.strip().isdigit() else None
        self.called = _CALLED.findall(rest) + [c.strip().lstrip("%") for group in _BRANCHES.findall(rest)
                                               for c in group.split(",") if c.strip()]


def _shape_bytes(shape: str) -> int:
    return sum(_ITEMSIZE.get(dtype, 1) * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims in _SHAPE.findall(shape))


def _parse(hlo: str) -> tuple[dict[str, _Instruction], dict[str, list[str]]]:
    """(every instruction by name, each computation's instruction names)."""
    instructions, computations, current = {}, defaultdict(list), ""
    for line in hlo.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = header.group(1)
            continue
        match = _INSTRUCTION.match(line)
        if match:
            instruction = _Instruction(*match.groups())
            instructions[instruction.name] = instruction
            computations[current].append(instruction.name)
    return instructions, computations


def _inside(name: str, instructions, computations) -> list[str]:
    """`name` and every instruction of the computations it calls, transitively."""
    found, stack, seen = [name], [name], set()
    while stack:
        instruction = instructions.get(stack.pop())
        for computation in instruction.called if instruction else ():
            if computation not in seen:
                seen.add(computation)
                found.extend(computations[computation])
                stack.extend(computations[computation])
    return found


def join(record: StepRecord, seconds: dict[str, float], *, device_seconds: float, runs: int,
         overhead_seconds: float, platform: str) -> ProfileInfo:
    """The ProfileInfo of `record`'s executable from `seconds`, each HLO instruction's measured
    time in one run (the median of `runs`)."""
    graph = record.graph
    instructions, computations = _parse(record.hlo or "")
    made_by = defaultdict(list)  # HLO instruction -> the nodes it came from
    for index, node in enumerate(graph.nodes):
        for name in node.hlo_ops:
            made_by[name].append(index)
    nodes_of = {op: sorted({n for inner in _inside(op, instructions, computations) for n in made_by.get(inner, ())})
                for op in seconds}
    # a node that became several timed instructions shares its FLOPs among them
    spread = defaultdict(int)
    for nodes in nodes_of.values():
        for n in nodes:
            spread[n] += 1

    ops, by_module, by_line = [], defaultdict(float), defaultdict(float)
    for op, time in sorted(seconds.items(), key=lambda item: -item[1]):
        nodes = nodes_of[op]
        instruction = instructions.get(op)
        opcode = instruction.opcode if instruction else ""
        shares = _shares(graph, nodes)
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
            flops=sum(node_flops(graph, graph.nodes[n]) / spread[n] for n in nodes),
            bytes=float(_bytes(instruction, instructions)), opcode=opcode, split=len(nodes) > 1,
            xla_own="" if nodes else _own(instruction, instructions, graph)))
    op_seconds = sum(seconds.values())
    attributed = sum(op.seconds for op in ops if op.nodes)
    return ProfileInfo(device_seconds=device_seconds, op_seconds=op_seconds, ops=tuple(ops),
                       by_module=dict(sorted(by_module.items(), key=lambda item: -item[1])),
                       by_line=dict(sorted(by_line.items(), key=lambda item: -item[1])),
                       coverage=attributed / op_seconds if op_seconds else 0.0, runs=runs,
                       overhead_seconds=overhead_seconds, platform=platform)


def _own(instruction: _Instruction | None, instructions, graph: GraphInfo) -> str:
    """What an instruction no node made is: a copy of which input, a tuple, ..."""
    if instruction is None:
        return "an instruction XLA made, from no recorded op"
    if instruction.opcode == "copy" and instruction.operands:
        source = instructions.get(instruction.operands[0])
        if source is not None and source.opcode == "parameter" and source.input is not None:
            index = source.input
            label = graph.params[index].label if index < len(graph.params) else None
            return f"a copy XLA made of input {index}" + (f" ({label})" if label else "")
    return _OWN.get(instruction.opcode, f"{instruction.opcode} XLA made, from no recorded op")


def _shares(graph: GraphInfo, nodes: list[int]) -> list[float]:
    """Each node's share of an instruction's time: by estimated FLOPs, else by output bytes, else equal."""
    for weigh in (lambda node: node_flops(graph, node), lambda node: sum(aval_bytes(a) or 0 for a in node.avals)):
        weights = [weigh(graph.nodes[n]) for n in nodes]
        total = sum(weights)
        if total > 0:
            return [w / total for w in weights]
    return [1 / len(nodes)] * len(nodes) if nodes else []


def _bytes(instruction: _Instruction | None, instructions) -> int:
    """Bytes an instruction reads and writes: its operands' results and its own."""
    if instruction is None:
        return 0
    return instruction.result_bytes + sum(instructions[o].result_bytes for o in instruction.operands
                                          if o in instructions)
