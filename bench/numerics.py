"""What finding the first NaN costs (issue: numerics).

1. The same program, a 12-layer MLP whose 7th layer takes the log of a
   negative number, in JAX under `jax_debug_nans` (which re-runs a jitted
   function that returned a NaN op by op, de-optimized, to name the primitive)
   and in torch on xlakit with `config.check_nans` (the origin found inside the
   compiled step). Per peer: the step with no check, and the time from the call
   to the error naming the op, both warm (executables compiled).
2. What check_nans and record_ranges cost on the Llama training step of
   bench/real_models.py: the executable's own time (StepRecord.timings.execute,
   median of the steps after the first two), XLA's cost and memory analysis
   (peak) and the bytes the step donated, off and on.

`python bench/numerics.py [--quick]`
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from real_models import GPU_MODELS  # noqa: E402

import xlakit  # noqa: E402

LAYERS, BAD_LAYER = 12, 6


def timed(fn) -> tuple[float, str]:
    """Seconds `fn()` took and the FloatingPointError it raised ("" if none)."""
    t0 = time.perf_counter()
    try:
        fn()
    except FloatingPointError as e:
        return time.perf_counter() - t0, str(e)
    return time.perf_counter() - t0, ""


def best(fn, repeats: int) -> tuple[float, str]:
    runs = [timed(fn) for _ in range(repeats + 1)][1:]   # the first compiles
    return min(t for t, _ in runs), runs[-1][1]


def mlp_jax(weights, x):
    for k, w in enumerate(weights):
        x = jnp.tanh(x @ w)
        if k == BAD_LAYER:
            x = jnp.log(x - 2.0)   # tanh < 1: log of a negative number
    return x.sum()


def mlp_torch(weights, x):
    for k, w in enumerate(weights):
        x = torch.tanh(x @ w)
        if k == BAD_LAYER:
            x = torch.log(x - 2.0)
    return x.sum()


def compare_with_jax(width: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((width, width), np.float32) / np.sqrt(width) for _ in range(LAYERS)]
    x = rng.standard_normal((width, width), np.float32)

    jw, jx = [jnp.asarray(w) for w in weights], jnp.asarray(x)
    step = jax.jit(mlp_jax)
    plain_jax, _ = best(lambda: step(jw, jx).block_until_ready(), repeats)
    with jax.debug_nans(True):
        found_jax, jax_error = best(lambda: step(jw, jx).block_until_ready(), repeats)

    dev = xlakit.device()
    tw, tx = [torch.from_numpy(w).to(dev) for w in weights], torch.from_numpy(x).to(dev)
    xlakit.mark_step()

    def xlakit_step():
        out = mlp_torch(tw, tx)
        xlakit.mark_step()
        return out
    plain_xlakit, _ = best(xlakit_step, repeats)
    xlakit.config.check_nans = True
    try:
        found_xlakit, xlakit_error = best(xlakit_step, repeats)
    finally:
        xlakit.config.check_nans = False

    print(f"\n### First NaN in a {LAYERS}-layer MLP ({width}x{width}, log of a negative after layer {BAD_LAYER + 1}),"
          " warm, best of", repeats)
    print("\n| peer | step, no check (ms) | to the error (ms) | the error names |")
    print("|---|---|---|---|")
    print(f"| jax.jit + jax_debug_nans | {plain_jax * 1e3:.2f} | {found_jax * 1e3:.2f} | "
          f"{jax_error.splitlines()[0][:70] if jax_error else '(none)'} |")
    print(f"| xlakit + check_nans | {plain_xlakit * 1e3:.2f} | {found_xlakit * 1e3:.2f} | "
          f"{xlakit_error[:70] if xlakit_error else '(none)'} |")


def llama_cost(name: str, quick: bool, steps: int) -> None:
    torch.manual_seed(0)
    model, _ = GPU_MODELS[name](quick)
    dev = xlakit.device()
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (2, 16) if quick else (8, 128)).to(dev)
    xlakit.mark_step()

    modes = {"off": (False, False), "check_nans": (True, False), "record_ranges": (False, True)}
    records = {mode: [] for mode in modes}
    # one step of each mode in turn, so that a change of load on this shared machine falls on all
    # of them alike; the first two rounds compile
    for round_ in range(steps + 2):
        for mode, (nans, ranges) in modes.items():
            xlakit.config.check_nans, xlakit.config.record_ranges = nans, ranges
            try:
                with xlakit.capture() as captured:
                    opt.zero_grad()
                    model(input_ids=ids, labels=ids).loss.backward()
                    opt.step()
                    xlakit.mark_step()
            finally:
                xlakit.config.check_nans, xlakit.config.record_ranges = False, False
            step, = [r for r in captured if r.trigger == "mark_step"]
            records[mode].append((round_ >= 2, step, sum(r.timings.lower + r.timings.compile for r in captured)))
    execute = {mode: [r.timings.execute for timed, r, _ in rows if timed] for mode, rows in records.items()}
    off = statistics.median(execute["off"])
    nodes = records["off"][-1][1].num_nodes
    print(f"\n### {name} training step (bench/real_models.py{' --quick' if quick else ''}: {nodes} nodes), "
          f"executable time, median of {steps} steps, the modes' steps taken in turn")
    peak_off = records["off"][-1][1].memory.peak
    print("\n| numerics | execute (ms) | vs off | paired vs off (median, quartiles) | XLA flops "
          "| XLA bytes accessed | peak memory (MiB) | peak vs off | donated (MiB) | lower + compile (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode, rows in records.items():
        record, built = rows[-1][1], sum(b for _, _, b in rows)
        seconds = statistics.median(execute[mode])
        paired = sorted(t / o - 1 for t, o in zip(execute[mode], execute["off"]))
        quartiles = statistics.quantiles(paired, n=4)
        donated = sum(d.nbytes for d in record.donated) / 2**20
        print(f"| {mode} | {seconds * 1e3:.2f} | {100 * (seconds / off - 1):+.1f}% | "
              f"{100 * statistics.median(paired):+.1f}% ({100 * quartiles[0]:+.1f}%, {100 * quartiles[2]:+.1f}%) | "
              f"{record.cost.flops:.4g} | {record.cost.bytes_accessed:.4g} | {record.memory.peak / 2**20:.1f} | "
              f"{record.memory.peak / peak_off:.3f}x | {donated:.1f} | {built:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (a smoke test)")
    parser.add_argument("--model", default="Llama", choices=GPU_MODELS,
                        help="the training step whose cost is measured ('Llama 8 x 1024' on a GPU)")
    args = parser.parse_args()
    print(f"device: {jax.devices()[0].device_kind}; torch {torch.__version__}, jax {jax.__version__}")
    compare_with_jax(width=64 if args.quick else 1024, repeats=2 if args.quick else 10)
    llama_cost(args.model, args.quick, steps=2 if args.quick else 20)  # 2: the fewest statistics.quantiles takes


if __name__ == "__main__":
    main()
