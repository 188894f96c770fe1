"""Reductions and scans: sum, mean, max/min, var/std, norms, cumulative ops,
sort and top-k."""
from __future__ import annotations

import jax.numpy as jnp

from . import jax_dtype, lowers


@lowers("aten::linalg_vector_norm")
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    # dim 0 or -1 of a 0-d tensor is the tensor itself (found by xlakit.opinfo: masked.norm)
    axis = None if not dim or x.ndim == 0 else tuple(d % x.ndim for d in dim)
    magnitude = jnp.abs(x)
    if ord == float("inf"):
        return magnitude.max(axis=axis, keepdims=keepdim)
    if ord == float("-inf"):
        return magnitude.min(axis=axis, keepdims=keepdim)
    if ord == 0:
        return (x != 0).sum(axis=axis, keepdims=keepdim).astype(x.dtype)
    return (magnitude ** ord).sum(axis=axis, keepdims=keepdim) ** (1.0 / ord)
