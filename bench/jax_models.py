"""The benchmark models written directly in JAX, for the plain jax.jit peer: the floor
with no framework at run time. Parameters come from the torch model's state_dict, and
`forward` is checked against the torch model once before timing."""
from __future__ import annotations

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
    weights = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // heads), axis=-1)
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
