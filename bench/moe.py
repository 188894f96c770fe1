"""A mixture-of-experts training step, all peers in one run (issue: moe).

transformers' Mixtral (4 layers, hidden 256, 8 experts, top-2, vocab 8000), an AdamW step on
its causal-LM loss plus the router's load-balancing loss, batch 4 x 128 tokens. Peers: eager
torch on CPU, torch_xla 2.9 lazy, xlakit lazy with transformers' "grouped_mm" experts (its
default: `torch._grouped_mm`, a ragged dot here) and with "batched_mm" (torch_xla too: a
peer that cannot run the model says why in its row). Then one MoE layer
(Mixtral's sparse block: router, top-2, experts), forward and backward, next to the same
layer written in JAX with `jax.lax.ragged_dot` as one jax.jit: the floor. Compiles per step
are counted after the warm-up (a peer that recompiles as the routing changes shows it).
`python bench/moe.py [--quick]`.
"""
from __future__ import annotations

import argparse
import copy
import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from real_models import torch_peer  # noqa: E402
from timing import seconds_per_step  # noqa: E402

torch.set_float32_matmul_precision("highest")
jax.config.update("jax_default_matmul_precision", "highest")
transformers.logging.set_verbosity_error()


def mixtral(quick: bool, implementation: str):
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(
        vocab_size=512 if quick else 8000, hidden_size=64 if quick else 256, intermediate_size=128 if quick else 512,
        num_hidden_layers=1 if quick else 4, num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
        num_experts_per_tok=2, max_position_embeddings=128, output_router_logits=True, use_cache=False,
        experts_implementation=implementation)
    return transformers.MixtralForCausalLM(cfg)


class Compiles:
    """Executables compiled so far, per peer (0 where a peer cannot say)."""

    @staticmethod
    def xlakit() -> int:
        import xlakit
        return xlakit.metrics()["compiles"]

    @staticmethod
    def torch_xla() -> int:
        import torch_xla.debug.metrics as met
        data = met.metric_data("CompileTime")
        return data[0] if data else 0


def model_peers(quick: bool):
    """name -> (step, wait, compiles so far)."""
    ids = torch.randint(0, 512 if quick else 8000, (2, 16) if quick else (4, 128))

    def peer(implementation, device, after_step=lambda: None):
        return torch_peer(mixtral(quick, implementation), ids, device, after_step=after_step)  # real_models' AdamW step

    peers = {"eager torch (grouped_mm)": (peer("grouped_mm", "cpu"), lambda: None, lambda: 0)}
    # quick: xlakit's batched_mm model (two XLA compiles, ~4 s) is the layer table's peer code again
    return _lazy_peers(peers, peer, xlakit_implementations=("grouped_mm",) if quick else IMPLEMENTATIONS)


IMPLEMENTATIONS = ("grouped_mm", "batched_mm")  # the experts implementations with static shapes


def _lazy_peers(peers: dict, peer, xlakit_implementations=IMPLEMENTATIONS) -> dict:
    """torch_xla's peers, with either experts implementation, and xlakit's with `xlakit_implementations`."""
    import xlakit
    for implementation in IMPLEMENTATIONS:
        try:
            import torch_xla
            import torch_xla.core.xla_model as xm
            peers[f"torch_xla lazy ({implementation})"] = (peer(implementation, torch_xla.device(), torch_xla.sync),
                                                           xm.wait_device_ops, Compiles.torch_xla)
        except ImportError:  # torch_xla needs torch 2.9: the .venv column only
            pass
    for implementation in xlakit_implementations:
        peers[f"xlakit lazy ({implementation})"] = (peer(implementation, xlakit.device(), xlakit.mark_step),
                                                    lambda: None, Compiles.xlakit)
    return peers


# -- one MoE layer, and the same layer in JAX -------------------------------------------------
def jax_moe_layer(top_k: int):
    """Mixtral's sparse block in JAX (tokens sorted by expert, ragged dots), and its loss."""
    def layer(params, x):
        logits = x @ params["gate"].T
        probs = jax.nn.softmax(logits, axis=-1)
        weights, experts = jax.lax.top_k(probs, top_k)
        weights = weights / weights.sum(-1, keepdims=True)
        flat = experts.reshape(-1)
        order = jnp.argsort(flat, stable=True)
        sizes = jnp.bincount(flat, length=params["gate"].shape[0]).astype(jnp.int32)
        tokens = x[order // top_k]
        gate_up = jax.lax.ragged_dot(tokens, jnp.swapaxes(params["gate_up"], 1, 2), sizes)
        gate, up = jnp.split(gate_up, 2, axis=-1)
        out = jax.lax.ragged_dot(jax.nn.silu(gate) * up, jnp.swapaxes(params["down"], 1, 2), sizes)
        out = out * weights.reshape(-1)[order][:, None]
        unsorted = jnp.zeros_like(out).at[order].set(out)
        return unsorted.reshape(x.shape[0], top_k, -1).sum(1)

    def loss(params, x):
        return (layer(params, x) ** 2).mean()
    return layer, loss


def layer_peers(quick: bool):
    model = mixtral(quick, "grouped_mm")
    block = model.model.layers[0].mlp
    x = torch.randn(256 if quick else 512, model.config.hidden_size)
    params = {"gate": block.gate.weight, "gate_up": block.experts.gate_up_proj, "down": block.experts.down_proj}
    jparams = {k: jnp.asarray(v.detach().numpy()) for k, v in params.items()}
    layer, loss = jax_moe_layer(model.config.num_experts_per_tok)
    with torch.no_grad():
        want = block(x[None]).numpy()[0]
    np.testing.assert_allclose(np.asarray(jax.jit(layer)(jparams, jnp.asarray(x.numpy()))), want, rtol=1e-4,
                               atol=1e-5)
    grad = jax.jit(jax.grad(loss))
    jx = jnp.asarray(x.numpy())
    state = {}

    def jax_step():
        state["g"] = grad(jparams, jx)
    peers = {"jax.jit ragged_dot, the floor": (jax_step, lambda: jax.block_until_ready(state["g"]), lambda: 0)}

    def peer(implementation, device, after_step=lambda: None):
        copy_ = copy.deepcopy(block).to(device)
        copy_.experts.config._experts_implementation = implementation
        inputs = x[None].to(device)

        def step():
            copy_.zero_grad()
            (copy_(inputs) ** 2).mean().backward()
            after_step()
        return step
    peers["eager torch (grouped_mm)"] = (peer("grouped_mm", "cpu"), lambda: None, lambda: 0)
    return _lazy_peers(peers, peer), tuple(x.shape)


def table(title: str, peers: dict, quick: bool):
    steps, rounds, warmup = (2, 1, 2) if quick else (3, 3, 3)
    rows = {}
    for name, (step, wait, compiles) in peers.items():
        try:
            for _ in range(warmup):
                step()
            wait()
        except Exception as e:  # noqa: BLE001 - a peer that cannot run this model says why in its row
            rows[name] = f"fails: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
            continue
        before = compiles()
        ms = seconds_per_step(step, wait, steps, warmup=0, rounds=rounds) * 1e3
        rows[name] = (ms, (compiles() - before) / (steps * rounds))
    first, (floor, _) = next(iter(rows.items()))
    print(f"\n### {title}\n\n| peer | ms/step | × {first} | compiles per step after {warmup} warm-up steps |"
          "\n|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row} | | |" if isinstance(row, str) else
              f"| {name} | {row[0]:.1f} | {row[0] / floor:.2f} | {row[1]:g} |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny model, few steps (a smoke run)")
    args = parser.parse_args()
    import platform
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}, jax {jax.__version__}, "
          f"transformers {transformers.__version__}; float32 matmul precision: highest")
    peers, shape = layer_peers(args.quick)
    table(f"Mixtral's MoE layer alone, {shape[0]} tokens x hidden {shape[1]}, 8 experts, top-2: forward and "
          "backward of mean(out²)", peers, args.quick)
    table("Mixtral 4 layers, hidden 256, 8 experts, top-2, vocab 8000: AdamW step, batch 4 x 128"
          if not args.quick else "Mixtral (quick)", model_peers(args.quick), args.quick)


if __name__ == "__main__":
    main()
