"""Where a compiled whole training step's Python goes (issue 47 item 3): a step under
torch.compile(backend="xlakit") timed whole, less its records' own lower, compile and execute
times ("Python per step"), and that Python split by timers around the parts that run it:

- xlakit recording: CompiledCall.emit, each FX graph recorded again into the lazy step;
- xlakit calls: the rest of the backend's own work per graph call (finding the compiled call,
  reading its inputs' values, running a graph that does not join the step);
- xlakit copy-in and step counts: the optimizer graph's new values given to its inputs, and
  its host step counts computed on the host (read back where the host cannot compute them);
- step marker: Engine.sync less its executable's call (Engine._run, a record's execute);
- AOTAutograd forward: the compiled forward's callable (its autograd Function and runtime
  wrappers) less the xlakit calls inside it;
- autograd backward: autograd's engine run by `Tensor.backward` (and AOTAutograd's backward wrapper)
  less the xlakit calls inside it;
- Dynamo and the step's own Python: the rest (the frames' guards, the resume functions, the
  optimizer's Python around its graph, zero_grad).

The timers wrap those functions (xlakit's, and autograd's engine entry) while the step is made and
measured, and are removed after; their own cost falls into the parts they time.
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch

EXECUTABLE = "executable call"  # Engine._run: the executable's call and wait (a record's execute)
PARTS = ("xlakit recording", "xlakit calls", "xlakit copy-in and step counts", "step marker",
         "AOTAutograd forward", "autograd backward", "Dynamo and the step's own Python")


class _Clock:
    """Per label, the wall time and this thread's CPU time spent in the functions timed under it,
    less the timers nested in them. CPU time, unlike wall time, is not stretched by other
    processes on a shared machine: what the Python costs there where it runs alone."""

    def __init__(self):
        self.spent: dict[str, list[float]] = {}
        self.stack: list[list] = []  # per open timer: [wall at start, CPU at start, nested wall, nested CPU]

    def timed(self, label, fn):
        # not functools.wraps: the attributes it copies let Dynamo (innermost_fn) reach past the wrapper
        def timed(*args, **kwargs):
            self.stack.append([time.perf_counter(), time.thread_time(), 0.0, 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                wall0, cpu0, nested_wall, nested_cpu = self.stack.pop()
                wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
                spent = self.spent.setdefault(label, [0.0, 0.0])
                spent[0] += wall - nested_wall
                spent[1] += cpu - nested_cpu
                if self.stack:
                    self.stack[-1][2] += wall
                    self.stack[-1][3] += cpu
        _skipped_by_dynamo(timed.__code__)
        return timed


def _skipped_by_dynamo(code) -> None:
    """Dynamo compiles every new frame a compiled function's Python runs (autograd's engine runs
    at a graph break) unless it is torch's own or marked: a timer's frame was traced, and
    recompiled at every step ("L['___stack0'] got deallocated"). Marked as xlakit marks its own
    (front/dynamo_frames.py): skipped, and what it calls."""
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))


@contextlib.contextmanager
def _patched(clock: _Clock):
    from torch._dynamo.backends import registry

    from xlakit.engine import executor
    from xlakit.integrations import compiled_call, dynamo

    backend = registry.lookup_backend("xlakit")  # loaded by its entry point on first use

    def forward_compiled(fn):  # AOTAutograd's compiled forward of a training graph
        return clock.timed("AOTAutograd forward", fn)

    def timed_backend(gm, example_inputs):
        compiled = backend(gm, example_inputs)
        if getattr(compiled, "__name__", "") == "call":  # xlakit's own call of an optimizer's graph
            return clock.timed("xlakit calls", compiled)
        return forward_compiled(compiled)

    compile_fx = dynamo._compile_fx

    def timed_compile_fx(*args, **kwargs):
        return clock.timed("xlakit calls", compile_fx(*args, **kwargs))

    patches = [(registry._COMPILER_FNS, "xlakit", timed_backend, True),
               (dynamo, "_compile_fx", timed_compile_fx, False),
               (compiled_call.CompiledCall, "emit", clock.timed("xlakit recording", compiled_call.CompiledCall.emit), False),
               (dynamo, "_copy_in", clock.timed("xlakit copy-in and step counts", dynamo._copy_in), False),
               (dynamo, "_computed_on_host", clock.timed("xlakit copy-in and step counts", dynamo._computed_on_host),
                False),
               (dynamo._HostPart, "__call__", clock.timed("xlakit copy-in and step counts",
                                                          dynamo._HostPart.__call__), False),
               (executor.Engine, "sync", clock.timed("step marker", executor.Engine.sync), False),
               (executor.Engine, "_run", clock.timed(EXECUTABLE, executor.Engine._run), False),
               # autograd's engine, below `Tensor.backward`: Dynamo, which breaks its graph at that call, would
               # trace a wrapper of it
               (torch.autograd, "_engine_run_backward", clock.timed("autograd backward",
                                                                    torch.autograd._engine_run_backward), False)]
    saved = []
    for owner, name, value, item in patches:
        saved.append((owner, name, owner[name] if item else getattr(owner, name), item))
        if item:
            owner[name] = value
        else:
            setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value, item in saved:
            if item:
                owner[name] = value
            else:
                setattr(owner, name, value)


def compiled_step(make_step, wait, steps: int = 5, warmup: int = 6) -> dict:
    """Median per step: the step's wall time, its executables' (its records' execute), its Python
    (wall less its records' lower, compile and execute), and per part of that Python (PARTS) a
    pair (wall ms, this thread's CPU ms); "Python per step (CPU)": the step's CPU time in this
    thread less that of its executables' calls. `make_step` makes the step (torch.compile inside:
    the timers must see the backend compile its graphs)."""
    import xlakit

    clock = _Clock()
    rows = []
    with _patched(clock):
        step = make_step()
        for _ in range(warmup):
            step()
            wait()
        for _ in range(steps):
            clock.spent.clear()
            with xlakit.capture() as records:
                wall0, cpu0 = time.perf_counter(), time.thread_time()
                step()
                wait()
                wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
            execute = sum(r.timings.execute for r in records)
            own = execute + sum(r.timings.lower + r.timings.compile for r in records)
            spent = {part: clock.spent.get(part, [0.0, 0.0]) for part in (*PARTS[:-1], EXECUTABLE)}
            python = (wall - own, cpu - spent[EXECUTABLE][1])
            row = {"wall": wall, "executables": execute, "Python per step": python[0],
                   "Python per step (CPU)": python[1], "executions": len(records)}
            for part in PARTS[:-1]:
                row[part] = spent[part]
            row[PARTS[-1]] = tuple(python[i] - sum(spent[part][i] for part in PARTS[:-1]) for i in (0, 1))
            rows.append(row)
    split = {}
    for k, v in rows[0].items():
        scale = 1 if k == "executions" else 1e3
        split[k] = tuple(statistics.median(r[k][i] for r in rows) * scale for i in (0, 1)) \
            if isinstance(v, (tuple, list)) else statistics.median(r[k] for r in rows) * scale
    return split


def collector_per_step(step, wait, steps: int) -> dict:
    """Python's cyclic collector over `steps` more steps (gc.callbacks): its mean ms per step, and
    per generation the collections made. The medians above leave it out: a full collection walks
    the whole heap (torch, transformers, jax: ~0.8 million objects, ~250 ms here) once in tens of
    steps, when what the steps kept alive past two collections adds up to a quarter of it."""
    import gc

    spent, started, counts = [0.0], [0.0], [0, 0, 0]

    def timed(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - started[0]
            counts[info["generation"]] += 1
    gc.callbacks.append(timed)
    try:
        for _ in range(steps):
            step()
            wait()
    finally:
        gc.callbacks.remove(timed)
    return {"steps": steps, "ms per step": spent[0] / steps * 1e3, "collections": tuple(counts)}


def print_split(label: str, split: dict) -> None:
    print(f"\n{label}: {split['executions']:.0f} execution(s) per step, wall {split['wall']:.1f} ms, executables "
          f"{split['executables']:.1f} ms, **Python per step {split['Python per step']:.1f} ms** (wall less the "
          f"records' lower, compile and execute), {split['Python per step (CPU)']:.1f} ms of this thread's CPU "
          "(medians of steps)\n\n| part of the Python | wall ms/step | CPU ms/step |\n|---|---|---|")
    for part in PARTS:
        print(f"| {part} | {split[part][0]:.2f} | {split[part][1]:.2f} |")


def main():
    """`python bench/step_split.py [--model Llama] [--quick]`: the split alone, for one model."""
    import argparse
    import os
    import platform

    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import jax
    import transformers

    import real_models
    import xlakit

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="Llama", choices=real_models.MODELS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--collector-steps", type=int, default=100,
                        help="steps after the split to time Python's cyclic collector over (0: none)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}, jax {jax.__version__}, "
          f"transformers {transformers.__version__}; load {os.getloadavg()[0]:.1f}")
    model, _, ids = real_models.build(args.model, args.quick)
    made = []  # the step, kept to go on timing its collector

    def make_step():
        made.append(real_models.torch_peer(model, ids, xlakit.device(), whole=real_models.xlakit_compiled))
        return made[-1]
    split = compiled_step(make_step, xlakit.wait, steps=args.steps)
    print_split(f"{args.model}, {real_models.COMPILED}", split)
    if args.collector_steps:
        collector = collector_per_step(made[-1], xlakit.wait, args.collector_steps)
        print(f"\nPython's cyclic collector over {collector['steps']} more steps: {collector['ms per step']:.1f} ms per "
              f"step (mean); collections of generations 0, 1, 2: {', '.join(map(str, collector['collections']))}")


if __name__ == "__main__":
    main()
