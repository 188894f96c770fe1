"""Dispatching ahead (issue 47 item 5): does a step's call return once its Python is done, so that
the next step's Python runs while the device computes this one?

On a GPU or TPU an executable runs beside the Python that dispatched it. Here XLA:CPU is made to
do the same: JAX's asynchronous CPU dispatch (xlakit turns it off otherwise: docs/architecture.md)
and one thread per executable, so the executable takes one of the cores and Python the other.
bench/real_models.py's Llama (tiny with --quick), xlakit lazy and its whole step under
torch.compile, each stepped back to back, waiting for each execution (`config.wait_for_execution`,
the default) and dispatching ahead. Prints a markdown table: ms/step both ways, and how long a step's
call took when dispatching ahead (its Python alone, if nothing in it waited for the step before).
`python bench/dispatch_ahead.py [--quick]`
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ["JAX_CPU_ENABLE_ASYNC_DISPATCH"] = "1"  # read when JAX makes its CPU client: before any use
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import real_models  # noqa: E402


def back_to_back(step, steps: int, wait: bool) -> tuple[float, float]:
    """(ms/step over `steps` steps run back to back, the median ms a step's call took)."""
    import xlakit

    xlakit.config.wait_for_execution = wait
    try:
        for _ in range(3):  # warm-up: compiles, and each new executable's first runs
            step()
        xlakit.wait()
        calls = []
        started = time.perf_counter()
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            calls.append(time.perf_counter() - t0)
        xlakit.wait()
        return (time.perf_counter() - started) / steps * 1e3, statistics.median(calls) * 1e3
    finally:
        xlakit.config.wait_for_execution = True


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a tiny Llama, few steps (a smoke run)")
    args = parser.parse_args()
    import xlakit

    model, _, ids = real_models.build("Llama", args.quick)
    steps = 3 if args.quick else 8
    peers = {"xlakit lazy": real_models.torch_peer(model, ids, xlakit.device(), after_step=xlakit.mark_step),
             real_models.COMPILED: real_models.torch_peer(model, ids, xlakit.device(),
                                                          whole=real_models.xlakit_compiled)}
    print(f"torch {torch.__version__}; Llama, batch x seq {tuple(ids.shape)}; {steps} steps back to back; "
          f"XLA:CPU dispatching asynchronously, one thread per executable\n\n"
          "| peer | waiting ms/step | dispatching ahead ms/step | dispatching ahead: a step's call ms |\n"
          "|---|---|---|---|")
    for name, step in peers.items():
        waiting, _ = back_to_back(step, steps, wait=True)
        ahead, call = back_to_back(step, steps, wait=False)
        print(f"| {name} | {waiting:.1f} | {ahead:.1f} | {call:.1f} |")


if __name__ == "__main__":
    main()
