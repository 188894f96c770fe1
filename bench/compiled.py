"""Per-call cost of torch.compile on xlakit at a cache hit, parameters resident on the
device, next to one `jax.jit` of the same model (the floor), the lazy path and
torch_xla's openxla and lazy paths, same run (issues: graph-breaks, compile).

A small MLP forward (2 x 64, batch 8) so the executable's run time is tiny and
the framework's per-call cost is what is measured; then the same MLP's whole AdamW
step compiled, its executables' time apart from the rest. Each peer takes its input from,
and returns its output to, the device it runs on and waits for it; the compiled
path with CPU inputs uploads the input and the parameters and downloads the
output on every call.
"""
from __future__ import annotations

import copy
import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
from timing import median_seconds  # noqa: E402

CALLS = 200


def per_call_us(call, wait) -> float:
    return median_seconds(call, wait, repeats=CALLS, warmup=20) * 1e6


def main():
    import jax
    import numpy as np

    import xlakit
    from jax_models import extract

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).eval()
    x = torch.randn(8, 64)
    rows = {}
    with torch.no_grad():
        dev = xlakit.device()
        lazy_model, xd = copy.deepcopy(model).to(dev), x.to(dev)
        out = {}
        compiled = torch.compile(lazy_model, backend="xlakit")
        torch.testing.assert_close(compiled(xd).cpu(), model(x))
        rows["xlakit compiled, parameters on the device"] = per_call_us(
            lambda: out.__setitem__("y", compiled(xd)), xlakit.wait)
        params, forward = extract(model)
        jitted, xj = jax.jit(forward), jax.device_put(x.numpy())
        np.testing.assert_allclose(np.asarray(jitted(params, xj)), model(x).numpy(), rtol=1e-5, atol=1e-6)
        rows["jax.jit (the floor)"] = per_call_us(
            lambda: out.__setitem__("y", jitted(params, xj)), lambda: out["y"].block_until_ready())
        compiled_cpu = torch.compile(copy.deepcopy(model), backend="xlakit")
        rows["xlakit compiled, model on CPU"] = per_call_us(
            lambda: out.__setitem__("y", compiled_cpu(x)), lambda: None)
        rows["xlakit lazy (trace + mark_step)"] = per_call_us(
            lambda: (out.__setitem__("y", lazy_model(xd)), xlakit.mark_step()), lambda: None)
        rows["eager torch (CPU)"] = per_call_us(lambda: model(x), lambda: None)
        try:
            import torch_xla
            import torch_xla.core.xla_model as xm

            xla_model, xx = copy.deepcopy(model).to(torch_xla.device()), x.to(torch_xla.device())
            openxla = torch.compile(xla_model, backend="openxla")
            rows["torch_xla openxla"] = per_call_us(lambda: out.__setitem__("y", openxla(xx)), xm.wait_device_ops)
            rows["torch_xla lazy (trace + sync)"] = per_call_us(
                lambda: (out.__setitem__("y", xla_model(xx)), torch_xla.sync()), xm.wait_device_ops)
        except ImportError:
            pass
    base = rows["jax.jit (the floor)"]
    print(f"MLP 2 x 64 forward, batch 8, median of {CALLS} calls at a cache hit\n")
    print("| path | µs/call | × jax.jit |\n|---|---|---|")
    for name, us in rows.items():
        print(f"| {name} | {us:.0f} | {us / base:.2f} |")
    training(model, x)
    for name in ("Llama", "GPT-2"):
        real_model(name)


def real_model(name: str):
    """Compiled inference of a real model's logits (bench/real_models.py's 4 x 256 model, 8 x 128
    tokens), parameters on the device: where the executable, not the call, takes the time. The
    same peers, measured in turn per round (the machine may be shared): ratios are medians of
    per-round ratios to jax.jit."""
    import statistics

    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_models
    import real_models
    import xlakit

    model, logits_fn, ids = real_models.build(name, quick=False)
    model.eval()
    params, cfg = jax_models.trainable(model), model.config
    idsj = jnp.asarray(ids.numpy().astype(np.int32))
    jitted = jax.jit(lambda p, i: logits_fn(p, i, cfg))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    np.testing.assert_allclose(np.asarray(jitted(params, idsj)), want.numpy(), rtol=2e-3, atol=2e-3)
    out = {}
    calls = {"jax.jit (the floor)": (lambda: out.__setitem__("y", jitted(params, idsj)),
                                     lambda: out["y"].block_until_ready())}
    dev = xlakit.device()
    compiled = torch.compile(copy.deepcopy(model).to(dev), backend="xlakit")
    idsd = ids.to(dev)
    calls["xlakit compiled, parameters on the device"] = (
        lambda: out.__setitem__("y", compiled(input_ids=idsd).logits), xlakit.wait)
    try:
        import torch_xla
        import torch_xla.core.xla_model as xm

        openxla = torch.compile(copy.deepcopy(model).to(torch_xla.device()), backend="openxla")
        idsx = ids.to(torch_xla.device())
        calls["torch_xla openxla"] = (lambda: out.__setitem__("y", openxla(input_ids=idsx).logits),
                                      xm.wait_device_ops)
    except ImportError:
        pass
    rounds = {peer: [] for peer in calls}
    with torch.no_grad():
        torch.testing.assert_close(compiled(input_ids=idsd).logits.cpu(), want, rtol=2e-3, atol=2e-3)
        for _ in range(5):
            for peer, (call, wait) in calls.items():
                rounds[peer].append(median_seconds(call, wait, repeats=10, warmup=3) * 1e3)
    base = rounds["jax.jit (the floor)"]
    print(f"\n{name} 4 x 256 logits, 8 x 128 tokens, compiled inference: 5 rounds of 10 calls each\n")
    print("| path | ms/call | × jax.jit (paired) |\n|---|---|---|")
    for peer, ms in rounds.items():
        ratio = statistics.median(m / b for m, b in zip(ms, base))
        print(f"| {peer} | {statistics.median(ms):.2f} | {ratio:.2f} |")


def training(model, x):
    """The same MLP's whole AdamW step compiled (forward, loss, backward, step, zero_grad),
    parameters and moments on the device, next to the step as one donating jax.jit; the
    compiled step's time split into its executables' (their records' `execute`, each waited
    for) and the rest: Python (Dynamo, AOTAutograd, xlakit) and the step counts' transfers."""
    import xlakit
    from training import jax_peer

    y = torch.randn(8, 64)
    dev = xlakit.device()
    lazy_model = copy.deepcopy(model).train().to(dev)
    opt = torch.optim.AdamW(lazy_model.parameters(), lr=1e-3)
    xd, yd = x.to(dev), y.to(dev)

    def step(x, y):
        opt.zero_grad()
        torch.nn.functional.mse_loss(lazy_model(x), y).backward()
        opt.step()

    compiled = torch.compile(step, backend="xlakit")
    for _ in range(3):  # traced, then its executable run directly
        compiled(xd, yd)
    with xlakit.capture() as records:
        total = per_call_us(lambda: compiled(xd, yd), xlakit.wait)
    calls = CALLS + 20
    executions = len(records) / calls
    execute = sum(r.timings.execute for r in records) / calls * 1e6
    floor = per_call_us(*jax_peer(model, x, y))
    print(f"\nMLP 2 x 64 AdamW step, batch 8, median of {CALLS} calls at a cache hit\n")
    print("| path | µs/call | × jax.jit |\n|---|---|---|")
    print(f"| xlakit compiled step, parameters on the device | {total:.0f} | {total / floor:.2f} |")
    print(f"| of it: its executables ({executions:.0f} per call, mean time) | {execute:.0f} | |")
    print(f"| of it: the rest (Python, step-count transfers) | {total - execute:.0f} | |")
    print(f"| jax.jit (the floor) | {floor:.0f} | 1.00 |")


if __name__ == "__main__":
    main()
