"""torch.compile's graphs run on device buffers, donating the state they update.

A graph torch.compile made (integrations/dynamo.py) is traced once through the
lazy engine; later calls run its executable on their inputs' buffers. Where the
graph updates an input in place (a parameter, an optimizer moment, a step count,
BatchNorm's running statistics), AOTAutograd returns the new value and copies
it into the input after the call: the old buffer is dead once the executable
ran, so it is donated (as a step marker donates on the lazy path) whenever no
other tensor, pending or computed, still reads it.
"""
from __future__ import annotations

import time

from ..config import config
from ..core import sharding
from ..core.ir import DeviceData, Graph, operand_data, pending_nodes
from ..core.record import Cache, DonatedBuffer, Timings, Trigger
from ..lowerings import to_jax
from . import check_results, keys
from .executor import Engine, _split_checks


def donating(engine: Engine, graph: Graph, donors: tuple[int, ...]):
    """The executable of `graph` (an execution's graph, as the engine keeps it) whose
    parameters `donors` are donated: found in the cache or compiled (and recorded as
    any miss is). Returns its cache entry."""
    with engine.lock:
        flags = keys.compile_flags(to_jax.matmul_precision(), to_jax.LOWERING_VERSION, config.checks)
        placement = sharding.plan(graph, donors)
        key = keys.compute_key(graph, donors, flags, placement)
        entry, *_ = engine._executable(graph, donors, key, flags, placement)
        return entry


def unshared(engine: Engine, buffers: list[DeviceData]) -> bool:
    """Whether each buffer is held by one live tensor only (the input that is updated)
    and read by no pending computation."""
    wanted = {id(b) for b in buffers}
    holders = dict.fromkeys(wanted, 0)
    pending = []
    for value in engine.live_values():
        value.resolve()
        if value.data is not None and id(value.data) in wanted:
            holders[id(value.data)] += 1
        elif value.node is not None:
            pending.append(value.node)
    for node in pending_nodes(pending) if pending else ():
        for operand in node.operands:
            data = operand_data(operand)
            if data is not None and id(data) in wanted:
                return False
    return all(n == 1 for n in holders.values())


def run(engine: Engine, entry, arrays: list, donated: dict[int, DeviceData], *, source: str | None = None):
    """Run a compiled graph's executable on `arrays`; `donated` maps the executable's
    parameter positions whose buffers it is given to those buffers, which are dead after.
    Appends a StepRecord (trigger `compiled`). Returns the output arrays."""
    with engine.lock:
        engine.counters["cache_hits"] += 1
        t0 = time.perf_counter()
        outputs, checked = _split_checks(entry, engine._run(entry, arrays, None))
        graph_info = next(iter(entry.graph_infos.values()))
        records = []
        for i, data in donated.items():
            records.append(DonatedBuffer(i, data.label, data.aval.shape, str(data.aval.dtype).removeprefix("torch."),
                                         data.aval.nbytes))
            data.donated, data.array = True, None
        note = "" if donated else "replay: an input it updates is still read elsewhere, or it updates none"
        engine._append_record(entry, entry.key, graph_info, trigger=Trigger.COMPILED, cache=Cache.HIT,
                              donated=tuple(records), note=note, source=source,
                              timings=Timings(trace=engine.trace_seconds, execute=time.perf_counter() - t0,
                                              waited=config.wait_for_execution))
        if checked is not None:  # its outputs are new tensors: read its checks before they exist
            error = check_results.Step(checked, entry.checks, graph_info.nodes).read()
            if error is not None:
                raise error
        return outputs
