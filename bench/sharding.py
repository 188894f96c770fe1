"""Training steps on one device and sharded over 8, in one run: ms per step, memory
per device and the collectives XLA inserted, per model and layout.

Layouts: one device; data parallel (the batch split over 8 devices, weights whole
on each); weights split too (xlakit.shard_module, FSDP style). Models: an MLP
(3 x 1024, batch 64), GPT-2 and Llama from small transformers configs (no
download). AdamW, float32 at full precision. On CPU the 8 devices are host
devices (XLA_FLAGS=--xla_force_host_platform_device_count=8) sharing the
machine's cores: the memory and collectives are what a TPU's 8 cores would hold
and exchange; the times say what the partitioned program costs on these cores.
`python bench/sharding.py [--quick]`.
"""
from __future__ import annotations

import argparse
import os
import platform

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from timing import median_seconds  # noqa: E402

import xlakit  # noqa: E402
from xlakit.notebook.units import human_bytes  # noqa: E402

torch.set_float32_matmul_precision("highest")


def mlp(width):
    torch.manual_seed(0)
    layers = [m for _ in range(3) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers[:-1])
    x, y = torch.randn(64, width), torch.randn(64, width)
    return model, (x, y), lambda m, b: F.mse_loss(m(b[0]), b[1])


def transformer(kind, width, layers, seq):
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=512, n_positions=seq, n_embd=width, n_layer=layers, n_head=8,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=width, intermediate_size=2 * width,
                                       num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                                       max_position_embeddings=seq)
        model = transformers.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 512, (16, seq))
    return model, {"input_ids": ids, "labels": ids}, lambda m, b: m(**b).loss


def run(build, layout, repeats):
    """(ms per step, the last step's record) of `layout`."""
    dev = xlakit.device()
    model, batch, loss_fn = build()
    model = model.to(dev)
    tensors = list(batch) if isinstance(batch, tuple) else list(batch.values())
    moved = [t.to(dev) for t in tensors]
    mesh = xlakit.Mesh((8,), ("data",))
    if layout != "one device":
        for t in moved:
            xlakit.mark_sharding(t, mesh, ("data",) + (None,) * (t.dim() - 1))
    if layout == "weights split":
        xlakit.shard_module(model, mesh, "data")
    batch = tuple(moved) if isinstance(batch, tuple) else dict(zip(batch, moved))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()
        xlakit.mark_step()

    seconds = median_seconds(step, xlakit.wait, repeats=repeats, warmup=3)
    record = xlakit.last_step()
    assert record.cache == "hit", record.cache
    return seconds * 1e3, record


def collectives(record) -> str:
    ops = {}
    for c in record.collectives:
        count, size = ops.get(c.op, (0, 0))
        ops[c.op] = (count + 1, size + c.nbytes)
    return ", ".join(f"{op} x{n} {human_bytes(size)}" for op, (n, size) in sorted(ops.items())) or "none"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small models, few steps: checks the harness runs")
    args = parser.parse_args()
    quick = args.quick
    models = {
        "MLP 3x1024": lambda: mlp(128 if quick else 1024),
        "GPT-2 (4 x 256, seq 64)": lambda: transformer("gpt2", 64 if quick else 256, 1 if quick else 4, 16 if quick
                                                       else 64),
        "Llama (4 x 256, seq 64)": lambda: transformer("llama", 64 if quick else 256, 1 if quick else 4,
                                                       16 if quick else 64),
    }
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores; jax {jax.__version__}, torch {torch.__version__}; "
          f"{len(jax.devices())} {jax.devices()[0].platform} devices\n")
    print("| model | layout | devices | ms/step | vs one device | peak per device | arguments per device | "
          "collectives (per device) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, build in models.items():
        base = None
        for layout in ("one device", "data parallel", "weights split"):
            ms, record = run(build, layout, repeats=3 if quick else 10)
            base = base or ms
            m = record.memory
            print(f"| {name} | {layout} | {m.devices} | {ms:.1f} | {ms / base:.2f} | {human_bytes(m.peak)} | "
                  f"{human_bytes(m.arguments)} | {collectives(record)} |", flush=True)


if __name__ == "__main__":
    main()
