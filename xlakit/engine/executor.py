"""The lazy executor: live tensors, syncs, donation plan, cache lookup, execution.

One `Engine` per process. Frontend tensors register here; a sync cuts a graph
out of their pending IR, keys it, finds or compiles its executable, runs it,
rebinds the tensors to the results and appends one StepRecord.
"""
from __future__ import annotations

import collections
import contextlib
import gc
import threading
import time
import weakref

import jax
import torch

from ..analysis import executable as analysis
from ..analysis import budget, misses
from ..config import config
from ..core import sharding, sources, transfer
from ..core.ir import Aval, DeviceData, Graph, Node, operand_data, pending_nodes
from ..core.record import Cache, DonatedBuffer, GraphInfo, NodeInfo, ParamInfo, StepLog, StepRecord, Timings, Trigger
from ..core.state import PROCESS
from ..lowerings import eager, to_jax, verdicts
from ..lowerings import numerics as numerics_lowering
from . import cache as cache_mod
from . import check_results, keys, numerics, profiling, stages, tape

_COUNTERS = ("compiles", "cache_hits", "cache_misses", "persistent_cache_hits",
             "executions", "donated_buffers", "donated_bytes", "fallbacks")



class StepFailedError(RuntimeError):
    """Raised when a tensor is read whose computation could not be compiled
    (or whose step failed a check)."""


class StepFailedIndexError(StepFailedError, IndexError):
    """A tensor whose step failed an index check: an IndexError, as eager's."""


class LiveValue:
    """The value behind one or more lazy tensors: device data, or a pending
    node output, or the error that kept it from being computed.

    The registry maps a tensor's C++ TensorImpl to its value and holds a C++
    weak reference to that TensorImpl: Python's garbage collector may clear
    the attributes (and Python weak references) of a tensor subclass object
    that only C++ still holds (a functional wrapper's inner value), so neither
    can tell whether the tensor is alive.
    """

    __slots__ = ("aval", "node", "index", "data", "error", "label", "owner", "previous", "__weakref__")

    def __init__(self, aval: Aval, node: Node | None, index: int, data: DeviceData | None):
        self.aval, self.node, self.index, self.data, self.error = aval, node, index, data, None
        self.label: str | None = None
        # stamped at step markers (tensor.stamp_owners): the user tensor it belongs to, and the
        # buffer that tensor held before this value (given back if the step fails a check)
        self.owner: int | None = None
        self.previous: DeviceData | None = None

    def __repr__(self) -> str:
        state = "data" if self.data is not None else ("pending" if self.node is not None else "failed")
        return f"{self.aval}, {state}"

    def operand(self):
        """What this value contributes to a new node."""
        self.check_usable()
        self.resolve()
        return self.data if self.data is not None else (self.node, self.index)


    def resolve(self) -> None:
        """Swap a pending node output for its device data once it was computed."""
        node = self.node
        if node is not None and node.results is not None and node.results[self.index] is not None:
            self.data, self.node = node.results[self.index], None

    def check_usable(self) -> None:
        if self.error is not None:
            kind = StepFailedIndexError if isinstance(self.error, IndexError) else StepFailedError
            raise kind(f"this tensor's value could not be computed: {self.error}") from self.error

    def fail(self, error: BaseException) -> None:
        self.error, self.node = error, None


class Engine:
    def __init__(self, cache: cache_mod.ExecutableCache, persistent_hits: cache_mod.PersistentHits):
        # a registered tensor's value, and a weak reference that forgets it when the tensor dies
        self.tensors: dict[int, LiveValue] = {}
        self._refs: dict[int, weakref.KeyedRef] = {}
        # called before each step marker (the frontend stamps tensor labels), and after one
        # whose step was dropped (the frontend gives host state back): `hook(stopped_at)`, with
        # None where the device could not run it, else the recording order (Node.seq) of the
        # op whose check failed, from which on eager ran nothing
        self.before_step: list = []
        self.step_dropped: list = []
        self.cache = cache
        self.persistent_hits = persistent_hits
        # the one log of StepRecords (bounded by config.record_limit; xlakit.capture() reads it)
        self.log = StepLog()
        self.counters = collections.Counter({name: 0 for name in _COUNTERS})
        self.trace_seconds = 0.0
        self.lock = threading.RLock()
        # outputs of the newest execution; executions finish in order, so
        # waiting for these waits for all (config.wait_for_execution=False)
        self.in_flight: list = []
        # steps whose in-graph checks are not read yet, and the values waiting on them
        self.ledger = check_results.Ledger()
        # recorded asserts (torch._assert_async) no sync computed yet: nothing reads their
        # outputs, so no cut would take them; the next sync, whatever it computes, does
        self.asserts: list[LiveValue] = []
        # the ops recorded since the last sync, matched against the run that followed it before
        self.tape = tape.Tape()
        # open inside xlakit.profile(): each step's executable runs again under JAX's profiler
        self.profiling: profiling.Profiling | None = None

    # -- tensors ------------------------------------------------------------
    def register(self, tensor: torch.Tensor, value: LiveValue) -> None:
        key = tensor._cdata
        self.tensors[key] = value
        self._refs[key] = weakref.KeyedRef(tensor, self._forget, key)

    def _forget(self, ref: weakref.KeyedRef) -> None:
        """A registered tensor died: its value goes now, its buffer with it (kept until the next
        sync, compiled calls' outputs piled up: they make no sync). Called where the tensor dies,
        in any thread; a tensor registered again has a newer reference, and this one forgets nothing."""
        if self._refs.get(ref.key) is ref:
            del self._refs[ref.key]
            self.tensors.pop(ref.key, None)

    def value_of(self, tensor: torch.Tensor) -> LiveValue:
        return self.tensors[tensor._cdata]

    def read(self, value: LiveValue) -> DeviceData:
        """The device data of a computed value; waits for executions dispatched ahead,
        so a fault shows here, as a clear error."""
        value.resolve()
        if self.in_flight or self.ledger.unread():
            self.wait()
        value.check_usable()
        if value.data is None:
            raise RuntimeError("xlakit internal error: value read before it was computed")
        return value.data

    def check_at_next_sync(self, value: LiveValue) -> None:
        """`value` is an assert's output: the next sync computes it, and its check with it."""
        self.asserts.append(value)

    def count_fallback(self) -> None:
        self.counters["fallbacks"] += 1

    def add_trace_time(self, seconds: float) -> None:
        self.trace_seconds += seconds

    def live_values(self) -> list[LiveValue]:
        """Values of tensors still alive (_forget drops those of the dead). Other threads register
        tensors as they record ops, outside the lock: the dict is read from a snapshot (list() of
        a dict holds the GIL throughout)."""
        return list({id(v): v for v in self.held_values()}.values())

    def held_values(self) -> list[LiveValue]:
        """The value of each live tensor, once per tensor: a clone shares its source's value
        (values are immutable), and each of the two holds the value's buffer."""
        return list(self.tensors.values())

    # -- syncs --------------------------------------------------------------
    def sync(self, tensors=None, *, trigger: Trigger, source: str | None = None):
        """Compute pending values. `tensors=None` is a step marker (all live
        tensors; may donate); a list is a partial sync (never donates).
        Returns (cache entry, graph) of the execution, or None if nothing was pending."""
        with self.lock:
            full = tensors is None
            if full:
                for hook in self.before_step:
                    hook()
            live = self.live_values()
            for t in live:
                t.resolve()
            targets = live if full else tensors
            if not full:
                if self.ledger.failure is not None:  # before the poisoned values it explains
                    self._verify()
                for t in targets:
                    t.check_usable()
                    t.resolve()
            asserts, self.asserts = self.asserts, []
            # asserts first: the graph then traces each before the ops recorded after it (Check.halts)
            targets = [t for t in (*asserts, *targets) if t.node is not None]
            if not targets:
                return None
            run = self.tape.close((trigger, source))
            try:
                with _collector_paused():
                    return self._compute(targets, live, full=full, trigger=trigger, source=source, run=run)
            except StepExecutionError:
                for hook in self.step_dropped if full else ():
                    hook(None)
                raise
            finally:
                run.release()

    def _compute(self, targets, live, *, full: bool, trigger: Trigger, source: str | None,
                 run: tape.Run | None = None):
        """`run`: the ops recorded since the last sync (its first execution may reuse their cut and key)."""
        failure, executed = None, None
        while targets:
            try:
                executed = self._execute(targets, live, full=full, trigger=trigger, source=source, run=run)
                break
            except to_jax.NodeLoweringError as error:
                if error.remember:  # the op is at fault: later calls run eagerly at record time
                    verdicts.remember_failure(error.node.op)
                if not config.strict_lowering:
                    try:
                        self._compute_eagerly(error, live)
                        for t in targets:  # the node has its results now: the rest again
                            t.resolve()
                        targets = [t for t in targets if t.node is not None]
                        run = None
                        continue
                    except Exception as eager_error:  # noqa: BLE001 - the node's dependents keep it
                        error = to_jax.NodeFailedError.of(error.node, eager_error)
                # The tensors that need the failed node keep the error; the
                # rest are computed, so one bad line loses nothing else.
                failure = failure or error
                targets = self._poison(targets, error)
            except StepExecutionError as error:
                raise _dropped(error, targets) from error.__cause__
        if failure is not None:
            raise failure
        return executed

    def _compute_eagerly(self, error: to_jax.NodeLoweringError, live) -> None:
        """Compute one node that could not be lowered with eager torch on CPU
        (its pending operands first, by a partial sync), as the frontend's
        fallback would have; the step then goes on without it."""
        node = error.node
        if error.remember:  # the op runs eagerly from now on
            eager.warn_once(node.op, f"its XLA lowering failed: {error.cause}", node.source)
        pending = {}
        for operand in node.operands:
            if operand_data(operand) is None:
                n, i = operand
                pending[(id(n), i)] = LiveValue(n.avals[i], n, i, None)
        if pending:
            self._compute(list(pending.values()), live, full=False, trigger=Trigger.FALLBACK,
                          source=sources.fallback_line(node.source, node.op))
        if self.ledger.unread():  # its operands' checks first
            self.wait()
        host = []
        for operand in node.operands:
            data = operand_data(operand)
            host.append(transfer.to_host(data.array, data.aval.dtype))
        outputs = eager.run_node(node, host)
        node.results = [None if out is None else DeviceData(transfer.to_device(out), aval)
                        for out, aval in zip(outputs, node.avals)]
        self.counters["fallbacks"] += 1

    def _poison(self, targets, error) -> list:
        """Mark the tensors that depend on the failed node; return the others."""
        bad = error.node
        healthy = []
        for t in targets:
            if _depends_on(t.node, bad):
                t.fail(error)
            else:
                healthy.append(t)
        return healthy

    def _execute(self, targets, live, *, full: bool, trigger: Trigger, source: str | None, run: tape.Run | None):
        """Compute `targets` in one executable: cut -> plan -> key -> executable
        -> run -> StepRecord. Returns (cache entry, graph). A marker whose ops all
        replayed the run it matched reuses that run's cut and key (engine/tape.py)."""
        cut = run.cut(targets) if run is not None and full else None
        replayed = cut is not None
        cut = cut or stages.cut(targets, live, full=full)
        planned = stages.plan(cut, live, full=full, donate=config.donate)
        graph, donors = planned.graph, planned.donors
        placement = sharding.plan(graph, donors)
        flags = compile_flags(graph)
        key = run.key(graph, donors, flags) if replayed and placement is None else None
        key = key or keys.compute_key(graph, donors, flags, placement)
        if run is not None and full and placement is None:
            run.remember(cut, planned, flags, key)
        entry, outcome, lower_s, compile_s, changed, why = self._executable(graph, donors, key, flags, placement)
        inherited = self.ledger.inherited(graph)

        t3 = time.perf_counter()
        arguments = sharding.arguments(graph, placement)
        outputs, checked, watched = _split_checks(entry, self._run(entry, arguments, graph,
                                                                   [graph.params[i] for i in donors]))
        execute_s = time.perf_counter() - t3

        donated = [_donate(i, graph.params[i]) for i in donors]
        self._bind_results(graph, planned.roots, outputs, targets)
        results = [node.results[i] for node, i in planned.roots]
        previous = self.ledger.bound(results, targets)
        graph_info = _any_graph_info(entry, graph, donors, key)
        found = None if watched is None else numerics.read(entry.numerics, watched, graph_info, entry.search, arguments)
        del arguments  # a guarded step's inputs, kept for its search; not in an exception's traceback
        donated, note = _guarded(entry, tuple(donated), planned.note)
        if checked is not None or inherited:
            self.ledger.add(graph, donors, results, previous, entry.checks, checked, graph_info.nodes, inherited)

        self._append_record(entry, key, graph_info, trigger=trigger,
                            cache=outcome, donated=donated, changed=changed, why=why, numerics=found,
                            note=note, source=source, replay=run.replay() if run is not None else None,
                            timings=Timings(trace=self.trace_seconds, lower=lower_s, compile=compile_s,
                                            execute=execute_s, waited=config.wait_for_execution))
        if config.wait_for_execution:
            self._verify(own_step=full)
        else:
            self.ledger.read_oldest(self.live_values)
        if found is not None:
            numerics.report(found)
        return entry, graph

    def _executable(self, graph: Graph, donors, key: keys.Key, flags, placement):
        """The cached executable for `key`, or a new one. On a miss, what differs
        from the closest cached key is explained here, once.
        Returns (entry, outcome, lower seconds, compile seconds, changed, why)."""
        entry = self.cache.get(key.key)
        if entry is not None:
            self.counters["cache_hits"] += 1
            return entry, Cache.HIT, 0.0, 0.0, (), ()
        closest = self._closest(key)
        entry, outcome, lower_s, compile_s = self._load(key, graph, placement) or \
            self._compile(graph, donors, key, flags, placement)
        changed, why = (), ()
        if closest is not None:
            changed = tuple(misses.diff(key.components, closest.key.components))
            why = tuple(misses.explain_miss(key.components, _any_graph_info(entry, graph, donors, key),
                                          closest.key.components, next(iter(closest.graph_infos.values()))))
        return entry, outcome, lower_s, compile_s, changed, why

    def replay(self, entry: cache_mod.Entry, arrays: list, donated: dict[int, DeviceData], *, trigger: Trigger,
               note: str, metadata: str):
        """Run a cached executable on given input arrays (torch.compile's graphs, engine/compiled.py);
        `donated` maps the parameter positions whose buffers it is given to those buffers, which
        are dead after. Appends a StepRecord showing the graph of metadata digest `metadata`;
        returns the output arrays."""
        with self.lock:
            self.counters["cache_hits"] += 1
            t0 = time.perf_counter()
            outputs, checked, watched = _split_checks(entry, self._run(entry, arrays, None, donated.values()))
            execute_s = time.perf_counter() - t0
            graph_info = entry.graph_infos.get(metadata) or next(iter(entry.graph_infos.values()))
            found = None if watched is None else numerics.read(entry.numerics, watched, graph_info, entry.search,
                                                               arrays)
            records, note = _guarded(entry, tuple(_donate(i, data) for i, data in donated.items()), note)
            self._append_replay(entry, graph_info, trigger=trigger, donated=records, note=note, source=None,
                                numerics=found, timings=Timings(trace=self.trace_seconds, execute=execute_s,
                                                                waited=config.wait_for_execution))
            if checked is not None:  # its outputs are new tensors: read its checks before they exist
                error = check_results.Step(checked, entry.checks, graph_info.nodes).read()
                if error is not None:
                    raise error
            if found is not None:
                numerics.report(found)
            return outputs

    def _append_record(self, entry, key: keys.Key, graph_info: GraphInfo, *, trigger: Trigger, cache: Cache,
                       donated: tuple, timings: Timings, note: str, source: str | None,
                       changed: tuple = (), why: tuple = (), replay=None, numerics=None) -> StepRecord:
        """Append the record of an execution; returns it as built (xlakit.profile() may revise the
        one logged: its profile is that run's alone)."""
        return self._log(StepRecord(
            index=self.log.next_index, trigger=trigger, key=key.key, components=dict(key.components),
            metadata_digest=key.metadata_digest, cache=cache, donated=donated,
            num_nodes=len(graph_info.nodes), num_inputs=len(graph_info.params),
            num_outputs=len(graph_info.roots), timings=timings, graph=graph_info, changed=changed,
            why=why, uses=entry.uses, donation_note=note, source=source, hlo=entry.hlo,
            memory=entry.memory, cost=entry.cost, shardings=entry.shardings, collectives=entry.collectives,
            replay=replay, numerics=numerics, cache_entries=len(self.cache), hit_rate=self._hit_rate(),
        ))

    def _append_replay(self, entry, graph_info: GraphInfo, **run) -> None:
        """A replay's record: what stays the same from one replay of `entry` to the next (its graph,
        key, HLO, memory, cost) is copied from the record of the previous one."""
        previous = entry.replayed
        if previous is None or previous.graph is not graph_info:  # another graph of the same key
            entry.replayed = self._append_record(entry, entry.key, graph_info, cache=Cache.HIT, **run)
        else:
            entry.replayed = self._log(previous.rerun(
                index=self.log.next_index, donation_note=run.pop("note"), uses=entry.uses,
                cache_entries=len(self.cache), hit_rate=self._hit_rate(), **run))

    def _hit_rate(self) -> float:
        """In-memory cache hits / lookups so far."""
        hits = self.counters["cache_hits"]
        return hits / max(1, hits + self.counters["cache_misses"])

    def _log(self, record: StepRecord) -> StepRecord:
        """Count and keep one execution's record; returns it."""
        self.counters["executions"] += 1
        if record.donated:
            self.counters["donated_buffers"] += len(record.donated)
            self.counters["donated_bytes"] += sum(d.nbytes for d in record.donated)
        self.log.append(record)
        self.trace_seconds = 0.0
        if self.profiling is not None:
            changes = self.profiling.profile(record)
            if changes is not None:
                self.log.revise(record, **changes)
        if config.max_recompiles is not None:
            over = budget.LINES.observe(self.log.records[-1], config.max_recompiles, config.strict_recompiles)
            if over is not None:
                budget.enforce(over)
        return record

    def _load(self, key: keys.Key, graph: Graph, placement):
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
        self._keep(entry, graph, placement)
        return entry, Cache.PERSISTENT_HIT, 0.0, time.perf_counter() - t0

    def _keep(self, entry: cache_mod.Entry, graph: Graph, placement) -> None:
        _warn_if_too_big(entry.memory, graph)
        if entry.numerics is not None and entry.numerics.guard:
            entry.search = numerics.Search(graph, placement)
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
        compiled = lowered.compile()
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
        self._keep(entry, graph, placement)
        if outcome is Cache.MISS:  # one JAX loaded from its cache re-serializes without its kernels (XLA CPU)
            cache_mod.store(entry)
        return entry, outcome, t1 - t0, t2 - t1

    def _bind_results(self, graph: Graph, roots, outputs, targets) -> None:
        labels = {(id(t.node), t.index): t.label for t in targets if t.label}
        for (node, index), array, aval in zip(roots, outputs, graph.root_avals):
            if node.results is None:
                node.results = [None] * len(node.avals)
            node.results[index] = DeviceData(array, aval, label=labels.get((id(node), index)))
        for t in targets:
            t.resolve()

    def _closest(self, key: keys.Key) -> cache_mod.Entry | None:
        """The cached executable whose key differs in the fewest components
        (among those that ran: a step that failed to execute has no graph view);
        of equals the most recently used, likely the step this one follows."""
        entries = [e for e in reversed(self.cache.entries()) if e.graph_infos]
        return min(entries, key=lambda e: len(misses.diff(key.components, e.key.components)), default=None)

    def _run(self, entry, arrays: list, graph: Graph | None, donors):
        """Run `entry` on `arrays`; `donors`: the DeviceData whose buffers it is given. JAX deletes
        those even when the run fails; an executable's first run, the one a new batch size or a
        grown model makes (where memory most often runs out), keeps host copies of them to put back
        (its cost, once per executable: one copy of the donated bytes to host memory)."""
        kept = [(data, transfer.HostCopy(data.array)) for data in donors] if entry.uses == 0 else ()
        entry.uses += 1
        if self.profiling is not None:  # before the run: it frees the buffers it donates
            self.profiling.keep_inputs(entry, arrays)
        try:
            outputs = entry.compiled(*arrays)
            self.in_flight = outputs
            if config.wait_for_execution:
                self._block(graph)
            return outputs
        except Exception as e:  # noqa: BLE001 - a fault at dispatch, before any output exists, or in the run
            for data, copy in kept:
                if data.array.is_deleted():
                    data.array = copy.to_device()
            if isinstance(e, StepExecutionError):
                raise
            raise _execution_error(e, graph) from e

    def wait(self) -> None:
        """Block until every dispatched execution has finished; read the checks
        of those not read yet (raises the first failed one's exception)."""
        self._block(None)
        self._verify()

    def _block(self, graph: Graph | None) -> None:
        outputs, self.in_flight = self.in_flight, []
        try:
            jax.block_until_ready(outputs)
        except Exception as e:  # noqa: BLE001 - re-raised with what the step asked for
            raise _execution_error(e, graph) from e

    def _verify(self, own_step: bool = False) -> None:
        """Read the unread checks; `own_step`: right after the step marker's own execution, so
        that a failure is its step's (the host state its recording changed is given back)."""
        if self.ledger.unread():
            error = self.ledger.verify(self.live_values)
            if error is not None:
                for hook in self.step_dropped if own_step else ():
                    hook(self.ledger.stopped_at)
                raise error

    # -- counters -----------------------------------------------------------
    def metrics(self) -> dict[str, int]:
        return dict(self.counters)

    def reset_metrics(self) -> None:
        self.zero_counters()
        self.log.clear()

    def zero_counters(self) -> None:
        for name in self.counters:
            self.counters[name] = 0

    # -- profiling ----------------------------------------------------------
    @contextlib.contextmanager
    def profiled(self, runs: int = 1):
        """`with engine.profiled() as steps:` -- the records of this thread's executions inside, each
        with `.profile`: its executable run `runs` more times under JAX's profiler (engine/profiling.py)."""
        session = profiling.Profiling(runs)
        with self.lock:
            if self.profiling is not None:
                raise RuntimeError("xlakit.profile(): already profiling; profile blocks do not nest")
            self.profiling = session
        try:
            with self.log.capture() as steps:
                yield steps
        finally:
            with self.lock:
                self.profiling = None


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic collector off while a sync runs. A sync builds the graph, its
    key and, on a miss, JAX's trace of it: tens of thousands of objects that all
    live until it ends, so each collection they trigger walks the whole heap (~200
    ms with torch and transformers loaded) and frees nothing. Measured: lowering a
    1479-node Llama step 0.58 -> 0.40 s. Reference counting still frees garbage."""
    if not gc.isenabled():  # the user's choice, or a sync inside a sync
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class StepExecutionError(RuntimeError):
    """The device could not run a compiled step (out of memory, runtime fault)."""


def _execution_error(error: BaseException, graph: Graph | None) -> StepExecutionError:
    asked = ""
    if graph is not None:
        asked = (f" It reads {sum(a.nbytes for a in graph.param_avals):,} bytes of inputs and "
                 f"writes {sum(a.nbytes for a in graph.root_avals):,} bytes of outputs.")
    return StepExecutionError(f"xlakit: the device could not run this step: {str(error).rstrip('.')}.{asked} "
                              "Tensors it was updating in place keep their values from before it (parameters, "
                              "optimizer state and its CPU step count); the values it would have made keep this "
                              "error. Other host state your code changed while recording it stays changed.")


def _dropped(error: StepExecutionError, targets) -> StepExecutionError:
    """A step the device could not run is dropped whole, as eager stops at the allocation that
    failed before any update: a tensor the user made on the device (tensor.own: parameters,
    optimizer state, what `.to` moved) gets back the buffer it held before the step; the values
    the step made anew keep the error. A buffer the device took anyway (a runtime fault after the
    executable started, which donated it) cannot be given back: the error names those tensors."""
    lost = []
    for t in targets:
        previous, t.previous = t.previous, None
        if previous is not None and previous.array is not None and not previous.array.is_deleted():
            t.data, t.node = previous, None
        else:
            if previous is not None:
                lost.append(t.label or previous.label or str(t.aval))
            t.fail(error)
    if not lost:
        return error
    return StepExecutionError(f"{error} The device took the buffers of {len(lost)} tensor(s) it was updating in "
                              f"place, which lost their values too: {', '.join(sorted(set(lost)))}.")


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


def _donate(index: int, data: DeviceData) -> DonatedBuffer:
    """Mark parameter `index`'s buffer as given to the executable (dead now); what the record says of it."""
    data.donated, data.array = True, None
    return DonatedBuffer(index, data.label, data.aval.shape, str(data.aval.dtype).removeprefix("torch."),
                         data.aval.nbytes)


def _guarded(entry, donated: tuple, note: str) -> tuple[tuple, str]:
    """What a step donated, and its note: a guarded executable (config.check_nans) donates nothing,
    and the buffers it would have donated are freed once its outputs are known finite."""
    if not donated or entry.numerics is None or not entry.numerics.guard:
        return donated, note
    freed = (f"config.check_nans keeps a step's inputs until its outputs are known finite: the {len(donated)} "
             f"buffer(s) it would donate ({sum(d.nbytes for d in donated)} bytes) were freed after it instead")
    return (), f"{note}; {freed}" if note else freed


def _split_checks(entry, outputs):
    """(the roots' arrays, the checks' array or None, the numerics vector or None):
    an executable with checks returns their flags after its roots, then its numerics."""
    watched = None
    if entry.numerics is not None:
        outputs, watched = outputs[:-1], outputs[-1]
    if not entry.checks.checks:
        return outputs, None, watched
    return outputs[:-1], outputs[-1], watched


def compile_flags(graph: Graph) -> dict[str, str]:
    """The key's compile flags for `graph` under the current config (checks, NaN origin, ranges)."""
    return keys.compile_flags(to_jax.matmul_precision(), to_jax.LOWERING_VERSION, config.checks,
                              nans=numerics_lowering.recording_ranks(graph) if config.check_nans else None,
                              ranges=config.record_ranges)


def _depends_on(node: Node, target: Node) -> bool:
    """Whether computing `node` runs `target` (outputs already computed stop the walk)."""
    return any(n is target for n in pending_nodes([node]))


def _any_graph_info(entry, graph: Graph, donors, key: keys.Key) -> GraphInfo:
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


_CURRENT: Engine | None = None


def current() -> Engine:
    """The process's engine, created on first use; what it keeps is registered in core/state.py's
    PROCESS (its live tensors are not: xlakit.reset() keeps them)."""
    global _CURRENT
    if _CURRENT is None:
        engine = Engine(cache_mod.ExecutableCache(config.cache_size), cache_mod.PersistentHits())
        PROCESS.keep("engine: executables", engine.cache, bound="config.cache_size, least recently used go first",
                     why="a step whose key was seen runs its executable: no lowering, no compile")
        PROCESS.keep("engine: step records", engine.log, bound="config.record_limit, oldest go first",
                     why="xlakit.steps(), capture() and the views read them", clear=engine.log.restart,
                     size=lambda: len(engine.log.records))
        PROCESS.keep("engine: counters", engine.counters, bound=len(_COUNTERS), why="xlakit.metrics()",
                     clear=engine.zero_counters, size=lambda: sum(engine.counters.values()))
        PROCESS.keep("engine: replay tape", engine.tape, bound=f"{tape.RUNS} runs of {tape.LIMIT} ops",
                     why="a run of ops that matches the one before it reuses its recording, cut and key",
                     clear=engine.tape.clear, size=engine.tape.size)
        PROCESS.keep("engine: unread checks", engine.ledger, bound=f"{check_results.UNREAD_LIMIT} steps",
                     why="a step's in-graph checks are read at the next read, so tracing overlaps execution",
                     clear=engine.wait, size=lambda: len(engine.ledger.steps))
        _CURRENT = engine
    return _CURRENT
