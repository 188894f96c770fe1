"""xlakit's ops: how each aten op is handled and, where it lowers, its JAX function.

Why by hand: no maintained library lowers aten ops to JAX on the torch users
have (torchax 0.0.13, the only one, does not import on torch 2.13), and the
table is what decides xlakit's correctness, so it is ours and each entry is
checked against eager torch by the OpInfo sweep (xlakit/integrations/opinfo.py). Ops that
have no lowering here are replaced at record time by PyTorch's own
decompositions (torch._decomp) where it has one, and otherwise run eagerly on
CPU (each op's registration says how it is handled).

A lowering is a function of the op's schema arguments, by the schema's names,
with every tensor (and lifted scalar) replaced by a jax array; it returns a
jax array or a tuple of them (None for outputs the op was asked not to
compute). The caller (to_jax.py) casts each result to the dtype torch's
meta kernel gives and checks its shape, so a lowering may compute in any dtype
that gives torch's values. `promote=True` (elementwise ops): array arguments
arrive already cast to the dtype torch computes in (`computation_dtype`);
`opmath_scalar` names the argument that eager's float16 / bfloat16 kernel reads,
when it is 0-d (a Python number or a 0-d tensor), in float32 unrounded
(TensorIterator's `original_scalar_value<opmath_t>`, addcmul's
`value.to<float>()`): that operand arrives in float32, not in the computation dtype.

The one table, its registration decorators and lookups live in registry.py
(an op's lowering, policy, guard, decomposition: one registration, where its
code is); dtypes in dtypes.py; the families in the submodules imported below,
each registering its ops, xlakit's own decompositions in decompositions.py.
verdicts.py holds the run-time verdicts (NeedsEager, FAILED); to_jax.py lowers
a whole graph through the table, eager.py computes a node in eager torch instead.

Imports: core.
"""
from __future__ import annotations

from . import (  # noqa: F401 (they register)
               activations,
               asserts,
               bessel,
               decompositions,
               factories,
               grouped_mm,
               indexing,
               linalg,
               nn,
               pointwise,
               reductions,
               shapes,
               special,
)
from .dtypes import XLA_DTYPES, computation_dtype, jax_dtype, torch_dtype  # noqa: F401
from .registry import TABLE, Entry, Lowering, find, lowers  # noqa: F401
