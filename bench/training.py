"""Training-step benchmarks, all peers in one run, as ratios to plain jax.jit.

Workloads: an MLP (4 x 1024, batch 64) and a transformer encoder (4 layers,
d_model 256, seq 128, batch 16), both with AdamW; recompiles over 20 steps with
a changing learning rate and with the same step at two source lines; the
executable's memory with and without donation; and what xlakit's in-graph
checks (xlakit.config.checks) cost on a Llama AdamW step. float32 matmuls at full
precision everywhere ("highest"). Each peer runs its steps back to back and
waits for the device once at the end: ms/step is 1 / throughput, and a peer
that traces its next step while the device runs this one gains by it.
`python bench/training.py [--quick] [--device cuda]` (bench/gpu.sh runs the latter).
"""
from __future__ import annotations

import argparse
import copy
import os
import platform

os.environ.setdefault("PJRT_DEVICE", "CPU")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax_models  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from timing import mark_step_ahead, seconds_per_step  # noqa: E402

torch.set_float32_matmul_precision("highest")
jax.config.update("jax_default_matmul_precision", "highest")


def mlp(width=1024, layers=4):
    mods = []
    for _ in range(layers - 1):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(width, width))


def encoder(d=256, layers=4):
    layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def timed(step, wait, steps, warmup):
    return seconds_per_step(step, wait, steps, warmup) * 1e3


def torch_peer(model, x, y, device, after_step=lambda: None, wrap=lambda m: m):
    model = copy.deepcopy(model).to(device)
    run = wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = x.to(device), y.to(device)

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(run(x), y).backward()
        opt.step()
        after_step()
    return step


def jax_peer(model, x, y):
    """The same model and AdamW written directly in JAX (no framework at run time)."""
    params, forward = jax_models.extract(model)
    xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
    with torch.no_grad():  # the floor computes the same model
        np.testing.assert_allclose(forward(params, xj), model(x).numpy(), rtol=1e-4, atol=1e-4)

    def loss(p, xj, yj):
        return jnp.mean((forward(p, xj) - yj) ** 2)

    @jax.jit
    def train_step(p, m, v, t, xj, yj):
        g = jax.grad(loss)(p, xj, yj)
        b1, b2, lr, wd, eps = 0.9, 0.999, 1e-3, 1e-2, 1e-8
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        def update(p, m, v):
            return p * (1 - lr * wd) - lr * (m / (1 - b1 ** t)) / (jnp.sqrt(v / (1 - b2 ** t)) + eps)
        return jax.tree.map(update, p, m, v), m, v

    train_step = jax.jit(train_step.__wrapped__, donate_argnums=(0, 1, 2))
    state = {"p": params, "m": jax.tree.map(jnp.zeros_like, params),
             "v": jax.tree.map(jnp.zeros_like, params), "t": 0}

    def step():
        state["t"] += 1
        state["p"], state["m"], state["v"] = train_step(state["p"], state["m"], state["v"],
                                                        float(state["t"]), xj, yj)
    return step, lambda: jax.block_until_ready(state["p"])


def torchax_peer(model, x, y):
    """torchax's own recipe: the torch model as a JittableModule, its
    make_train_step with optax's AdamW, one donating jax_jit."""
    import optax
    import torchax
    from torchax import interop, train

    env = torchax.default_env()
    with env:
        module = interop.JittableModule(copy.deepcopy(model).to("jax"))
        xj, yj = x.to("jax"), y.to("jax")
    optimizer = optax.adamw(1e-3, eps=1e-8, weight_decay=1e-2)
    train_step = interop.jax_jit(
        train.make_train_step(lambda w, b, a: module.functional_call("forward", w, b, a),
                              nn.functional.mse_loss, optimizer),
        kwargs_for_jax_jit={"donate_argnums": (0, 2)})
    state = {"w": module.params, "opt": interop.call_jax(optimizer.init, module.params)}

    def step():
        with env:
            _, state["w"], state["opt"] = train_step(state["w"], module.buffers, state["opt"], xj, yj)
    return step, lambda: jax.block_until_ready(interop.jax_view(state["w"]))


def peers(model, x, y, quick, device):
    import xlakit

    torch_wait = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    result = {"jax.jit (donating)": jax_peer(model, x, y)}
    try:
        result["torchax (JittableModule + optax)"] = torchax_peer(model, x, y)
    except ImportError:  # optax and torchax: bench peers in .venv only (torchax needs torch < 2.13)
        pass
    result["eager torch"] = (torch_peer(model, x, y, device), torch_wait)
    if not quick:
        result["torch.compile inductor"] = (torch_peer(model, x, y, device, wrap=torch.compile), torch_wait)
    # xlakit's mark_step waits for the step by default (StepRecord timings are
    # then real); with config.wait_for_execution=False it returns at dispatch
    result["xlakit lazy"] = (torch_peer(model, x, y, xlakit.device(), after_step=xlakit.mark_step),
                             lambda: None)
    result["xlakit lazy, dispatch ahead"] = (
        torch_peer(model, x, y, xlakit.device(), after_step=mark_step_ahead), xlakit.wait)
    result["xlakit compiled (model on CPU)"] = (
        torch_peer(model, x, y, "cpu", wrap=lambda m: torch.compile(m, backend="xlakit")), lambda: None)
    try:
        import torch_xla
        import torch_xla.core.xla_model as xm

        result["torch_xla lazy"] = (torch_peer(model, x, y, torch_xla.device(), after_step=torch_xla.sync),
                                    xm.wait_device_ops)
        result["torch_xla openxla (+ lazy AdamW)"] = (
            torch_peer(model, x, y, torch_xla.device(), after_step=torch_xla.sync,
                       wrap=lambda m: torch.compile(m, backend="openxla")), xm.wait_device_ops)
    except ImportError:
        pass
    return result


def measure(name, model, x, y, steps, quick, device="cpu"):
    rows = {}
    for peer, (step, sync) in peers(model, x, y, quick, device).items():
        try:
            rows[peer] = timed(step, sync, steps, warmup=3)
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not hidden
            rows[peer] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
    import gc

    import xlakit

    gc.collect()  # the peers' tensors are garbage now; a failed peer must not leak into the next workload
    try:
        xlakit.mark_step()
    except Exception:  # noqa: BLE001 - its error was reported in its row
        pass
    floor = rows["jax.jit (donating)"]
    print(f"\n### {name}: median ms/step (ratio to jax.jit)\n\n| peer | ms/step | × jax.jit |\n|---|---|---|")
    for peer, ms in rows.items():
        print(f"| {peer} | {ms:.1f} | {ms / floor:.2f} |" if isinstance(ms, float) else f"| {peer} | {ms} | - |")


def recompiles():
    import xlakit

    dev = xlakit.device()
    model = mlp(256, 2).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 256).to(dev), torch.randn(8, 256).to(dev)

    def step_here():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    def step_elsewhere():

        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    for _ in range(2):
        step_here()
        xlakit.mark_step()
    before = xlakit.metrics()["compiles"]
    for i in range(20):
        for group in opt.param_groups:
            group["lr"] = 1e-3 / (i + 1)
        (step_here if i % 2 else step_elsewhere)()
        xlakit.mark_step()
    print(f"\n### Recompiles: {xlakit.metrics()['compiles'] - before} over 20 AdamW steps with a new "
          "learning rate each step, alternating between two source lines (xlakit)")


def memory(width=1024, layers=4):
    import xlakit

    rows = []
    for donate in (True, False):
        xlakit.config.donate = donate
        torch.manual_seed(0)
        model = mlp(width, layers).to(xlakit.device())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x, y = torch.randn(64, width).to(xlakit.device()), torch.randn(64, width).to(xlakit.device())
        with xlakit.capture() as steps:
            for _ in range(3):
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                xlakit.mark_step()
        entry = xlakit.engine.executor.current().cache.get(steps[-1].key)
        mem = entry.compiled.memory_analysis()
        peak = mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes \
            + mem.temp_size_in_bytes
        rows.append((donate, mem.argument_size_in_bytes, mem.alias_size_in_bytes, peak))
    xlakit.config.donate = True
    state = sum(p.numel() * 4 * 3 for p in model.parameters())  # parameters + AdamW's two moments
    print(f"\n### Memory of the AdamW step executable (MLP {layers} x {width}; parameters + optimizer state "
          f"{state / 2**20:.0f} MiB)\n\n| donation | inputs MiB | aliased MiB | peak MiB | peak / state |\n"
          "|---|---|---|---|---|")
    for donate, args, alias, peak in rows:
        print(f"| {'on' if donate else 'off'} | {args / 2**20:.0f} | {alias / 2**20:.0f} | "
              f"{peak / 2**20:.0f} | {peak / state:.2f} |")


def checks_cost(quick):
    """xlakit's in-graph checks on and off, on a Llama language-model AdamW step
    (token embedding and cross-entropy: the indexing ops a real step checks),
    in alternating rounds of the same run. The best round and the fastest
    execution of each (on a shared machine, other processes only add time),
    and XLA's cost analysis of the two executables, which no noise moves."""
    import transformers

    import xlakit

    dev = xlakit.device()
    cfg = transformers.LlamaConfig(vocab_size=512 if quick else 8000, hidden_size=64 if quick else 256,
                                   intermediate_size=128 if quick else 688, num_hidden_layers=1 if quick else 4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   attention_dropout=0.0)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (2 if quick else 8, 16 if quick else 128)).to(dev)

    def step():
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        xlakit.mark_step()

    steps, rounds = (2, 2) if quick else (4, 9)
    wall, execute, cost = {True: [], False: []}, {True: [], False: []}, {}
    try:
        for checks in (True, False):  # compile both executables first
            xlakit.config.checks = checks
            step()
            step()
        for _ in range(rounds):
            for checks in (True, False):
                xlakit.config.checks = checks
                with xlakit.capture() as records:
                    wall[checks].append(timed(step, lambda: None, steps, warmup=0))
                execute[checks] += [r.timings.execute * 1e3 for r in records]
                cost[checks] = records[-1].cost
    finally:
        xlakit.config.checks = True
    (on, off), (on_x, off_x) = ((min(t[True]), min(t[False])) for t in (wall, execute))
    print(f"\n### In-graph checks on a Llama AdamW step ({cfg.num_hidden_layers} layers, hidden "
          f"{cfg.hidden_size}, vocab {cfg.vocab_size}, batch x seq {tuple(ids.shape)}; xlakit lazy, "
          f"best of {rounds} alternating rounds of {steps} steps)\n\n"
          "| checks | ms/step | execution ms |\n|---|---|---|\n"
          f"| on | {on:.1f} | {on_x:.1f} |\n| off | {off:.1f} | {off_x:.1f} |\n\n"
          f"cost of the checks: {100 * (on / off - 1):+.1f}% per step, {100 * (on_x / off_x - 1):+.1f}% of the "
          "execution")
    if cost[True] and cost[False]:
        print(f"XLA's cost analysis with the checks: "
              f"{100 * (cost[True].bytes_accessed / cost[False].bytes_accessed - 1):+.2f}% bytes accessed, "
              f"{100 * (cost[True].flops / cost[False].flops - 1):+.2f}% flops")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny models, few steps (a smoke run)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the torch peers run (JAX's peers and xlakit use JAX's default device)")
    args = parser.parse_args()
    gpu = args.device == "cuda"
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}, jax {jax.__version__} "
          f"on {jax.devices()[0].device_kind}"
          + (f", torch on {torch.cuda.get_device_name()}" if gpu else "") + "; float32 matmul precision: highest")
    torch.manual_seed(0)
    if args.quick:
        measure("MLP 2 x 64, batch 8, AdamW", mlp(64, 2), torch.randn(8, 64), torch.randn(8, 64), 3, True,
                args.device)
        # of the encoder's workload, what is not measure()'s code again: its JAX model, checked against torch
        step, wait = jax_peer(encoder(16, 1), torch.randn(2, 8, 16), torch.randn(2, 8, 16))
        step()
        wait()
        recompiles()
        memory(64, 2)
        checks_cost(quick=True)
        return
    measure("MLP 4 x 1024, batch 64, AdamW", mlp(), torch.randn(64, 1024), torch.randn(64, 1024),
            50 if gpu else 20, False, args.device)
    if gpu:  # large enough for tracing the next step to hide behind this one's execution
        measure("MLP 4 x 4096, batch 1024, AdamW", mlp(4096), torch.randn(1024, 4096), torch.randn(1024, 4096),
                20, False, args.device)
    measure("Transformer encoder 4 layers, d_model 256, seq 128, batch 16, AdamW", encoder(),
            torch.randn(16, 128, 256), torch.randn(16, 128, 256), 20 if gpu else 5, not gpu, args.device)
    recompiles()
    memory()
    checks_cost(quick=False)


if __name__ == "__main__":
    main()
