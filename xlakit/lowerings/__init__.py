"""xlakit's own aten -> JAX lowering table: one entry per aten op.

Why by hand: no maintained library lowers aten ops to JAX on the torch users
have (torchax 0.0.13, the only one, does not import on torch 2.13), and the
table is what decides xlakit's correctness, so it is ours and each entry is
checked against eager torch by the OpInfo sweep (xlakit.opinfo). Ops that
have no entry here are replaced at record time by PyTorch's own
decompositions (torch._decomp) where it has one, and otherwise run eagerly on
CPU (ops.py says how each op is handled).

An entry is a function of the op's schema arguments, by the schema's names,
with every tensor (and lifted scalar) replaced by a jax array; it returns a
jax array or a tuple of them (None for outputs the op was asked not to
compute). The caller (lowering.py) casts each result to the dtype torch's
meta kernel gives and checks its shape, so an entry may compute in any dtype
that gives torch's values. `promote=True` (elementwise ops): array arguments
arrive already cast to the dtype torch computes in (`computation_dtype`);
`opmath_scalar` names the argument that eager's float16 / bfloat16 kernel reads,
when it is 0-d (a Python number or a 0-d tensor), in float32 unrounded
(TensorIterator's `original_scalar_value<opmath_t>`, addcmul's
`value.to<float>()`): that operand arrives in float32, not in the computation dtype.

Keys: "aten::add" (every overload) or "aten::add.Tensor" (that overload,
which wins). The families live in the submodules below.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
import torch


@dataclasses.dataclass(frozen=True, slots=True)
class Lowering:
    fn: Callable
    promote: bool = False
    opmath_scalar: str = ""


TABLE: dict[str, Lowering] = {}


def lowers(*names: str, promote: bool = False, opmath_scalar: str = ""):
    """Register the decorated function as the lowering of `names`."""
    def register(fn):
        for name in names:
            if name in TABLE:
                raise ImportError(f"xlakit internal error: two lowerings of {name}")
            TABLE[name] = Lowering(fn, promote, opmath_scalar)
        return fn
    return register


def find(op) -> Lowering | None:
    """The lowering of one op overload, or None."""
    name = op._schema.name
    return TABLE.get(f"{name}.{op._overloadname}") or TABLE.get(name)


# -- dtypes -------------------------------------------------------------------------
_TORCH_TO_JAX = {
    torch.float32: jnp.float32, torch.float64: jnp.float64, torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16, torch.int64: jnp.int64, torch.int32: jnp.int32,
    torch.int16: jnp.int16, torch.int8: jnp.int8, torch.uint8: jnp.uint8, torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64, torch.complex128: jnp.complex128,
}
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


from . import factories, indexing, linalg, nn, pointwise, reductions, shapes  # noqa: E402,F401  (they register)
