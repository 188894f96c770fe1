"""The lazy executor: live tensors, syncs, execution.

One `Engine` per process; its public methods are how the rest of xlakit reaches it. Frontend
tensors register here; a sync cuts a graph out of their pending IR (stages.py), keys it
(keys.py), finds or compiles its executable (executables.py), runs it, rebinds the tensors to
the results and appends one StepRecord (records.py).
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

from ..config import config
from ..core import sharding, sources, transfer
from ..core.ir import DeviceData, Graph, Instance, Node, operand_data, pending_nodes
from ..core.record import StepLog, Timings, Trigger
from ..core.state import PROCESS
from ..lowerings import eager, to_jax, verdicts
from ..lowerings import numerics as numerics_lowering
from . import cache as cache_mod
from . import check_results, executables, keys, numerics, profiling, records, stages, tape
from .values import LiveValue, StepExecutionError, dropped, execution_error

_COUNTERS = ("compiles", "cache_hits", "cache_misses", "persistent_cache_hits",
             "executions", "donated_buffers", "donated_bytes", "fallbacks", "host_reads")



_KEPT = object()  # Engine.register's layout when a tensor keeps its own


class _Registration(weakref.ref):
    """A registered tensor's weak reference: its key in the registry (its TensorImpl's address),
    and the layout it was made with (tape.plain_layout), which the replay's guard reads. Slots
    set after it is made: no Python __new__ or __init__ (weakref.KeyedRef's cost ~0.5 µs more),
    and no other dict or object per tensor."""

    __slots__ = ("key", "layout")


class Engine:
    def __init__(self, cache: cache_mod.ExecutableCache, persistent_hits: cache_mod.PersistentHits):
        # a registered tensor's value, and a weak reference that forgets it when the tensor dies
        self._tensors: dict[int, LiveValue] = {}
        self._refs: dict[int, _Registration] = {}
        self._forget = self._forget  # bound once: every reference's callback
        # called before each step marker (the frontend stamps tensor labels), and after one
        # whose step was dropped (the frontend gives host state back): `hook(stopped_at)`, with
        # None where the device could not run it, else the recording order (Node.seq) of the
        # op whose check failed, from which on eager ran nothing
        self.before_step: list = []
        self.step_dropped: list = []
        self.cache = cache
        # the one log of StepRecords (bounded by config.record_limit; xlakit.capture() reads it)
        self.log = StepLog()
        self.counters = collections.Counter({name: 0 for name in _COUNTERS})
        self.executables = executables.Executables(cache, persistent_hits, self.counters)
        self._lock = threading.RLock()
        # outputs of the newest execution; executions finish in order, so
        # waiting for these waits for all (config.wait_for_execution=False)
        self.in_flight: list = []
        # steps whose in-graph checks are not read yet, and the values waiting on them
        self._ledger = check_results.Ledger()
        # recorded asserts (torch._assert_async) no sync computed yet: nothing reads their
        # outputs, so no cut would take them; the next sync, whatever it computes, does
        self._asserts: list[LiveValue] = []
        # the ops recorded since the last sync, matched against the run that followed it before
        self._tape = tape.Tape(self._tensors, self._refs)
        # replay(op, args, kwargs, check, skip): the recording the run this one follows had
        # here and this op's node, if the op matches it (Tape.replay); bound once, a call less an op
        self.replay = self._tape.replay
        # open inside xlakit.profile(): each step's executable runs again under JAX's profiler
        self.profiling: profiling.Profiling | None = None

    # -- tensors ------------------------------------------------------------
    def register(self, tensor: torch.Tensor, value: LiveValue, layout=_KEPT) -> None:
        """`tensor` holds `value` now; a new tensor also gives the layout it was made with
        (tape.plain_layout), which a tensor given a new value keeps."""
        key = tensor._cdata
        self._tensors[key] = value
        ref = self._refs.get(key)
        if ref is not None:
            if ref() is tensor:  # registered again: its reference stays
                if layout is not _KEPT:
                    ref.layout = layout
                return
            ref.key = None  # a dead tensor's, at the same address: its callback forgets nothing
        ref = self._refs[key] = _Registration(tensor, self._forget)
        ref.key = key
        ref.layout = layout  # _KEPT, for a tensor first registered without one, equals no recorded layout

    def _forget(self, ref: _Registration) -> None:
        """A registered tensor died: its value goes now, its buffer with it (kept until the next
        sync, compiled calls' outputs piled up: they make no sync). Called where the tensor dies,
        in any thread."""
        key = ref.key
        if key is not None and self._refs.get(key) is ref:
            del self._refs[key]
            self._tensors.pop(key, None)

    def value_of(self, tensor: torch.Tensor) -> LiveValue:
        return self._tensors[tensor._cdata]

    def read(self, value: LiveValue) -> DeviceData:
        """The device data of a computed value; waits for executions dispatched ahead,
        so a fault shows here, as a clear error."""
        value.resolve()
        if self.in_flight or self._ledger.unread():
            self.wait()
        value.check_usable()
        if value.data is None:
            raise RuntimeError("xlakit internal error: value read before it was computed")
        return value.data

    def check_at_next_sync(self, value: LiveValue) -> None:
        """`value` is an assert's output: the next sync computes it, and its check with it."""
        self._asserts.append(value)

    def count_fallback(self) -> None:
        self.counters["fallbacks"] += 1

    def count_host_read(self) -> None:
        """A Python read answered on the host, with no execution (front/host_reads.py)."""
        self.counters["host_reads"] += 1

    def has_live_tensors(self) -> bool:
        return bool(self._tensors)

    def has_pending_asserts(self) -> bool:
        """Whether an assert recorded since the last sync waits for one (check_at_next_sync)."""
        return bool(self._asserts)

    # -- user tensors' values, given back after a failed step (check_results.Ledger) --------
    def note_owned(self, owner: int, data: DeviceData) -> None:
        """`data` is the buffer of user tensor `owner`'s last computed value."""
        self._ledger.latest[owner] = data

    def owned(self, owner: int) -> DeviceData | None:
        """The buffer of user tensor `owner`'s last computed value, while something holds it."""
        return self._ledger.latest.get(owner)

    # -- the recording: ops matched against the run that followed the same sync before (tape.py) --
    def recorded(self, node: Node, **fresh) -> None:
        """`node` was recorded fresh (`fresh`: what the next run matches)."""
        self._tape.add(node, **fresh)

    def recorded_graph(self, graph: Graph, operands: list, instance: Instance) -> None:
        """A compiled graph was recorded again as `instance`: a repeated step reuses its cut and key."""
        self._tape.add_graph(graph, operands, instance)

    def forget_recordings(self) -> None:
        self._tape.clear()

    def live_values(self) -> list[LiveValue]:
        """Values of tensors still alive (_forget drops those of the dead). Other threads register
        tensors as they record ops, outside the lock: the dict is read from a snapshot (list() of
        a dict holds the GIL throughout)."""
        return list({id(v): v for v in self.held_values()}.values())

    def held_values(self) -> list[LiveValue]:
        """The value of each live tensor, once per tensor: a clone shares its source's value
        (values are immutable), and each of the two holds the value's buffer."""
        return list(self._tensors.values())

    # -- syncs --------------------------------------------------------------
    def sync(self, tensors=None, *, trigger: Trigger, source: str | None = None):
        """Compute pending values. `tensors=None` is a step marker (all live
        tensors; may donate); a list is a partial sync (never donates).
        Returns (cache entry, graph) of the execution, or None if nothing was pending."""
        sources.release_frame()  # first: what only a returned function's frame held dies before the live are read
        with self._lock:
            full = tensors is None
            if full:
                for hook in self.before_step:
                    hook()
            live = self.live_values()
            for t in live:
                t.resolve()
            targets = live if full else tensors
            if not full:
                if self._ledger.failure is not None:  # before the poisoned values it explains
                    self._verify()
                for t in targets:
                    t.check_usable()
                    t.resolve()
            asserts, self._asserts = self._asserts, []
            # asserts first: the graph then traces each before the ops recorded after it (Check.halts)
            targets = [t for t in (*asserts, *targets) if t.node is not None]
            if not targets:
                if full:  # the step's ops all died: its run ends here, as a computing marker's does, and
                    # what it held goes (kept open, it grew by every step and held their nodes and buffers)
                    self._tape.close((trigger, source), full=True).release()
                return None
            run = self._tape.close((trigger, source), full=full)
            try:
                with _collector_paused():
                    return self._compute(targets, live, full=full, trigger=trigger, source=source, run=run)
            except StepExecutionError:
                for hook in self.step_dropped if full else ():
                    hook(None)
                raise
            finally:
                run.release()

    def mark_step(self, *, trigger: Trigger, source: str | None = None) -> None:
        """A step marker whose caller keeps nothing of it: the collector stays off until the step's
        graph, which sync returns, is dropped here, so its nodes die by reference counting and no
        collection walks them (_collector_paused)."""
        with _collector_paused():
            self.sync(trigger=trigger, source=source)

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
                raise dropped(error, targets) from error.__cause__
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
        if self._ledger.unread():  # its operands' checks first
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
        placement = sharding.plan(graph, donors, cut.marks)
        flags = compile_flags(graph)
        key = run.key(graph, donors, flags) if replayed and placement is None else None
        key = key or keys.compute_key(graph, donors, flags, placement)
        if run is not None and full and placement is None:
            run.remember(cut, planned, flags, key)
        lookup = self.executables.lookup(graph, donors, key, flags, placement)
        entry = lookup.entry
        inherited = self._ledger.inherited(graph)

        t3 = time.perf_counter()
        arguments = sharding.arguments(graph, placement)
        outputs, checked, watched = _split_checks(entry, self._run(entry, arguments, graph,
                                                                   [graph.params[i] for i in donors]))
        execute_s = time.perf_counter() - t3
        graph_info = executables.graph_info(entry, graph, donors, key)
        nans = None
        if watched is not None:  # a guarded step whose outputs are not finite is searched: its outputs then
            outputs, checked, nans = numerics.read(entry, outputs, checked, watched, arguments, graph_info)
        del arguments  # a guarded step's inputs, kept for its search; not in an exception's traceback

        donated = tuple(records.donate(i, graph.params[i]) for i in donors)
        self._bind_results(planned.roots, outputs, targets)
        results = [node.results[i] for node, i in planned.roots]
        previous = self._ledger.bound(results, targets)
        if checked is not None or inherited:
            self._ledger.add(graph, donors, results, previous, entry.checks, checked, graph_info.nodes, inherited)

        records.append(self, entry, key, graph_info, trigger=trigger,
                       cache=lookup.outcome, donated=donated, changed=lookup.changed, why=lookup.why,
                       numerics=nans,
                       note=planned.note, source=source, replay=run.replay() if run is not None else None,
                       timings=Timings(trace=records.TRACE.seconds, lower=lookup.lower_s, compile=lookup.compile_s,
                                       execute=execute_s, waited=config.wait_for_execution))
        if config.wait_for_execution:
            self._verify(own_step=full)
        else:
            self._ledger.read_oldest(self.live_values)
        if nans is not None:
            numerics.report(nans, graph_info)
        return entry, graph

    def executable_for(self, graph: Graph, donors: tuple[int, ...], placement) -> cache_mod.Entry:
        """The executable of `graph` with `donors` donated, found or compiled (a compiled function's
        donating twin: engine/compiled.py)."""
        with self._lock:
            flags = compile_flags(graph)
            key = keys.compute_key(graph, donors, flags, placement)
            return self.executables.lookup(graph, donors, key, flags, placement).entry

    def run_compiled(self, entry: cache_mod.Entry, arrays: list, donated: dict[int, DeviceData], *, trigger: Trigger,
                     note: str, metadata: str):
        """Run a cached executable on given input arrays (torch.compile's graphs, engine/compiled.py);
        `donated` maps the parameter positions whose buffers it is given to those buffers, which
        are dead after. Appends a StepRecord showing the graph of metadata digest `metadata`;
        returns the output arrays."""
        with self._lock:
            self.counters["cache_hits"] += 1
            t0 = time.perf_counter()
            outputs, checked, watched = _split_checks(entry, self._run(entry, arrays, None, donated.values()))
            execute_s = time.perf_counter() - t0
            graph_info = entry.graph_infos.get(metadata) or next(iter(entry.graph_infos.values()))
            found = None
            if watched is not None:  # a guarded run whose outputs are not finite is searched: its outputs then
                outputs, checked, found = numerics.read(entry, outputs, checked, watched, arrays, graph_info)
            given = tuple(records.donate(i, data) for i, data in donated.items())
            records.append_compiled_run(self, entry, graph_info, trigger=trigger, donated=given, note=note,
                                        source=None, numerics=found,
                                        timings=Timings(trace=records.TRACE.seconds, execute=execute_s,
                                                        waited=config.wait_for_execution))
            if checked is not None:  # its outputs are new tensors: read its checks before they exist
                error = check_results.Step(checked, entry.checks, graph_info.nodes).read()
                if error is not None:
                    raise error
            if found is not None:
                numerics.report(found, graph_info)
            return outputs

    def _bind_results(self, roots, outputs, targets) -> None:
        labels = {(id(t.node), t.index): t.label for t in targets if t.label}
        for (node, index), array in zip(roots, outputs):
            if node.results is None:
                node.results = [None] * len(node.avals)
            node.results[index] = DeviceData(array, node.avals[index], label=labels.get((id(node), index)))
        for t in targets:
            t.resolve()

    def _run(self, entry, arrays: list, graph: Graph | None, donors):
        """Run `entry` on `arrays`; `donors`: the DeviceData whose buffers it is given. JAX deletes
        those even when the run fails; until a run of an executable succeeded (its first, the one a
        new batch size or a grown model makes, where memory most often runs out, and each after one
        that failed: the same step again fails again), its run keeps host copies of them to put back
        (its cost, once per executable: one copy of the donated bytes to host memory)."""
        kept = [(data, transfer.HostCopy(data.array)) for data in donors] if entry.uses == 0 else ()
        if self.profiling is not None:  # before the run: it frees the buffers it donates
            self.profiling.keep_inputs(entry, arrays)
        try:
            outputs = entry.compiled(*arrays)
            self.in_flight = outputs
            if config.wait_for_execution:
                self._block(graph)
            entry.uses += 1
            return outputs
        except Exception as e:  # noqa: BLE001 - a fault at dispatch, before any output exists, or in the run
            for data, copy in kept:
                if data.array.is_deleted():
                    data.array = copy.to_device()
            if isinstance(e, StepExecutionError):
                raise
            raise execution_error(e, graph) from e

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
            raise execution_error(e, graph) from e

    def _verify(self, own_step: bool = False) -> None:
        """Read the unread checks; `own_step`: right after the step marker's own execution, so
        that a failure is its step's (the host state its recording changed is given back)."""
        if self._ledger.unread():
            error = self._ledger.verify(self.live_values)
            if error is not None:
                for hook in self.step_dropped if own_step else ():
                    hook(self._ledger.stopped_at)
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
        with self._lock:
            if self.profiling is not None:
                raise RuntimeError("xlakit.profile(): already profiling; profile blocks do not nest")
            self.profiling = session
        try:
            with self.log.capture() as steps:
                yield steps
        finally:
            with self._lock:
                self.profiling = None


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic collector off while a sync runs. A sync builds the graph, its
    key and, on a miss, JAX's trace of it: tens of thousands of objects that all
    live until it ends, so each collection they trigger walks the whole heap (~200
    ms with torch and transformers loaded) and frees nothing. Measured: lowering a
    1479-node Llama step 0.58 -> 0.40 s. Reference counting still frees garbage.
    A step marker whose caller keeps nothing pauses it around the call too (Engine.mark_step):
    the step's nodes then die by reference counting before the collector runs again, and the
    first collection after it walks ~4,300 fewer objects (GPT-2: 0.73 -> 0.27 ms of
    collections a step)."""
    if not gc.isenabled():  # the user's choice, or a sync inside a sync
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


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
        PROCESS.keep("engine: replay tape", engine._tape, bound=f"{tape.RUNS} runs of {tape.LIMIT} ops",
                     why="a run of ops that matches the one before it reuses its recording, cut and key",
                     clear=engine._tape.clear, size=engine._tape.size)
        PROCESS.keep("engine: unread checks", engine._ledger, bound=f"{check_results.UNREAD_LIMIT} steps",
                     why="a step's in-graph checks are read at the next read, so tracing overlaps execution",
                     clear=engine.wait, size=lambda: len(engine._ledger.steps))
        _CURRENT = engine
    return _CURRENT
