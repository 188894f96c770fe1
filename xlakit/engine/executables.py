"""Executable lookup: a step's key to its executable, from memory, from disk, or compiled.

`Executables.lookup` is the one entry: the in-memory cache first (a hit), then an entry an
earlier process stored (a persistent hit: no lowering, no compile), else lowering and XLA's
compile (whose own persistent cache may still hit). On a miss, what differs from the closest
cached key is explained once, from the graphs both were built from.
"""
from __future__ import annotations

import dataclasses
import time

import jax

from ..analysis import executable as analysis
from ..analysis import misses
from ..config import config
from ..core import sharding, sources
from ..core.ir import Graph
from ..core.record import Cache, GraphInfo, NodeInfo, ParamInfo
from ..lowerings import numerics as numerics_lowering
from ..lowerings import to_jax
from . import cache as cache_mod
from . import keys, numerics


@dataclasses.dataclass(frozen=True)
class Lookup:
    """What `lookup` found: the entry, how (hit, persistent hit, miss), the seconds lowering and
    compiling took, and on a miss the key components that differ from the closest entry's, why."""
    entry: cache_mod.Entry
    outcome: Cache
    lower_s: float
    compile_s: float
    changed: tuple = ()
    why: tuple = ()


class Executables:
    def __init__(self, cache: cache_mod.ExecutableCache, persistent_hits: cache_mod.PersistentHits, counters):
        self.cache, self.persistent_hits, self.counters = cache, persistent_hits, counters

    def lookup(self, graph: Graph, donors, key: keys.Key, flags, placement) -> Lookup:
        """The cached executable for `key`, or a new one."""
        entry = self.cache.get(key.key)
        if entry is not None:
            self.counters["cache_hits"] += 1
            return Lookup(entry, Cache.HIT, 0.0, 0.0)
        closest = self._closest(key)
        entry, outcome, lower_s, compile_s = self._load(key, graph, donors, flags, placement) or \
            self._compile(graph, donors, key, flags, placement)
        if closest is None:
            return Lookup(entry, outcome, lower_s, compile_s)
        changed = tuple(misses.diff(key.components, closest.key.components))
        why = tuple(misses.explain_miss(key.components, graph_info(entry, graph, donors, key),
                                        closest.key.components, next(iter(closest.graph_infos.values())),
                                        settings=(key.settings, closest.key.settings)))
        return Lookup(entry, outcome, lower_s, compile_s, changed, why)

    def hit_rate(self) -> float:
        """In-memory cache hits / lookups so far."""
        hits = self.counters["cache_hits"]
        return hits / max(1, hits + self.counters["cache_misses"])

    def _load(self, key: keys.Key, graph: Graph, donors, flags, placement):
        """The executable an earlier process stored for this key: no lowering, no compile.
        Its load time is reported as the compile time."""
        if placement is not None:
            return None
        t0 = time.perf_counter()
        entry = cache_mod.load(key.key)
        if entry is None:
            return None
        self.counters["cache_misses"] += 1
        self.counters["persistent_cache_hits"] += 1
        self._keep(entry, graph, donors, flags, placement)
        return entry, Cache.PERSISTENT_HIT, 0.0, time.perf_counter() - t0

    def _keep(self, entry: cache_mod.Entry, graph: Graph, donors, flags, placement) -> None:
        _warn_if_too_big(entry.memory, graph)
        if entry.numerics is not None and entry.numerics.guard:
            entry.search = numerics.Search(graph, donors, placement, check=flags["checks"] == "on")
        self.cache.capacity = config.cache_size
        self.cache.put(entry.key.key, entry)

    def _compile(self, graph: Graph, donors, key: keys.Key, flags, placement):
        t0 = time.perf_counter()
        # check_nans alone: a guard on the outputs, searched node by node only when they are not finite
        guard = "nans" in flags and "ranges" not in flags
        lowered, step_checks, layout = to_jax.lower(
            graph, donors, flags["matmul_precision"], placement, check=flags["checks"] == "on",
            nans=numerics_lowering.recording_ranks(graph) if "nans" in flags and not guard else None,
            ranges="ranges" in flags, guard=guard)
        t1 = time.perf_counter()
        hits_before = self.persistent_hits.count
        compiled = to_jax.compile_lowered(lowered)
        t2 = time.perf_counter()
        outcome = Cache.PERSISTENT_HIT if self.persistent_hits.count > hits_before else Cache.MISS
        self.counters["cache_misses"] += 1
        self.counters["persistent_cache_hits" if outcome is Cache.PERSISTENT_HIT else "compiles"] += 1
        hlo = compiled.as_text() or ""
        devices = jax.devices()[:1] if placement is None else placement.devices()
        entry = cache_mod.Entry(compiled=compiled, key=key, hlo=hlo, checks=step_checks, numerics=layout,
                                memory=analysis.memory(compiled, devices), cost=analysis.cost(compiled),
                                collectives=analysis.collectives(hlo),
                                shardings=None if placement is None else sharding.describe(placement, compiled, graph))
        self._keep(entry, graph, donors, flags, placement)
        if outcome is Cache.MISS:  # one JAX loaded from its cache re-serializes without its kernels (XLA CPU)
            cache_mod.store(entry)
        return entry, outcome, t1 - t0, t2 - t1

    def _closest(self, key: keys.Key) -> cache_mod.Entry | None:
        """The cached executable whose key differs in the fewest components
        (among those that ran: a step that failed to execute has no graph view);
        of equals the most recently used, likely the step this one follows."""
        entries = [e for e in reversed(self.cache.entries()) if e.graph_infos]
        return min(entries, key=lambda e: len(misses.diff(key.components, e.key.components)), default=None)


def _warn_if_too_big(memory, graph: Graph) -> None:
    """Say before the first run that a step cannot fit, with what it holds (an OOM
    on the device names no tensors)."""
    if memory is None or not memory.over_limit:
        return
    largest = sorted(graph.params, key=lambda p: p.aval.nbytes, reverse=True)[:3]
    sources.warn(
        f"xlakit: this step needs {memory.peak:,} bytes per device at its peak, more than the device's "
        f"{memory.device_limit:,} (arguments {memory.arguments:,}, outputs {memory.outputs:,}, "
        f"temporaries {memory.temporaries:,}); largest inputs: "
        + ", ".join(f"{p.label or 'unlabelled'} {p.aval}" for p in largest)
        + ". It will likely run out of memory: use smaller batches, donation, or shard it.", sources.capture())


def graph_info(entry, graph: Graph, donors, key: keys.Key) -> GraphInfo:
    """The entry's GraphInfo for this metadata; built once per (key, metadata)."""
    info = entry.graph_infos.get(key.metadata_digest)
    if info is None:
        info = entry.graph_infos[key.metadata_digest] = _graph_info(graph, donors, entry.shardings,
                                                                    to_jax.hlo_ops(entry.hlo))
    return info


def _arguments(template) -> str:
    """A node's arguments as text, operands as $0, $1, ..."""
    args, kwargs = template
    return ", ".join([*map(repr, args), *(f"{name}={value!r}" for name, value in kwargs)])


def _graph_info(graph: Graph, donors, shardings, hlo_ops: dict[int, tuple[str, ...]]) -> GraphInfo:
    donor_set = set(donors)
    placed = ["one device"] * len(graph.params) if shardings is None else [t.spec for t in shardings.inputs]
    return GraphInfo(
        nodes=tuple(
            NodeInfo(op=str(n.op), operands=w, avals=tuple(map(str, n.avals)), source=n.source,
                     args=_arguments(n.template), module=n.source.module if n.source else "",
                     hlo_ops=hlo_ops.get(i, ()))
            for i, (n, w) in enumerate(zip(graph.nodes, graph.wiring))
        ),
        params=tuple(ParamInfo(aval=str(p.aval), label=p.label, donated=i in donor_set, sharding=placed[i])
                     for i, p in enumerate(graph.params)),
        roots=tuple(graph.roots),
    )
