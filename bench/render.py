"""How long the step view takes for a 5000-node graph (target: under 1 s)."""
from __future__ import annotations

import statistics
import time

import torch

import xlakit
from xlakit.notebook import render


def main():
    x = torch.ones(8).to(xlakit.device())
    for _ in range(2500):
        x = x * 1.0001
        x = x + 0.5
    with xlakit.capture() as steps:
        xlakit.mark_step()
    [record] = steps
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        page = render.html_view(record)
        times.append(time.perf_counter() - t0)
    print(f"step view of a {record.num_nodes}-node graph: median {statistics.median(times) * 1e3:.1f} ms "
          f"(target < 1000 ms), {len(page) / 1024:.0f} KiB of HTML")


if __name__ == "__main__":
    main()
