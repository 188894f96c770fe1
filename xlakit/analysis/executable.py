"""What XLA says about a compiled executable before it runs: memory per device, cost, collectives."""
from __future__ import annotations

import math
import re

import jax

from ..core.record import Collective, CostInfo, MemoryInfo


def memory(compiled, devices: list) -> MemoryInfo | None:
    """XLA's buffer assignment of one device's program (an SPMD executable runs
    the same program on each of `devices`). None where the backend does not say."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - some backends and versions have none
        return None
    if stats is None:
        return None
    arguments, outputs = stats.argument_size_in_bytes, stats.output_size_in_bytes
    aliased, temporaries = stats.alias_size_in_bytes, stats.temp_size_in_bytes
    # XLA's own peak where it reports one (jax >= 0.7); the sum of live sets otherwise
    peak = getattr(stats, "peak_memory_in_bytes", None) or arguments + outputs - aliased + temporaries
    return MemoryInfo(arguments=arguments, outputs=outputs, aliased=aliased, temporaries=temporaries,
                      peak=peak, code=stats.generated_code_size_in_bytes, devices=len(devices),
                      device_limit=device_limit(devices))


def device_limit(devices: list) -> int | None:
    """The smallest memory of `devices`, where their runtime reports it (GPU, TPU; not CPU)."""
    limits = []
    for device in devices:
        if device.process_index != jax.process_index():
            continue  # another process's device: its runtime answers there
        try:
            stats = device.memory_stats()
        except Exception:  # noqa: BLE001 - not every backend implements it
            stats = None
        if not stats or "bytes_limit" not in stats:
            return None
        limits.append(stats["bytes_limit"])
    return min(limits, default=None)


def cost(compiled) -> CostInfo | None:
    """XLA's cost analysis (estimates); jax < 0.8 returns it as a one-element list."""
    try:
        analysis = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - some backends have none
        return None
    if isinstance(analysis, list):
        analysis = analysis[0] if analysis else None
    if not analysis:
        return None
    return CostInfo(flops=float(analysis.get("flops", 0.0)),
                    bytes_accessed=float(analysis.get("bytes accessed", 0.0)),
                    transcendentals=float(analysis.get("transcendentals", 0.0)))


# One instruction of optimized HLO text: "%name = shape opcode(" (a tuple shape in parentheses,
# with /*index=5*/ comments in long ones).
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\(.*?\)|\S+)\s+([\w\-]+)\(")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


def collectives(hlo: str) -> tuple[Collective, ...]:
    """The collectives of an executable's optimized (SPMD-partitioned) HLO text:
    what the partitioner inserted. An asynchronous one (TPU, GPU: a -start and a
    -done) counts once, at its -done, whose result is what it delivers.
    Parsed from text because jax exposes no structured HLO of a compiled
    executable across the versions xlakit supports."""
    found = []
    for line in hlo.splitlines():
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        name, shape, opcode = m.groups()
        op = opcode.removesuffix("-done")
        if op not in COLLECTIVES or opcode.endswith("-start"):
            continue
        found.append(Collective(op=op, name=name, shape=shape, nbytes=_shape_bytes(shape),
                                group_size=_group_size(line, op)))
    return tuple(found)


def _shape_bytes(shape: str) -> int:
    return sum(_BYTES.get(dtype, 0) * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims in _ARRAY.findall(shape))


def _group_size(line: str, op: str) -> int | None:
    """Devices per replica group, from the three notations XLA prints
    ({{0,1},{2,3}}, iota [2,4]<=[8], and mesh['a'=2,'b'=4] {'b'}); pairs for a permute."""
    if op == "collective-permute":
        pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", line)
        return None if pairs is None else pairs.group(1).count("{")
    groups = re.search(r"replica_groups=(\S+)", line)
    if groups is None:
        return None
    text = groups.group(1)
    if text.startswith("{{"):
        return len(text[2:].split("}")[0].split(","))
    if text.startswith("["):
        return int(text[1:].split("]")[0].split(",")[-1])
    if text.startswith("mesh["):
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", text))
        chosen = re.search(r"\{([^}]*)\}", line[groups.end():])
        if chosen is not None:
            return math.prod(int(sizes[a]) for a in re.findall(r"'([^']+)'", chosen.group(1)) if a in sizes)
    return None
