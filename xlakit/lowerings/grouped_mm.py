"""Grouped matrix products (`torch._grouped_mm`, `torch.nn.functional.grouped_mm`): a
mixture of experts' tokens sorted by expert times each expert's weights.

Lowered to `jax.lax.ragged_dot` / `ragged_dot_general`: the group sizes are a
run-time array and every shape is static, so a new routing of the tokens never
recompiles. JAX differentiates nothing here: torch's autograd formula for
`_grouped_mm` is `_grouped_mm` again on transposed operands (the 2-D x 2-D layout
gives the weights' gradient), so the four layouts eager CPU takes are lowered:

    self       mat2        offs  result       group g
    (M, K)     (G, K, N)   (G,)  (M, N)       rows [offs[g-1], offs[g]) of self times mat2[g]
    (M, K)     (K, N)      (G,)  (G, M, N)    columns [offs[g-1], offs[g]) of self times those rows of mat2
    (G, M, K)  (K, N)      (G,)  (M, N)       self[g] times columns [offs[g-1], offs[g]) of mat2
    (G, M, K)  (G, K, N)   None  (G, M, N)    self[g] times mat2[g] (a batched product)

`offs` holds each group's end (int32, cumulative). Rows (or columns) past
`offs[-1]` are zero here; eager's kernel leaves them unwritten, so their values
are undefined there. Offsets that decrease or pass the grouped dimension make
eager read out of bounds; here they are checked in the step's executable
(core/checks.py) and raise after it.

torch's meta kernel for `_grouped_mm` is the CUDA kernel's (bfloat16 only, with
16-byte stride alignment), so its shapes and dtypes come from `_meta` here,
which checks what eager CPU checks (float32, bfloat16 and float16; out_dtype, if
given, the inputs' dtype; no bias) and not the alignment, which no XLA
buffer needs. float16 and bfloat16 products accumulate in float32, as eager's.

Under torch.compile, transformers' mixture-of-experts layers call their own custom op
for weights not in bfloat16 (inductor compiles `_grouped_mm` for bfloat16 only):
`transformers::grouped_mm_fallback`, a loop of `mm`s over the groups the (M, K) x
(G, K, N) layout makes, and its backward op. They are these products, lowered so:
left to eager CPU, each split a compiled MoE graph in two. Their shapes come from
transformers' own fake kernels.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ..core import checks
from .registry import lowers

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_OFFSETS = ("_grouped_mm: offs must be non-decreasing group ends within the grouped dimension of size {size}; "
            "got {{index}}. Compute them as torch.cumsum(counts, 0, dtype=torch.int32) of non-negative counts")


def _meta(self, mat2, offs=None, bias=None, out_dtype=None):
    """Eager CPU's checks (its messages) and the output, a contiguous meta tensor."""
    torch._check(self.dtype in _DTYPES,
                 lambda: f"Expected mat_a to be Float32, BFloat16 or Float16 matrix, got {self.dtype}")
    torch._check(mat2.dtype in _DTYPES,
                 lambda: f"Expected mat_b to be Float32, BFloat16 or Float16 matrix, got {mat2.dtype}")
    torch._check(mat2.dtype == self.dtype, lambda: f"expected m1 and m2 to have the same dtype, but got: "
                                                   f"{self.dtype} != {mat2.dtype}")
    torch._check(self.dim() in (2, 3), lambda: "mat_a has to be 2 or 3d")
    torch._check(mat2.dim() in (2, 3), lambda: "mat_b has to be 2 or 3d")
    torch._check((offs is not None) == (self.dim() == 2 or mat2.dim() == 2),
                 lambda: "Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d")
    torch._check(self.shape[-1] == mat2.shape[-2], lambda: "contraction dimension of mat_a and mat_b must match")
    if offs is not None:
        torch._check(offs.dim() == 1, lambda: "offs has to be 1D")
        torch._check(offs.dtype == torch.int32, lambda: "Offsets have to be int32")
    torch._check(bias is None, lambda: "Bias not supported yet")
    torch._check(out_dtype is None or out_dtype == self.dtype,
                 lambda: "Grouped gemm output dtype must match `mat_a` dtype")
    if self.dim() == 2 and mat2.dim() == 2:
        shape = (offs.shape[0], self.shape[0], mat2.shape[1])
    elif self.dim() == 2:
        torch._check(offs.shape[0] == mat2.shape[0], lambda: "matrix batch sizes have to match")
        shape = (self.shape[0], mat2.shape[2])
    elif mat2.dim() == 2:
        torch._check(offs.shape[0] == self.shape[0], lambda: "matrix batch sizes have to match")
        shape = (self.shape[1], mat2.shape[1])
    else:
        torch._check(self.shape[0] == mat2.shape[0], lambda: "batched dimension has to match")
        shape = (self.shape[0], self.shape[1], mat2.shape[2])
    return torch.empty(shape, dtype=self.dtype, device="meta")


def _group_sizes(offs, size: int):
    """Each group's size from its end, after eager's (in-graph) check that the ends
    rise and stay within the grouped dimension."""
    sizes = jnp.diff(offs, prepend=jnp.zeros((1,), offs.dtype))
    checks.require((sizes >= 0) & (offs <= size), RuntimeError, _OFFSETS.format(size=size), index=offs)
    return sizes


@lowers("aten::_grouped_mm", meta=_meta)
def grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    # half types: products of their values are exact in float32, where eager sums them too
    # (XLA's CPU dot has no bfloat16 x bfloat16 -> float32 for every layout)
    self, mat2 = self.astype(jnp.float32), mat2.astype(jnp.float32)
    if offs is None:  # (G, M, K) x (G, K, N)
        return jnp.matmul(self, mat2)
    if self.ndim == 2 and mat2.ndim == 3:  # rows of self grouped: a ragged non-contracting dimension
        return lax.ragged_dot(self, mat2, _group_sizes(offs, self.shape[0]))
    if self.ndim == 2:  # the contracted dimension grouped: one product per group
        numbers = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(((1,), (0,)), ((), ())),
                                                lhs_ragged_dimensions=[1], rhs_group_dimensions=[])
        return lax.ragged_dot_general(self, mat2, _group_sizes(offs, self.shape[1]), numbers)
    # columns of mat2 grouped: transposed, they are the ragged rows of mat2.T times self[g].T
    return lax.ragged_dot(mat2.T, jnp.swapaxes(self, 1, 2), _group_sizes(offs, mat2.shape[1])).T


@lowers("transformers::grouped_mm_fallback")
def transformers_grouped_mm(input, weight, offs):
    """Rows [offs[g-1], offs[g]) of input times weight[g]; rows past offs[-1] zero (as the op's)."""
    return grouped_mm(input, weight, offs)


@lowers("transformers::grouped_mm_fallback_backward")
def transformers_grouped_mm_backward(input, weight, offs, grad_output):
    """The input's gradient (each group's rows of grad_output times weight[g].T) and the
    weights' (each group's rows of input, transposed, times those of grad_output); zero
    for a group with no rows, as the op's."""
    return (grouped_mm(grad_output, jnp.swapaxes(weight, 1, 2), offs),
            grouped_mm(input.T, grad_output, offs))
