"""Which buffers a step holds: each input's and output's size, and which outputs
XLA wrote into donated inputs, from a StepRecord's graph and optimized HLO."""
from __future__ import annotations

import dataclasses
import math
import re

import torch

from ..core import hlo, sources
from ..core.ir import dtype_name
from ..core.record import StepRecord

# "f32[16,4]", "bf16[]", torch_xla's "f32[16,4]{1,0}": dtype, then dimensions
_AVAL = re.compile(r"^(\w+)\[([\d,\s]*)\]")
# each dtype by its short name ("f8e4m3fn", as HLO writes it) and by torch's ("float8_e4m3fn")
_ITEMSIZE = {name: d.itemsize for d in vars(torch).values() if isinstance(d, torch.dtype)
             for name in (dtype_name(d), str(d).removeprefix("torch."))}


def aval_shape(aval: str | None) -> tuple[int, ...] | None:
    """(16, 4) for "f32[16,4]"; None when not a tensor's description."""
    match = _AVAL.match(aval or "")
    if match is None:
        return None
    return tuple(int(d) for d in match.group(2).replace(" ", "").split(",") if d)


def aval_bytes(aval: str | None) -> int | None:
    """Bytes of a tensor described as "f32[16,4]"; None when unknown."""
    match, shape = _AVAL.match(aval or ""), aval_shape(aval)
    if shape is None or match.group(1) not in _ITEMSIZE:
        return None
    return _ITEMSIZE[match.group(1)] * math.prod(shape)


def output_aliases(text: str | None) -> dict[int, int]:
    """Output index -> the input whose buffer XLA writes it into (donation),
    from the optimized HLO's alias map. Empty when nothing is aliased or unknown."""
    return hlo.parse(text).output_aliases


@dataclasses.dataclass(frozen=True)
class Buffer:
    kind: str              # "input" or "output"
    index: int             # input (executable parameter) or output number
    label: str             # the tensor's name; unnamed, the op and line that made it (an output) or read it (an input)
    aval: str | None
    nbytes: int | None
    note: str = ""         # donation: "donated to output 3" / "written into input 0 (donated)"


def buffers(record: StepRecord) -> list[Buffer]:
    """Every input and output of the step, inputs first."""
    graph = record.graph
    aliases = output_aliases(record.hlo)
    donated_to = {param: out for out, param in aliases.items()}
    found, readers = [], _first_readers(record)
    for i, p in enumerate(graph.params):
        note = f"donated to output {donated_to[i]}" if i in donated_to else ("donated" if p.donated else "")
        found.append(Buffer("input", i, p.label or _unnamed_input(record, readers.get(i)), p.aval,
                            aval_bytes(p.aval), note))
    for k, root in enumerate(graph.roots):
        node = graph.nodes[root.node]
        aval = node.avals[root.output] if root.output < len(node.avals) else None
        param = aliases.get(k)
        if param is not None:
            label = f"{graph.params[param].label or f'input {param}'} (new value)"
            note = f"written into input {param} (donated)"
        else:
            where = sources.describe(node.source)
            label = f"%{root.node} {short_op(node.op)}" + (f" at {where}" if where else "")
            note = ""
        found.append(Buffer("output", k, label, aval, aval_bytes(aval), note))
    return found


def _first_readers(record: StepRecord) -> dict[int, int]:
    """Each input's first reader: input index -> node index."""
    readers = {}
    for n, node in enumerate(record.graph.nodes):
        for operand in node.operands:
            if isinstance(operand, int):
                readers.setdefault(operand, n)
    return readers


def _unnamed_input(record: StepRecord, reader: int | None) -> str:
    """What an input no module or optimizer names is (data, or a value an earlier step computed
    and the user kept): its first reader's op, module and line. Module parameters and their
    optimizer state are named (front/labels.py); 7 of the 10 largest inputs of the quickstart's
    GPT-2 step were neither (f32[16,2,48,48], bf16[16,48,64]) and showed as "(unnamed)"."""
    if reader is None:
        return "unnamed input, read by no op"
    node = record.graph.nodes[reader]
    where = sources.describe(node.source)
    return (f"unnamed input (data or an earlier step's value), read by %{reader} {short_op(node.op)}"
            + (f" in {node.module}" if node.module else "") + (f" at {where}" if where else ""))


def by_role(record: StepRecord) -> list[tuple[str, int, int | None]]:
    """(role, buffers, bytes) of the step's inputs and outputs: donated inputs (updated
    in place: parameters, optimizer state), other inputs, outputs written into
    donated inputs, new outputs. Bytes are None when a size is unknown."""
    roles: dict[str, list[Buffer]] = {"donated inputs": [], "other inputs": [],
                                      "outputs into donated inputs": [], "new outputs": []}
    for b in buffers(record):
        if b.kind == "input":
            roles["donated inputs" if b.note else "other inputs"].append(b)
        else:
            roles["outputs into donated inputs" if b.note else "new outputs"].append(b)
    return [(role, len(found), None if any(b.nbytes is None for b in found) else sum(b.nbytes for b in found))
            for role, found in roles.items() if found]


def largest(record: StepRecord, limit: int = 10) -> list[Buffer]:
    """The `limit` largest inputs and outputs, largest first (unknown sizes last)."""
    return sorted(buffers(record), key=lambda b: -(b.nbytes or -1))[:limit]


def short_op(op: str) -> str:
    """'aten.addmm.default' -> 'addmm'; torch_xla's 'aten::mm' -> 'mm'."""
    parts = op.replace("::", ".").split(".")
    return parts[1] if len(parts) in (2, 3) else op
