"""Elementwise ops: arithmetic, comparisons, logic, math and special functions,
activations and their backward ops."""
from __future__ import annotations

import jax.numpy as jnp

from . import lowers


def _with_value(combine):
    """addcmul / addcdiv: `value` is a lifted 0-d input (a new learning rate
    must not recompile), cast to the operands' dtype as torch computes."""
    def lowering(self, tensor1, tensor2, *, value=1):
        return self + jnp.asarray(value).astype(self.dtype) * combine(tensor1, tensor2)
    return lowering


lowers("aten::addcmul", promote=True)(_with_value(jnp.multiply))
lowers("aten::addcdiv", promote=True)(_with_value(jnp.divide))
