"""Real models' training steps, all peers in one run, and cold start (issue: performance).

transformers' Llama (4 layers, hidden 256, 4 heads / 2 key-value heads, vocab 8000)
and GPT-2 (4 layers, hidden 256, 4 heads, vocab 8000), batch 8 x 128 tokens, an
AdamW step (loss = the model's own causal-LM loss). Peers: eager torch on CPU,
torch_xla 2.9 lazy, xlakit lazy (the default waiting step marker), xlakit
dispatching ahead, and the floor: the same model and AdamW written in JAX
(bench/jax_models.py, checked against the torch model's loss first) as one
donating jax.jit. Then cold start: a fresh process with an empty cache dir runs
two steps, and a second fresh process with the same dir runs them again.
Also torch.compile (inductor). `python bench/real_models.py [--quick] [--device cuda]`
(bench/gpu.sh runs the latter, with a bigger Llama).
"""
from __future__ import annotations

import argparse
import statistics
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial

os.environ.setdefault("PJRT_DEVICE", "CPU")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax_models  # noqa: E402
import step_split  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from timing import host_seconds_per_step, mark_step_ahead, seconds_per_step  # noqa: E402

torch.set_float32_matmul_precision("highest")
jax.config.update("jax_default_matmul_precision", "highest")
LR, BETAS, EPS, WEIGHT_DECAY = 1e-4, (0.9, 0.999), 1e-8, 1e-2


def llama(quick: bool):
    cfg = transformers.LlamaConfig(
        vocab_size=512 if quick else 8000, hidden_size=64 if quick else 256, intermediate_size=128 if quick else 688,
        num_hidden_layers=1 if quick else 4, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, attention_dropout=0.0)
    return transformers.LlamaForCausalLM(cfg), jax_models.llama_logits


def gpt2(quick: bool):
    cfg = transformers.GPT2Config(
        vocab_size=512 if quick else 8000, n_embd=64 if quick else 256, n_layer=1 if quick else 4, n_head=4,
        n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg), jax_models.gpt2_logits


def bigger_llama(quick: bool):
    """For a GPU (bench/gpu.sh): large enough that the device, not Python, sets the pace."""
    cfg = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
        num_key_value_heads=4, max_position_embeddings=512, attention_dropout=0.0)
    return transformers.LlamaForCausalLM(cfg), jax_models.llama_logits


MODELS = {"Llama": llama, "GPT-2": gpt2}
GPU_MODELS = {**MODELS, "Llama 8 x 1024": bigger_llama}


def build(name: str, quick: bool):
    torch.manual_seed(0)
    model, logits = GPU_MODELS[name](quick)
    model.config.use_cache = False
    ids = torch.randint(0, model.config.vocab_size, (2, 16) if quick else (8, 128))
    return model, logits, ids


def torch_peer(model, ids, device, after_step=lambda: None, wrap=lambda m: m, whole=lambda step: step,
               traced: list | None = None):
    """One AdamW step of a copy of `model` on `device`; `wrap` wraps the model (torch.compile of
    its forward), `whole` the step itself (torch.compile of forward, backward and optimizer).
    `traced`: where each step's seconds before `after_step` (a lazy peer's tracing) go."""
    model = copy.deepcopy(model).to(device)
    run = wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    ids = ids.to(device)

    def train(ids):
        opt.zero_grad()
        run(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    train = whole(train)

    def step():
        started = time.perf_counter()
        train(ids)
        if traced is not None:
            traced.append(time.perf_counter() - started)
        after_step()
    return step


def xlakit_compiled(train):
    """torch.compile of a whole training step on xlakit: its FX graphs join one executable."""
    return torch.compile(train, backend="xlakit")


def jax_peer(model, logits_fn, ids):
    """The same model and AdamW written in JAX, one donating jax.jit: XLA's own floor."""
    params, cfg = jax_models.trainable(model), model.config
    # 32-bit token ids and step count, as a JAX program has them (xlakit turns on JAX's
    # 64-bit mode for the whole process)
    idsj = jnp.asarray(ids.numpy().astype(np.int32))

    def loss(p):
        return jax_models.causal_lm_loss(logits_fn(p, idsj, cfg), idsj)

    with torch.no_grad():
        expected = model(input_ids=ids, labels=ids).loss.item()
    np.testing.assert_allclose(float(jax.jit(loss)(params)), expected, rtol=1e-4)

    def train_step(p, m, v, t):
        g = jax.grad(loss)(p)
        (b1, b2) = BETAS
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)

        def update(p, m, v):
            return p * (1 - LR * WEIGHT_DECAY) - LR * (m / (1 - b1 ** t)) / (jnp.sqrt(v / (1 - b2 ** t)) + EPS)
        return jax.tree.map(update, p, m, v), m, v

    train_step = jax.jit(train_step, donate_argnums=(0, 1, 2))
    state = {"p": params, "m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params),
             "t": 0}

    def step():
        state["t"] += 1
        state["p"], state["m"], state["v"] = train_step(state["p"], state["m"], state["v"], np.float32(state["t"]))
    return step, lambda: jax.block_until_ready(state["p"])


def floor_step(name: str, quick: bool):
    """One step of `name`'s JAX floor (its JAX model checked against the torch model's loss first)."""
    model, logits_fn, ids = build(name, quick)
    step, wait = jax_peer(model, logits_fn, ids)
    step()
    wait()


def peers(model, logits_fn, ids, device, quick: bool):
    import xlakit

    torch_wait = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    # quick: Dynamo with its "eager" backend; inductor's own kernel compiles (C++ here: 5 s, 19 s with an
    # empty inductor cache, as on a new CI machine) test torch, not this harness
    backend = "eager" if quick else "inductor"
    result = {"jax.jit (donating)": jax_peer(model, logits_fn, ids),
              "eager torch": (torch_peer(model, ids, device), torch_wait),
              f"torch.compile {backend}": (torch_peer(model, ids, device, wrap=partial(torch.compile, backend=backend)),
                                          torch_wait)}
    try:
        if device != "cpu":
            raise ImportError("torch_xla runs here on the CPU only")
        import torch_xla
        import torch_xla.core.xla_model as xm

        result["torch_xla lazy"] = (torch_peer(model, ids, torch_xla.device(), after_step=torch_xla.sync,
                                               traced=TRACED["torch_xla lazy"]), xm.wait_device_ops)
    except ImportError:  # torch_xla: the .venv column only (it needs torch 2.9)
        pass
    result["xlakit lazy"] = (torch_peer(model, ids, xlakit.device(), after_step=xlakit.mark_step,
                                        traced=TRACED["xlakit lazy"]), lambda: None)
    result[COMPILED] = (torch_peer(model, ids, xlakit.device(), whole=xlakit_compiled), xlakit.wait)
    result["xlakit lazy, dispatch ahead"] = (torch_peer(model, ids, xlakit.device(), after_step=mark_step_ahead),
                                             xlakit.wait)
    return result


COMPILED = "xlakit torch.compile, whole step"
# per lazy peer, each step's seconds of forward, backward and optimizer before its step marker
TRACED = {"torch_xla lazy": [], "xlakit lazy": []}
# a peer whose step returns at dispatch; torch_xla's sync on XLA:CPU returns after its executable
# ran (measured: its host time was its whole step), so its Python is bench/tracing.py's per op
ASYNC_PEERS = ("xlakit lazy, dispatch ahead",)
PROJECTED_DEVICE_MS = 2.0  # the Llama step's ~91 GFLOP on one TPU v5e chip is about a millisecond


def measure(name: str, quick: bool, device: str):
    """Every peer warmed up, then `rounds` rounds in which each peer runs `steps` steps in
    turn: on a machine shared with other work, each ratio is the median of its per-round
    ratios (peers next to each other in time), not of medians taken minutes apart."""
    import xlakit

    model, logits_fn, ids = build(name, quick)
    steps, rounds = (2, 1) if quick else (3, 5)
    all_peers = peers(model, logits_fn, ids, device, quick)
    for step, wait in all_peers.values():
        # warm-up: compiles, then the first runs of each new executable, which are slower
        # (xlakit's GPT-2 step: 476, 412, 355 ms, then 280 from the fourth run on)
        seconds_per_step(step, wait, 1, warmup=2 if quick else 8, rounds=1)
    times, records, host = {peer: [] for peer in all_peers}, [], {}
    for _ in range(rounds):
        for peer, (step, wait) in all_peers.items():
            with xlakit.capture() as captured:
                times[peer].append(seconds_per_step(step, wait, steps, warmup=0, rounds=1) * 1e3)
            if peer == "xlakit lazy":
                records = captured[-steps:]
    python = python_per_step(*all_peers["xlakit lazy"])
    if "torch_xla lazy" in all_peers:  # from an idle device: back to back, its tracing shares the CPU with its last step
        step, wait = all_peers["torch_xla lazy"]
        for _ in range(PYTHON_STEPS):
            wait()
            step()
        wait()
    for peer, (step, wait) in all_peers.items():
        if peer in ASYNC_PEERS:
            host[peer] = host_seconds_per_step(step, wait) * 1e3

    def ratio(peer, base):
        return statistics.median(t / b for t, b in zip(times[peer], times[base]))

    floor, torch_xla = "jax.jit (donating)", "torch_xla lazy" if "torch_xla lazy" in times else None
    print(f"\n### {name}: AdamW step, batch x seq {tuple(ids.shape)}, median ms/step of {rounds} rounds of "
          f"{steps} steps, every peer in each round; ratios: the median of per-round ratios\n\n"
          "| peer | ms/step | × torch_xla lazy | × jax.jit |\n|---|---|---|---|")
    for peer in times:
        by_torch_xla = f"{ratio(peer, torch_xla):.2f}" if torch_xla else "-"
        print(f"| {peer} | {statistics.median(times[peer]):.1f} | {by_torch_xla} | {ratio(peer, floor):.2f} |")
    if python:
        traced = TRACED["torch_xla lazy"][-PYTHON_STEPS:]
        xla = f"{statistics.median(traced) * 1e3:.1f}" if traced else "-"
        print(f"\nPython per step, median of {PYTHON_STEPS} steps, each from an idle device (xlakit: wall minus its "
              "records' execute, lower and compile; torch_xla: forward, backward and optimizer before its sync)\n\n"
              "| | ms/step |\n|---|---|\n"
              f"| torch_xla lazy, tracing | {xla} |\n| xlakit lazy, Python | {python['python']:.1f} |\n"
              f"| of it: recording (inside its __torch_dispatch__) | {python['recording']:.1f} |\n"
              f"| of it: the step marker (its own work) | {python['marker']:.1f} |\n"
              f"| of it: the rest (the model's and torch's own Python, partial syncs) | {python['rest']:.1f} |\n\n"
              f"xlakit's step: {python['executions']} executions, {python['replayed']} of {python['ops']} ops replayed")
    if records:
        print(f"\nxlakit lazy, per step: {records[-1].num_nodes} nodes; Python recording "
              f"{statistics.median(r.timings.trace for r in records) * 1e3:.1f} ms, execution (waited) "
              f"{statistics.median(r.timings.execute for r in records) * 1e3:.1f} ms; the rest of the step is the "
              "step marker's own work (cut, key, cache lookup, records) and Python's collector")
    # measured apart, a step at a time: its wall time next to its executables' own, its Python split
    step_split.print_split(COMPILED, step_split.compiled_step(
        lambda: torch_peer(model, ids, xlakit.device(), whole=xlakit_compiled), xlakit.wait, steps=steps * rounds))
    if host:
        print(f"\nPython per step (host time from an idle device to dispatch), and the step projected on an "
              f"accelerator whose executable takes {PROJECTED_DEVICE_MS:g} ms (dispatching ahead, the slower of "
              f"the two sets the pace)\n\n| peer | Python ms/step | projected ms/step | bound by |\n|---|---|---|---|")
        for peer, ms in host.items():
            bound = "Python" if ms > PROJECTED_DEVICE_MS else "device"
            print(f"| {peer} | {ms:.1f} | {max(ms, PROJECTED_DEVICE_MS):.1f} | {bound} |")


PYTHON_STEPS = 5


def python_per_step(step, wait) -> dict:
    """xlakit lazy's Python per step, median of PYTHON_STEPS steps: wall minus the executions'
    execute, lower and compile; of it, recording (Timings.trace), the step marker's own work
    (its wall minus its record's execute, lower and compile) and the rest."""
    import xlakit

    rows = []
    for _ in range(PYTHON_STEPS):
        wait()
        with xlakit.capture() as records:
            started = time.perf_counter()
            step()
            wall = time.perf_counter() - started
        device = sum(r.timings.execute + r.timings.lower + r.timings.compile for r in records)
        marker = records[-1].timings
        marker_s = wall - TRACED["xlakit lazy"][-1] - (marker.execute + marker.lower + marker.compile)
        recording = sum(r.timings.trace for r in records)
        rows.append({"python": wall - device, "recording": recording, "marker": marker_s,
                     "rest": wall - device - recording - marker_s, "executions": len(records),
                     "replayed": sum(r.replay.replayed for r in records if r.replay),
                     "ops": sum(r.replay.replayed + r.replay.recorded for r in records if r.replay)})
    return {k: statistics.median(r[k] for r in rows) * (1e3 if isinstance(rows[0][k], float) else 1)
            for k in rows[0]}


KINDS = ("lazy", "compiled")  # cold start: xlakit's lazy step, and the whole step under torch.compile


def cold_start_child(quick: bool, kinds: list[str]):
    """Run in a fresh process: for each of `kinds` in turn, the first two steps' executions (each
    sync) and wall times."""
    import xlakit

    report = {}
    for kind in kinds:
        model, _, ids = build("Llama", quick)
        walls = []
        with xlakit.capture() as records:
            t = time.perf_counter()
            step = torch_peer(model, ids, xlakit.device(), whole=xlakit_compiled, after_step=xlakit.wait) \
                if kind == "compiled" else torch_peer(model, ids, xlakit.device(), after_step=xlakit.mark_step)
            for _ in range(2):
                step()
                walls.append(time.perf_counter() - t)
                t = time.perf_counter()
        rows = [{"trigger": r.trigger, "nodes": r.num_nodes, "cache": r.cache, "trace": r.timings.trace,
                 "lower": r.timings.lower, "compile": r.timings.compile, "execute": r.timings.execute}
                for r in records]
        report[kind] = {"executions": rows, "walls": walls}
    print(json.dumps(report))


def two_processes(quick: bool, cache_dir: str, kinds: tuple[str, ...]) -> list[dict]:
    """cold_start_child's report from a fresh process with an empty `cache_dir`, then from a second."""
    env = dict(os.environ, XLAKIT_CACHE_DIR=cache_dir)
    argv = [sys.executable, __file__, "--cold-start-child", *kinds] + ["--quick"] * quick
    return [json.loads(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=True)
                       .stdout.strip().splitlines()[-1]) for _ in range(2)]


def cold_start(quick: bool):
    # each kind in processes of its own, its first process cold; the quick run's one pair of processes
    # runs both kinds: the same code, with two processes (their imports, ~10 s) fewer
    runs, cache_dirs = {kind: [] for kind in KINDS}, []
    with tempfile.TemporaryDirectory() as root:
        for kinds in [KINDS] if quick else [(kind,) for kind in KINDS]:
            cache_dirs.append(tempfile.mkdtemp(dir=root))
            for report in two_processes(quick, cache_dirs[-1], kinds):
                for kind in kinds:
                    runs[kind].append(report[kind])
        env = dict(os.environ, XLAKIT_CACHE_DIR=cache_dirs[0])
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import xlakit"], env=env, check=True)
        import_s = time.perf_counter() - started
    print("\n### Cold start: Llama's first two steps (moving the model included) in a fresh process, then in a "
          "second process with the same cache dir\n\n| process | execution | trigger | nodes | executable from | "
          "Python recording s | lowering s | XLA compile s | execution s |\n|---|---|---|---|---|---|---|---|---|")
    for label, run in zip(("first (empty cache)", "second (same cache dir)"), runs["lazy"]):
        for i, s in enumerate(run["executions"]):
            print(f"| {label} | {i + 1} | {s['trigger']} | {s['nodes']} | {s['cache']} | {s['trace']:.2f} | "
                  f"{s['lower']:.2f} | {s['compile']:.2f} | {s['execute']:.2f} |")
    for label, run in zip(("first", "second"), runs["lazy"]):
        print(f"\n{label} process: step 1 {run['walls'][0]:.2f} s, step 2 {run['walls'][1]:.2f} s wall")
    print(f"\n`python -c 'import xlakit'` (a whole process, torch and jax included): {import_s:.2f} s")
    print(f"\n### Cold start of {COMPILED}: Llama's first two calls, then a second process with the same cache "
          "dir\n\n| process | call 1 s | call 2 s | executions | compiled | loaded from disk | lowering s "
          "| XLA compile s |\n|---|---|---|---|---|---|---|---|")
    for label, run in zip(("first (empty cache)", "second (same cache dir)"), runs["compiled"]):
        done = run["executions"]
        print(f"| {label} | {run['walls'][0]:.2f} | {run['walls'][1]:.2f} | {len(done)} | "
              f"{sum(s['cache'] == 'miss' for s in done)} | {sum(s['cache'] == 'persistent_hit' for s in done)} | "
              f"{sum(s['lower'] for s in done):.2f} | {sum(s['compile'] for s in done):.2f} |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny models, few steps (a smoke run)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the torch peers run (JAX's peers and xlakit use JAX's default device)")
    parser.add_argument("--model", choices=GPU_MODELS, help="this model only (default: every model of the device)")
    parser.add_argument("--cold-start-child", nargs="+", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cold_start_child:
        return cold_start_child(args.quick, args.cold_start_child)
    import platform
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}, jax {jax.__version__}, "
          f"transformers {transformers.__version__}; float32 matmul precision: highest")
    cuda = args.device == "cuda"
    for name in [args.model] if args.model else ["Llama"] if args.quick else GPU_MODELS if cuda else MODELS:
        measure(name, args.quick, args.device)
    if not args.model:
        if args.quick:  # GPT-2's measure() is Llama's code again; its own parts are the builder and the JAX model
            floor_step("GPT-2", quick=True)
        cold_start(args.quick)


if __name__ == "__main__":
    main()
