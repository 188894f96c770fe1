"""What one execution's StepRecord says and where it goes: the buffers it donated,
its donation note, the record built from its executable and graph (or, for a
compiled graph run again, copied from that executable's previous record), then
counted and logged, profiled inside `xlakit.profile()` and weighed against the
recompile budget.
"""
from __future__ import annotations

import functools

from ..analysis import budget
from ..config import config
from ..core.ir import DeviceData
from ..core.record import Cache, DonatedBuffer, GraphInfo, StepRecord, Timings, Trigger
from . import keys


class TraceTime:
    """Seconds spent recording ops (inside the dispatcher) since the last execution's record.
    The frontend adds each op's time to `TRACE.seconds`, a module-level object's attribute:
    no call an op (a method call of the engine cost a replayed op ~1 µs in the step)."""

    __slots__ = ("seconds",)

    def __init__(self):
        self.seconds = 0.0


TRACE = TraceTime()


def donate(index: int, data: DeviceData) -> DonatedBuffer:
    """Mark parameter `index`'s buffer as given to the executable (dead now); what the record says of it."""
    data.donated, data.array = True, None
    return _donated(index, data.label, data.aval)


@functools.lru_cache(maxsize=1 << 14)
def _donated(index: int, label: str | None, aval) -> DonatedBuffer:
    # one record's worth for every step that donates alike: a step donates hundreds, each made anew
    # cost ~1.7 µs (a frozen dataclass, the dtype's name, the byte count)
    return DonatedBuffer(index, label, aval.shape, str(aval.dtype).removeprefix("torch."), aval.nbytes)


def append(engine, entry, key: keys.Key, graph_info: GraphInfo, *, trigger: Trigger, cache: Cache,
           donated: tuple, timings: Timings, note: str, source: str | None,
           changed: tuple = (), why: tuple = (), replay=None, numerics=None) -> StepRecord:
    """Append the record of an execution; returns it as built (xlakit.profile() may revise the
    one logged: its profile is that run's alone)."""
    return log(engine, StepRecord(
        index=engine.log.next_index, trigger=trigger, key=key.key, components=dict(key.components),
        metadata_digest=key.metadata_digest, cache=cache, donated=donated,
        num_nodes=len(graph_info.nodes), num_inputs=len(graph_info.params),
        num_outputs=len(graph_info.roots), timings=timings, graph=graph_info, changed=changed,
        why=why, uses=entry.uses, donation_note=note, source=source, hlo=entry.hlo,
        memory=entry.memory, cost=entry.cost, shardings=entry.shardings, collectives=entry.collectives,
        replay=replay, numerics=numerics, cache_entries=len(engine.cache), hit_rate=engine.executables.hit_rate(),
    ))


def append_compiled_run(engine, entry, graph_info: GraphInfo, **run) -> None:
    """A compiled run's record: what stays the same from one run of `entry` to the next (its graph,
    key, HLO, memory, cost) is copied from the record of the previous one."""
    previous = entry.last_run
    if previous is None or previous.graph is not graph_info:  # another graph of the same key
        entry.last_run = append(engine, entry, entry.key, graph_info, cache=Cache.HIT, **run)
    else:
        entry.last_run = log(engine, previous.rerun(
            index=engine.log.next_index, donation_note=run.pop("note"), uses=entry.uses,
            cache_entries=len(engine.cache), hit_rate=engine.executables.hit_rate(), **run))


def log(engine, record: StepRecord) -> StepRecord:
    """Count and keep one execution's record; returns it."""
    engine.counters["executions"] += 1
    if record.donated:
        engine.counters["donated_buffers"] += len(record.donated)
        engine.counters["donated_bytes"] += sum(d.nbytes for d in record.donated)
    engine.log.append(record)
    TRACE.seconds = 0.0
    if engine.profiling is not None:
        changes = engine.profiling.profile(record)
        if changes is not None:
            engine.log.revise(record, **changes)
    if config.max_recompiles is not None:
        over = budget.LINES.observe(engine.log.records[-1], config.max_recompiles, config.strict_recompiles)
        if over is not None:
            budget.enforce(over)
    return record
