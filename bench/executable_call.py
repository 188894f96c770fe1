"""Where the executable call of a compiled inference call goes (issue: compile, per-call cost).

The MLP of bench/compiled.py, compiled with torch.compile on xlakit; its cache entry's
executable is then called four ways on the same arrays, each waited for: `jax.jit(f)` of
the same MLP written in JAX, `jax.jit(f).lower().compile()`, the entry's `compiled` (a
`jax.stages.Compiled`, called through JAX's C++ fast path) and `Engine._run` (the entry
called as Engine.run_compiled calls it: use count, in-flight outputs, the wait). Each back to back,
then with 100 µs of Python between calls, as a compiled call has (Dynamo, the backend,
the StepRecord): on XLA:CPU the gap, not the caller, decides the time. Last, the whole
compiled call, and its Python alone: the same call with the entry's executable replaced
by its outputs, ready.
"""
from __future__ import annotations

import copy
import os
import statistics
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

CALLS = 2000


def busy(seconds: float) -> None:
    """Python running for `seconds`, as the layers around an executable call do."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def per_call_us(call, gap: float) -> float:
    for _ in range(100):
        jax.block_until_ready(call())
    times = []
    for _ in range(CALLS):
        busy(gap)
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def compiled_call(model, x):
    """A compiled call of `model` on `x` (both on the device), the cache entry it runs
    and the arrays it runs that entry on."""
    import xlakit
    from xlakit.engine import executor

    seen = {}
    run = executor.Engine._run

    def spy(self, entry, arrays, graph):
        seen["call"] = entry, list(arrays)
        return run(self, entry, arrays, graph)

    dev = xlakit.device()
    compiled = torch.compile(copy.deepcopy(model).to(dev), backend="xlakit")
    with torch.no_grad():
        xd = x.to(dev)
        for _ in range(3):  # traced, then its executable run directly
            compiled(xd)
        executor.Engine._run = spy
        try:
            compiled(xd)
        finally:
            executor.Engine._run = run
    return (lambda: compiled(xd)), *seen["call"]


def main():
    from xlakit.engine import executor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).eval()
    x = torch.randn(8, 64)
    call, entry, arrays = compiled_call(model, x)
    w1, b1, w2, b2 = (jax.device_put(p.detach().numpy()) for p in model.parameters())
    xj = jax.device_put(x.numpy())

    def forward(x, w1, b1, w2, b2):
        return (jax.nn.relu(x @ w1.T + b1) @ w2.T + b2,)

    jitted = jax.jit(forward)
    aot = jitted.lower(xj, w1, b1, w2, b2).compile()
    np.testing.assert_allclose(np.asarray(entry.compiled(*arrays)[0]), np.asarray(aot(xj, w1, b1, w2, b2)[0]),
                               rtol=1e-5, atol=1e-6)
    engine = executor.current()
    calls = {
        "jax.jit(f)(*args)": lambda: jitted(xj, w1, b1, w2, b2),
        "jax.jit(f).lower().compile()(*args)": lambda: aot(xj, w1, b1, w2, b2),
        "xlakit entry.compiled(*arrays)": lambda: entry.compiled(*arrays),
        "xlakit Engine._run(entry, arrays)": lambda: engine._run(entry, arrays, None),
    }
    print(f"MLP 2 x 64 forward, batch 8: one executable call and its wait, median of {CALLS}\n")
    print("| call | back to back µs | 100 µs of Python between, µs |\n|---|---|---|")
    for name, each in calls.items():
        print(f"| {name} | {per_call_us(each, 0.0):.1f} | {per_call_us(each, 100e-6):.1f} |")
    with torch.no_grad():
        whole = per_call_us(call, 0.0)
        ready = entry.compiled(*arrays)
        entry.compiled = lambda *arrays: ready
        python = per_call_us(call, 0.0)
    print(f"\nThe compiled call back to back: {whole:.1f} µs; its Python alone (the executable's outputs "
          f"ready at once): {python:.1f} µs")


if __name__ == "__main__":
    main()
