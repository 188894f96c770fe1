"""An XLA executable's optimized HLO text (`compiled.as_text()`), read once into a value.

jax exposes no structured HLO of a compiled executable across the versions xlakit
supports: its text is what there is to read. `parse` reads it into a Module: the
header's name and attributes, then each computation's instructions, each with its
result shape and bytes, opcode, operands, the computations it calls, its
attributes and its metadata. The collectives, the profile's join, the node ->
instruction map and the views all read that value; `parse` keeps the last few, so
an executable's text is read once however many of them ask.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from types import MappingProxyType
from typing import Mapping

from .state import PROCESS

# bytes per element, by HLO's name of the dtype; an array of any other (token, s4) counts none
ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
            "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
# the attributes through which an instruction calls computations, as XLA prints them
CALLING = ("calls", "body", "condition", "to_apply", "branch_computations")

_NAME = re.compile(r"[\w.\-]+")
_OPCODE = re.compile(r" ([\w\-]+)\(")
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")  # "f32[8,4]" in "(f32[8,4]{1,0}, s32[])"
_REFERENCE = re.compile(r"%([\w.\-]+)")             # an operand or a called computation
_METADATA_FIELD = re.compile(r'(\w+)=(?:"((?:[^"\\]|\\.)*)"|(\S+))')
# input_output_alias's "{3}: (4, {}, may-alias)": output 3 is written into parameter 4's buffer
_ALIAS = re.compile(r"\{(\d*)\}:\s*\((\d+),")
# what nests: a top-level comma ends an attribute; a string's brackets and commas do not count
_NESTING = re.compile(r'[()\[\]{},]|"(?:[^"\\]|\\.)*"')
_OPENING, _CLOSING = frozenset("([{"), frozenset(")]}")
_MESH_AXIS = re.compile(r"'([^']+)'=(\d+)")  # mesh['a'=2,'b'=4]: each axis, its size
_CHOSEN_AXES = re.compile(r"\{([^}]*)\}")     # {'b'}: the axes a group spans


@dataclasses.dataclass(frozen=True, slots=True)
class Instruction:
    """One instruction: `  [ROOT] %name = shape opcode(arguments), attribute=value, ...`."""

    name: str                        # "fusion.3"
    computation: str                 # the computation it is in ("" for lines outside any)
    root: bool
    shape: str                       # its result, as printed: "f32[8,4]{1,0}", "(s32[], f32[8,4]{1,0})"
    opcode: str                      # "fusion", "all-gather-start"
    arguments: str                   # the text inside its parentheses: "%a, %b"; "0" for parameter(0)
    operands: tuple[str, ...]        # the instructions it reads, by name
    attributes: Mapping[str, str]    # "dimensions": "{1}", "calls": "%fused_computation", as printed
    metadata: Mapping[str, str]      # "op_name": "jit(f)/mul", "source_line": "3" (strings as printed, unquoted)
    definition: str                  # what follows "%name = " up to its metadata: what a view shows of it

    @property
    def arrays(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Each array of its result: (dtype, dimensions); a tuple's elements in order."""
        return tuple((dtype, tuple(int(d) for d in dims.split(",") if d)) for dtype, dims in _ARRAY.findall(self.shape))

    @property
    def nbytes(self) -> int:
        """Bytes of its result (all of a tuple's elements)."""
        return sum(ITEMSIZE.get(dtype, 0) * math.prod(dims) for dtype, dims in self.arrays)

    @property
    def op_name(self) -> str | None:
        return self.metadata.get("op_name")

    def called(self, *attributes: str) -> tuple[str, ...]:
        """The computations it calls through `attributes` (by default all of CALLING), in the order printed."""
        wanted = attributes or CALLING
        return tuple(name for attribute, value in self.attributes.items() if attribute in wanted
                     for name in _REFERENCE.findall(value))

    @property
    def group_size(self) -> int | None:
        """Devices per replica group of a collective, from the three notations XLA prints
        ({{0,1},{2,3}}, iota [2,4]<=[8], and mesh['a'=2,'b'=4] {'b'}, whose chosen axes may
        follow in device_ids); a collective-permute: its source-target pairs. None where unsaid."""
        if self.opcode.startswith("collective-permute"):
            pairs = self.attributes.get("source_target_pairs")
            return None if pairs is None else pairs.count("{") - 1
        groups = self.attributes.get("replica_groups")
        if groups is None:
            return None
        if groups.startswith("{{"):
            return len(groups[2:].split("}")[0].split(","))
        if groups.startswith("["):
            return int(groups[1:].split("]")[0].split(",")[-1])
        if groups.startswith("mesh["):
            axes, _, chosen = groups.partition("]")
            sizes = dict(_MESH_AXIS.findall(axes))
            chosen = _CHOSEN_AXES.search(chosen + " " + self.attributes.get("device_ids", ""))
            if chosen is not None:
                return math.prod(int(sizes[a]) for a in re.findall(r"'([^']+)'", chosen.group(1)) if a in sizes)
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class Computation:
    name: str                                # "fused_computation.3", "main.5"
    entry: bool
    instructions: tuple[Instruction, ...]    # in the text's order


@dataclasses.dataclass(frozen=True, slots=True)
class Module:
    name: str                                # HloModule's: "jit__as_jax"
    attributes: Mapping[str, str]            # the header's: "input_output_alias", "entry_computation_layout", ...
    computations: Mapping[str, Computation]  # by name, in the text's order
    instructions: Mapping[str, Instruction]  # every computation's, by name (names are unique in a module)

    @property
    def output_aliases(self) -> dict[int, int]:
        """Output index -> the parameter whose buffer XLA writes it into (donation); a lone output's index is {}."""
        return {int(output or 0): int(parameter)
                for output, parameter in _ALIAS.findall(self.attributes.get("input_output_alias", ""))}


def parse(text: str | None) -> Module:
    """`text`, an HLO module as XLA prints it, read; the last few are kept, by their text."""
    return _parse(text or "")


@functools.lru_cache(maxsize=8)  # one executable's text is read at compile, by its profile and by its views
def _parse(text: str) -> Module:
    name, header, computations, instructions = "", {}, {}, {}
    computation, entry, members = "", False, []

    def close():
        if members or computation:
            computations[computation] = Computation(computation, entry, tuple(members))

    for line in text.splitlines():
        if line.startswith("HloModule "):
            name, _, rest = line.removeprefix("HloModule ").partition(",")
            header = _attributes(rest)
        elif line.endswith("{") and line.startswith(("%", "ENTRY ")):
            close()
            entry = line.startswith("ENTRY ")
            computation, members = line.removeprefix("ENTRY ").split(" ", 1)[0].lstrip("%"), []
        else:
            instruction = _instruction(line, computation)
            if instruction is not None:
                members.append(instruction)
                instructions[instruction.name] = instruction
    close()
    return Module(name.strip(), MappingProxyType(header), MappingProxyType(computations),
                  MappingProxyType(instructions))


PROCESS.keep("core.hlo: parsed modules", _parse, bound=_parse.cache_info().maxsize,
             why="one executable's HLO text, read once for its analysis, profile and views",
             clear=_parse.cache_clear, size=lambda: _parse.cache_info().currsize)


def _instruction(line: str, computation: str) -> Instruction | None:
    text = line.strip()
    root = text.startswith("ROOT ")
    name, equals, rest = text.removeprefix("ROOT ").partition(" = ")
    name = name.removeprefix("%")
    if not equals or not _NAME.fullmatch(name):
        return None
    shape_end = _closing(rest, 0) + 1 if rest.startswith("(") else rest.find(" ")
    opcode = _OPCODE.match(rest, shape_end) if shape_end > 0 else None
    if opcode is None:
        return None
    opened = opcode.end() - 1
    closed = _closing(rest, opened)
    if closed < 0:
        return None
    arguments = rest[opened + 1:closed]
    attributes = _attributes(rest[closed + 1:])
    fields = attributes.get("metadata", "")[1:-1]  # {op_name="jit(f)/mul" stack_frame_id=3}
    metadata = {key: bare or quoted for key, quoted, bare in _METADATA_FIELD.findall(fields)}
    return Instruction(name=name, computation=computation, root=root, shape=rest[:shape_end],
                       opcode=opcode.group(1), arguments=arguments,
                       operands=tuple(_REFERENCE.findall(arguments)), attributes=MappingProxyType(attributes),
                       metadata=MappingProxyType(metadata), definition=rest.split(", metadata=")[0])


def _closing(text: str, opened: int) -> int:
    """The index of the bracket that closes the one at `opened`; -1 if none does."""
    depth = 0
    for match in _NESTING.finditer(text, opened):
        bracket = match.group()
        if bracket in _OPENING:
            depth += 1
        elif bracket in _CLOSING:
            depth -= 1
            if depth == 0:
                return match.start()
    return -1


def _attributes(text: str) -> dict[str, str]:
    """", key=value, key={...}" -> {key: value}: split at the commas outside brackets and strings."""
    found, depth, start = {}, 0, 0
    for match in _NESTING.finditer(text):
        mark = match.group()
        if mark in _OPENING:
            depth += 1
        elif mark in _CLOSING:
            depth -= 1
        elif mark == "," and depth == 0:
            _attribute(text[start:match.start()], found)
            start = match.end()
    _attribute(text[start:], found)
    return found


def _attribute(text: str, found: dict[str, str]) -> None:
    key, equals, value = text.strip().partition("=")
    if equals:
        found[key] = value
