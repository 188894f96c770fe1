"""Tracing cost per op and sync latency at a cache hit: xlakit next to torch_xla, one run.

A 2000-op elementwise chain on a small tensor, so the executable's own run
time is negligible and the framework overhead is what is measured; the same
chain in place (`mul_`, `add_`), which on a lazy device goes through
functionalization's in-place path. Then a replayed step's marker at three
chain lengths: what of it grows with the step's nodes.
Prints markdown tables of medians and ratios (xlakit / torch_xla).
"""
from __future__ import annotations

import os
import platform
import statistics
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402

N_OPS = 2000
REPEATS = 7


def chain(x, y, n_ops=N_OPS):
    for i in range(n_ops // 2):
        x = x * y
        x = x + y
    return x


def chain_in_place(x, y):
    x = x.clone()
    for i in range(N_OPS // 2):
        x.mul_(y)
        x.add_(y)
    return x


def measure(device, step, wait, chain=chain, prepare=None):
    """Median seconds for (trace 2000 ops) and (sync at a cache hit). `prepare(x, y)` runs
    before each timed step (untimed): it decides whether xlakit records that step."""
    x = torch.full((128,), 1.0, device=device)
    y = torch.full((128,), 1.0, device=device)
    step()
    wait()
    traces, syncs = [], []
    for i in range(REPEATS + 2):       # the first two compile and warm up
        if prepare is not None:
            prepare(x, y)
        t0 = time.perf_counter()
        out = chain(x, y)
        t1 = time.perf_counter()
        step()
        wait()
        t2 = time.perf_counter()
        if i >= 2:
            traces.append(t1 - t0)
            syncs.append(t2 - t1)
        del out
    return statistics.median(traces), statistics.median(syncs)


def _first_step(x, y):
    """The next step is the first after its sync that xlakit sees: not recorded (engine/tape.py)."""
    from xlakit.session import current
    current().forget_recordings()


def _second_step(x, y):
    """The next step is the second after its sync: recorded, to be replayed by the third."""
    import xlakit
    _first_step(x, y)
    chain(x, y)
    xlakit.mark_step()


class _NoOp(torch.Tensor):
    """The least any Python __torch_dispatch__ design pays per op: dispatch
    into Python and make one output tensor, under functionalization."""

    @staticmethod
    def __new__(cls):
        return torch.Tensor._make_wrapper_subclass(cls, (128,), dtype=torch.float32,
                                                   device=torch.device("lazy", 0))

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _NoOp()


def python_dispatch_floor() -> float:
    x = torch._to_functional_tensor(_NoOp())
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        chain(x, x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


MARKER_SIZES = (500, 2000, 8000)


def replayed_marker(n_ops: int):
    """A replayed step's marker for an `n_ops`-op chain, median seconds: its own work (wall minus
    the executable's run), and the freeing of the step's nodes when its graph is dropped
    (the marker returns it; xlakit.mark_step drops it at once)."""
    import xlakit
    from xlakit.core.record import Trigger
    from xlakit.session import current

    engine = current()
    x = torch.full((128,), 1.0, device=xlakit.device())
    y = torch.full((128,), 1.0, device=xlakit.device())
    own, freeing = [], []
    for i in range(REPEATS + 3):  # the first three: not recorded, recorded, compiled
        out = chain(x, y, n_ops)
        t0 = time.perf_counter()
        done = engine.sync(trigger=Trigger.MARK_STEP, source="bench")
        t1 = time.perf_counter()
        del done
        t2 = time.perf_counter()
        record = xlakit.last_step()
        if i >= 3:
            assert record.replay.recorded == 0, record.replay
            own.append(t1 - t0 - record.timings.execute)
            freeing.append(t2 - t1)
        del out
    return statistics.median(own), statistics.median(freeing)


def main():
    rows = {}
    try:
        import torch_xla
        import torch_xla.core.xla_model as xm
        xla_dev = torch_xla.device()
        rows["torch_xla 2.9 (LazyTensor)"] = (*measure(xla_dev, torch_xla.sync, xm.wait_device_ops),
                                              measure(xla_dev, torch_xla.sync, xm.wait_device_ops, chain_in_place)[0])
    except ImportError:
        print("torch_xla is not installed: only xlakit is measured")

    import xlakit
    xlakit.config.wait_for_execution = True
    rows["xlakit, replayed step"] = (*measure(xlakit.device(), xlakit.mark_step, lambda: None),
                                     measure(xlakit.device(), xlakit.mark_step, lambda: None, chain_in_place)[0])
    rows["xlakit, first step (not recorded)"] = (*measure(xlakit.device(), xlakit.mark_step, lambda: None,
                                                         prepare=_first_step), float("nan"))
    rows["xlakit, second step (recorded)"] = (*measure(xlakit.device(), xlakit.mark_step, lambda: None,
                                                      prepare=_second_step), float("nan"))

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}; "
          f"{N_OPS}-op chain, median of {REPEATS}")
    print("| peer | trace µs/op | in-place trace µs/op | sync at cache hit ms |")
    # xlakit replays a step that matches the one before it (engine/tape.py): a loop's first step
    # runs as without replay, its second is recorded for matching, its third and later replay
    print("|---|---|---|---|")
    for name, (trace, sync, in_place) in rows.items():
        in_place = "-" if in_place != in_place else f"{in_place / N_OPS * 1e6:.1f}"  # nan: not measured
        print(f"| {name} | {trace / N_OPS * 1e6:.1f} | {in_place} | {sync * 1e3:.2f} |")
    print(f"| floor: no-op Python dispatch under functionalization | "
          f"{python_dispatch_floor() / N_OPS * 1e6:.1f} | - | - |")
    print("\nA replayed step's marker, by the step's size (median ms; its own work is wall minus the "
          "executable's run)\n\n| ops in the step | marker's own work ms | then freeing the step's nodes ms |\n"
          "|---|---|---|")
    for n_ops in MARKER_SIZES:
        own, freeing = replayed_marker(n_ops)
        print(f"| {n_ops} | {own * 1e3:.2f} | {freeing * 1e3:.2f} |")
    if "torch_xla 2.9 (LazyTensor)" in rows:
        xt, xs, xi = rows["torch_xla 2.9 (LazyTensor)"]
        kt, ks, ki = rows["xlakit, replayed step"]
        ft, fs, _ = rows["xlakit, first step (not recorded)"]
        rt, rs, _ = rows["xlakit, second step (recorded)"]
        print(f"\nratio xlakit / torch_xla, replayed step: trace {kt / xt:.2f}, in place {ki / xi:.2f}, "
              f"sync {ks / xs:.2f}; first step: trace {ft / xt:.2f}, sync {fs / xs:.2f}; "
              f"second step: trace {rt / xt:.2f}, sync {rs / xs:.2f}")


if __name__ == "__main__":
    main()
