"""The timing loops the benchmarks share."""
from __future__ import annotations

import statistics
import time


def median_seconds(step, wait, repeats: int, warmup: int) -> float:
    """Median wall time of `step(); wait()` after `warmup` untimed runs."""
    for _ in range(warmup):
        step()
    wait()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        wait()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def seconds_per_step(step, wait, steps: int, warmup: int, rounds: int = 3) -> float:
    """Throughput: `steps` steps back to back and one `wait()` at the end (a
    peer may trace its next step while the device runs this one), as seconds
    per step; the median of `rounds` rounds."""
    for _ in range(warmup):
        step()
    return median_seconds(lambda: [step() for _ in range(steps)], wait, repeats=rounds, warmup=0) / steps


def host_seconds_per_step(step, wait, repeats: int = 5) -> float:
    """A peer's own Python per step: from an idle device to the step's dispatch (a peer that
    dispatches asynchronously returns then), median of `repeats`."""
    times = []
    for _ in range(repeats):
        wait()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    wait()
    return statistics.median(times)


def mark_step_ahead() -> None:
    """xlakit's step marker returning at dispatch: Python traces the next step while
    the device runs this one (the "dispatch ahead" peers)."""
    import xlakit

    xlakit.config.wait_for_execution = False
    try:
        xlakit.mark_step()
    finally:
        xlakit.config.wait_for_execution = True
