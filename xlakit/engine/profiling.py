"""A step's executable run again under JAX's profiler, on copies of its inputs.

Inside `xlakit.profile()` the engine hands each step's inputs here before it runs
them: the donated ones are copied then (the step's run frees them), the others are
kept as they are (a run never changes them). Once the step is recorded, the same
cached executable runs `runs` more times under `jax.profiler.trace`, and the trace's
events that name an HLO instruction of its module (`hlo_op`, `hlo_module`: XLA:CPU's
thunks, a GPU's or TPU's ops) are read back with `jax.profiler.ProfileData` and
joined to the step's nodes (analysis/profile.py). The step itself, its key, its
record's timings and the cache's counters are left as they were.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import statistics
import tempfile
import threading
import time
from collections import defaultdict

import jax
import jax.numpy as jnp

from ..analysis import profile as join
from ..core import hlo, sources
from ..core.record import StepRecord


class ProfilingWarning(UserWarning):
    """A step inside xlakit.profile() could not be profiled (it ran as without profiling)."""


class Profiling:
    """Open while `xlakit.profile()` is: what the next step runs, kept to run it again."""

    def __init__(self, runs: int):
        if runs < 1:
            raise ValueError(f"xlakit.profile(runs={runs}): profile at least one run")
        self.runs = runs
        self.thread = threading.get_ident()  # the thread whose steps it profiles, as capture() keeps them
        self._kept = None              # (entry, inputs, which are donated) of the step now running
        self._copy_seconds = 0.0

    def keep_inputs(self, entry, arrays: list) -> None:
        """Before a step runs `entry` on `arrays`: a copy of each array it donates, the others as they are."""
        if threading.get_ident() != self.thread:
            return
        t0 = time.perf_counter()
        donated = [info.donated for info in jax.tree_util.tree_leaves(entry.compiled.args_info)]
        try:
            self._kept = (entry, [jnp.copy(a) if d else a for a, d in zip(arrays, donated)], donated)
        except Exception as error:  # noqa: BLE001 - the step runs as without profiling (out of memory, ...)
            self._kept = None
            _not_profiled(f"its inputs could not be copied: {error}")
        self._copy_seconds = time.perf_counter() - t0

    def profile(self, record: StepRecord) -> dict | None:
        """Run the kept step's executable again under the profiler. Returns the record's changes:
        its `profile`, and its `timings` without the input copies made inside its timed run
        (None if no step was kept, or it could not be profiled: a warning says why; the step's
        own results are bound already, so profiling never costs them)."""
        if self._kept is None or threading.get_ident() != self.thread:
            return None
        entry, inputs, donated = self._kept
        self._kept = None
        t0 = time.perf_counter()
        try:
            events = _trace(entry.compiled, inputs, donated, self.runs)
        except Exception as error:  # noqa: BLE001 - reported; the step itself ran
            _not_profiled(str(error))
            return None
        module = hlo.parse(entry.hlo)
        later_done = {i.name for i in module.instructions.values() if i.opcode in _ASYNC_ON_HOST}
        seconds, device_seconds = _per_run(events, module.name or None, self.runs, later_done)
        measured = join.join(record, seconds, device_seconds=device_seconds, runs=self.runs,
                             overhead_seconds=self._copy_seconds + time.perf_counter() - t0,
                             platform=jax.default_backend())
        execute = max(0.0, record.timings.execute - self._copy_seconds)
        return {"profile": measured, "timings": dataclasses.replace(record.timings, execute=execute)}


def _not_profiled(why: str) -> None:
    sources.warn(f"xlakit.profile(): this step ran but could not be profiled: {why}", sources.capture(),
                 ProfilingWarning)


def _trace(compiled, inputs: list, donated: list[bool], runs: int):
    """Run `compiled` `runs` times under JAX's profiler; the trace as jax.profiler.ProfileData.
    Each run but the last donates fresh copies of the donated inputs; the last, the kept ones."""
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # the device's ops are wanted, not every Python call
    with tempfile.TemporaryDirectory(prefix="xlakit-profile-") as folder:
        try:
            with jax.profiler.trace(folder, profiler_options=options):
                for run in range(runs):
                    last = run == runs - 1
                    args = inputs if last else [jnp.copy(a) if d else a for a, d in zip(inputs, donated)]
                    jax.block_until_ready(compiled(*args))
        except RuntimeError as error:
            if "already" not in str(error):
                raise
            raise RuntimeError("another JAX profiler trace is running (jax.profiler.start_trace or trace): "
                               "stop it first, one process records one trace at a time") from error
        path, = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
        return jax.profiler.ProfileData.from_file(path)


# XLA:CPU runs these as asynchronous thunks (Eigen's matmuls and convolutions): the event ends when
# the work is handed to the thread pool, not when it is done. In a Llama training step (hidden 256,
# 512 tokens) two 134 MFLOP dots had 253 us events each, back to back, then no op ran for 1.35 ms
# while the pool did their work: read alone, 530 GFLOP/s each on a 2-core CPU whose whole step
# averaged 21-84 GFLOP/s (the roofline's 1.1-1.6 TFLOP/s points were these and fusions given a
# matmul's FLOPs, analysis/profile.py). The idle time after them is theirs.
_ASYNC_ON_HOST = frozenset({"dot", "convolution"})


def _per_run(data, module: str | None, runs: int, later_done: set[str] = frozenset()) \
        -> tuple[dict[str, float], float]:
    """(each HLO instruction's seconds in one run, the executable's device seconds): medians
    over the runs; a step on several devices, the mean of a device's. A device's planes where
    they have op events (a GPU's host plane has its launches too), else the host's (XLA:CPU);
    its "XLA Ops" line where it has one. On the host, an instruction of `later_done` (asynchronous
    there) also gets the idle time while its work was in flight."""
    found = []  # (plane is a device's, line name, op, (run, device), start ns, duration ns)
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                op = stats.get("hlo_op")
                if op is None or (module is not None and stats.get("hlo_module", module) != module):
                    continue
                found.append((plane.name.startswith("/device:"), line.name, op,
                              (stats.get("run_id"), stats.get("device_ordinal", plane.name)),
                              event.start_ns, event.duration_ns))
    if any(e[0] for e in found):
        found = [e for e in found if e[0]]
    if any(e[1] == "XLA Ops" for e in found):
        found = [e for e in found if e[1] == "XLA Ops"]
    by_run, devices = defaultdict(list), defaultdict(set)
    for _, _, op, (run, device), start, duration in found:
        by_run[run].append((op, start, duration))
        devices[run].add(device)
    if not any(e[0] for e in found):
        by_run = {run: _idle_to_async(events, later_done) for run, events in by_run.items()}
    groups = [(events, len(devices[run])) for run, events in by_run.items()]
    no_ids = len(groups) == 1 and None in by_run  # all runs in one group
    totals, spans = defaultdict(list), []
    for events, device_count in groups:
        share = (1 / runs if no_ids else 1.0) / device_count
        per_op = defaultdict(float)
        for op, _, duration in events:
            per_op[op] += duration * 1e-9 * share
        for op in per_op.keys() | totals.keys():
            totals[op].append(per_op.get(op, 0.0))
        spans.append((max(s + d for _, s, d in events) - min(s for _, s, _ in events)) * 1e-9
                     * (1 / runs if no_ids else 1.0))
    seconds = {op: statistics.median(times + [0.0] * (len(groups) - len(times))) for op, times in totals.items()}
    return seconds, statistics.median(spans) if spans else 0.0


def _idle_to_async(events: list[tuple[str, int, int]], later_done: set[str]) -> list[tuple[str, int, int]]:
    """`events` (op, start ns, duration ns) with each stretch in which no op ran shared equally among
    the ops of `later_done` dispatched since the one before: the work still in flight then. (Where
    another op ran beside such work, their shares of that time are not told apart.)"""
    events = sorted(events, key=lambda e: e[1])
    extra, in_flight, busy_until = defaultdict(int), [], None
    for op, start, duration in events:
        if busy_until is not None and start > busy_until and in_flight:
            for k in in_flight:
                extra[k] += (start - busy_until) / len(in_flight)
            in_flight = []
        if op in later_done:
            in_flight.append((op, start))
        busy_until = start + duration if busy_until is None else max(busy_until, start + duration)
    return [(op, start, duration + extra.get((op, start), 0)) for op, start, duration in events]
