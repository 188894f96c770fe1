"""What XLA says about a compiled executable before it runs: memory per device, cost, collectives."""
from __future__ import annotations

import jax

from ..core import hlo
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


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def collectives(text: str) -> tuple[Collective, ...]:
    """The collectives of an executable's optimized (SPMD-partitioned) HLO text:
    what the partitioner inserted. An asynchronous one (TPU, GPU: a -start and a
    -done) counts once, at its -done, whose result is what it delivers."""
    found = []
    for instruction in hlo.parse(text).instructions.values():
        op = instruction.opcode.removesuffix("-done")
        if op not in COLLECTIVES or instruction.opcode.endswith("-start"):
            continue
        found.append(Collective(op=op, name=instruction.name, shape=instruction.shape, nbytes=instruction.nbytes,
                                group_size=instruction.group_size))
    return tuple(found)

