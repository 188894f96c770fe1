"""The benchmark models written directly in JAX, for the plain jax.jit peer: the floor
with no framework at run time. Parameters come from the torch model's state_dict, and
`forward` is checked against the torch model once before timing."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch.nn as nn


def _linear(p, name, x):
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def _layer_norm(p, name, x, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * p[f"{name}.weight"] + p[f"{name}.bias"]


def _attention(p, name, x, heads):
    batch, seq, d = x.shape
    qkv = x @ p[f"{name}.in_proj_weight"].T + p[f"{name}.in_proj_bias"]
    q, k, v = (t.reshape(batch, seq, heads, d // heads).transpose(0, 2, 1, 3) for t in jnp.split(qkv, 3, -1))
    weights = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads), axis=-1)
    out = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, seq, d)
    return _linear(p, f"{name}.out_proj", out)


def mlp_forward(p, x):
    linears = sorted({int(k.split(".")[0]) for k in p})
    for i in linears:
        x = _linear(p, str(i), x)
        if i != linears[-1]:
            x = jax.nn.relu(x)
    return x


def encoder_forward(p, x, layers, heads):
    # nn.TransformerEncoderLayer's defaults: post-norm, ReLU, eps 1e-5
    for i in range(layers):
        name = f"layers.{i}"
        x = _layer_norm(p, f"{name}.norm1", x + _attention(p, f"{name}.self_attn", x, heads))
        hidden = jax.nn.relu(_linear(p, f"{name}.linear1", x))
        x = _layer_norm(p, f"{name}.norm2", x + _linear(p, f"{name}.linear2", hidden))
    return x


def extract(model: nn.Module):
    """(params as jax arrays, forward(params, x)) for the benchmarks' two models."""
    params = {k: jnp.asarray(v.detach().numpy()) for k, v in model.state_dict().items()}
    if isinstance(model, nn.TransformerEncoder):
        layer = model.layers[0]
        return params, lambda p, x: encoder_forward(p, x, len(model.layers), layer.self_attn.num_heads)
    return params, mlp_forward


# -- transformers' Llama and GPT-2, written in JAX (the floor of bench/real_models.py) --
def _rms_norm(w, x, eps):
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _causal_attention(q, k, v):
    """q, k, v: (batch, heads, seq, head_dim); softmax in float32 as transformers does."""
    seq, dim = q.shape[2], q.shape[3]
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dim)
    scores = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), scores, jnp.finfo(scores.dtype).min)
    batch, heads = q.shape[:2]
    return (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(batch, seq, heads * dim)


def _heads(x, n):
    batch, seq, width = x.shape
    return x.reshape(batch, seq, n, width // n).transpose(0, 2, 1, 3)


def llama_logits(p, ids, cfg):
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    dim = cfg.hidden_size // heads
    inv_freq = 1.0 / cfg.rope_parameters["rope_theta"] ** (np.arange(0, dim, 2) / dim) \
        if hasattr(cfg, "rope_parameters") else 1.0 / cfg.rope_theta ** (np.arange(0, dim, 2) / dim)
    angles = np.arange(ids.shape[1])[:, None] * inv_freq[None]
    cos, sin = (jnp.asarray(np.concatenate([f(angles)] * 2, -1), jnp.float32) for f in (np.cos, np.sin))

    def rotate(x):  # transformers' rotate_half
        half = x.shape[-1] // 2
        return x * cos + jnp.concatenate([-x[..., half:], x[..., :half]], -1) * sin

    x = p["model.embed_tokens.weight"][ids]
    for i in range(cfg.num_hidden_layers):
        name = f"model.layers.{i}"
        h = _rms_norm(p[f"{name}.input_layernorm.weight"], x, cfg.rms_norm_eps)
        q, k, v = (_heads(h @ p[f"{name}.self_attn.{m}_proj.weight"].T, n)
                   for m, n in (("q", heads), ("k", kv_heads), ("v", kv_heads)))
        k, v = (jnp.repeat(t, heads // kv_heads, axis=1) for t in (rotate(k), v))
        x = x + _causal_attention(rotate(q), k, v) @ p[f"{name}.self_attn.o_proj.weight"].T
        h = _rms_norm(p[f"{name}.post_attention_layernorm.weight"], x, cfg.rms_norm_eps)
        gate, up = (h @ p[f"{name}.mlp.{m}_proj.weight"].T for m in ("gate", "up"))
        x = x + (jax.nn.silu(gate) * up) @ p[f"{name}.mlp.down_proj.weight"].T
    x = _rms_norm(p["model.norm.weight"], x, cfg.rms_norm_eps)
    return x @ p["lm_head.weight"].T


def gpt2_logits(p, ids, cfg):
    x = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"][: ids.shape[1]]
    for i in range(cfg.n_layer):
        name = f"transformer.h.{i}"
        h = _layer_norm(p, f"{name}.ln_1", x, cfg.layer_norm_epsilon)
        qkv = h @ p[f"{name}.attn.c_attn.weight"] + p[f"{name}.attn.c_attn.bias"]  # Conv1D: (in, out)
        q, k, v = (_heads(t, cfg.n_head) for t in jnp.split(qkv, 3, -1))
        x = x + _causal_attention(q, k, v) @ p[f"{name}.attn.c_proj.weight"] + p[f"{name}.attn.c_proj.bias"]
        h = _layer_norm(p, f"{name}.ln_2", x, cfg.layer_norm_epsilon)
        h = jax.nn.gelu(h @ p[f"{name}.mlp.c_fc.weight"] + p[f"{name}.mlp.c_fc.bias"], approximate=True)
        x = x + h @ p[f"{name}.mlp.c_proj.weight"] + p[f"{name}.mlp.c_proj.bias"]
    x = _layer_norm(p, "transformer.ln_f", x, cfg.layer_norm_epsilon)
    return x @ p["transformer.wte.weight"].T  # tied to the token embedding


def causal_lm_loss(logits, ids):
    """transformers' loss with labels = input_ids: each token predicts the next."""
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    # a one-hot product, not take_along_axis: its gradient is then a fused multiply, not
    # a scatter, which XLA's CPU backend runs element by element (2x slower step here)
    return -(logp * jax.nn.one_hot(ids[:, 1:], logits.shape[-1], dtype=logp.dtype)).sum(-1).mean()


def trainable(model: nn.Module) -> dict:
    """A model's parameters as jax arrays, one per parameter (tied ones once, by their first name)."""
    return {name: jnp.asarray(p.detach().numpy()) for name, p in model.named_parameters()}
