"""torch dtypes in JAX's words, and the dtype torch computes an elementwise op in."""
from __future__ import annotations

import jax.numpy as jnp
import torch

from ..core.ir import FLOAT8

_TORCH_TO_JAX = {
    torch.float32: jnp.float32, torch.float64: jnp.float64, torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16, torch.int64: jnp.int64, torch.int32: jnp.int32,
    torch.int16: jnp.int16, torch.int8: jnp.int8, torch.uint8: jnp.uint8, torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64, torch.complex128: jnp.complex128,
    torch.uint16: jnp.uint16, torch.uint32: jnp.uint32, torch.uint64: jnp.uint64,
}
_TORCH_TO_JAX.update({dtype: getattr(jnp, str(dtype).removeprefix("torch.")) for dtype in FLOAT8
                      if hasattr(jnp, str(dtype).removeprefix("torch."))})
_JAX_TO_TORCH = {jnp.dtype(j): t for t, j in _TORCH_TO_JAX.items()}
XLA_DTYPES = frozenset(_TORCH_TO_JAX)


def jax_dtype(dtype: torch.dtype):
    try:
        return _TORCH_TO_JAX[dtype]
    except KeyError:
        raise TypeError(f"xlakit: dtype {dtype} has no XLA equivalent") from None


def torch_dtype(dtype) -> torch.dtype:
    return _JAX_TO_TORCH[jnp.dtype(dtype)]


def category(dtype) -> int:
    """torch's promotion category of a jax (or numpy) dtype: 0 bool, 1 integer,
    2 floating, 3 complex."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bool_:
        return 0
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return 3
    return 2 if jnp.issubdtype(dtype, jnp.floating) else 1


def _category(dtype: torch.dtype) -> int:
    return category(jax_dtype(dtype))


def computation_dtype(arrays, out_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype torch computes an elementwise op in: torch's promotion of its
    tensor operands (a 0-d tensor, as a lifted scalar is, gives way to a
    dimensioned one of the same category: jnp's promotion has no such rule),
    raised to the output's category where the op makes floats of integers."""
    dimensioned = [torch_dtype(a.dtype) for a in arrays if a.ndim > 0]
    zero_dim = [torch_dtype(a.dtype) for a in arrays if a.ndim == 0]
    common = _promote(dimensioned) if dimensioned else None
    if zero_dim:
        scalar = _promote(zero_dim)
        if common is None or _category(scalar) > _category(common):
            common = scalar
    if out_dtype is not None and _category(out_dtype) > _category(common):
        return out_dtype
    return common


def _promote(dtypes: list[torch.dtype]) -> torch.dtype:
    result = dtypes[0]
    for dtype in dtypes[1:]:
        result = torch.promote_types(result, dtype)
    return result
