"""The one timing loop the benchmarks share."""
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
