"""xlakit's own decompositions: ops replaced at record time by a function of
ours in aten ops, each registered with its reason, and the ops that take
PyTorch's decomposition instead of a lowering.
"""
from __future__ import annotations

import torch
import torch._decomp

from .registry import Handling, decomposes, handled_as

_BATCH_NORM = "PyTorch's decomposition, with eval-mode statistics as eager CPU returns them"
handled_as(Handling.DECOMPOSED, "aten::_native_batch_norm_legit_no_training", reason=_BATCH_NORM)


@decomposes("aten::native_batch_norm", "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit_functional",
            reason=_BATCH_NORM)
def _batch_norm_stats_as_on_cpu(op):
    """PyTorch's batch norm decomposition returns, in eval mode on a non-CPU
    device, the running statistics as save_mean / save_invstd (as CUDA does);
    eager CPU, xlakit's reference, returns empty tensors (found by xlakit.opinfo).
    Eval-mode backward reads the running statistics, never these."""
    decomposition = torch._decomp.decomposition_table[op]
    names = [a.name for a in op._schema.arguments]
    if "training" not in names:
        return decomposition
    position = names.index("training")

    def run(*args, **kwargs):
        # (output, save_mean, save_invstd), and the new running statistics in the functional variant
        outputs = decomposition(*args, **kwargs)
        training = args[position] if len(args) > position else kwargs["training"]
        if training:
            return outputs
        empty = outputs[0].new_zeros((0,))
        return (outputs[0], empty, empty, *outputs[3:])
    return run


@decomposes("aten::allclose", reason="returns a Python bool and its meta kernel calls .item(): torch's isclose "
                                     "in lowered ops, then one read of the bool")
def _allclose(op):
    """allclose returns a Python bool and its meta kernel calls .item(): torch's
    isclose, in ops that lower, then one read of the bool (a sync, as in eager)."""
    def run(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        if self.dtype != other.dtype:
            raise RuntimeError(f"allclose: expected both inputs to be of the same dtype, "
                               f"got {self.dtype} and {other.dtype}")
        close = self == other
        if equal_nan and (self.is_floating_point() or self.is_complex()):
            close = close | (self.isnan() & other.isnan())
        if rtol != 0 or atol != 0:
            if self.dtype == torch.bool:
                self, other = self.to(torch.get_default_dtype()), other.to(torch.get_default_dtype())
            allowed = (other * rtol).abs() + atol
            actual = (self - other).abs()
            close = close | (actual.isfinite() & (actual <= allowed))
        return bool(torch.ops.aten._local_scalar_dense.default(close.all()))
    return run


@decomposes("aten::_weight_norm_interface_backward",
            reason="no lowering and no meta kernel: eager CPU's formula in aten ops")
def _weight_norm_interface_backward(op):
    """weight_norm's fused backward has no lowering and no meta kernel (found by
    Wav2Vec2's positional convolution: every step fell back to CPU). Eager
    CPU's formula, in aten ops: with s = sum of grad_w * v over all dims but
    `dim`, grad_g = s / norm and grad_v = (g / norm) * (grad_w - v * s / norm^2)."""
    def run(grad_w, saved_v, saved_g, saved_norms, dim):
        dim = dim % saved_v.dim()
        norms = saved_norms.to(saved_g.dtype)
        others = [d for d in range(saved_v.dim()) if d != dim]
        sums = (grad_w * saved_v).sum(others, keepdim=True) if others else grad_w * saved_v
        grad_g = sums / norms
        grad_v = (saved_g / norms) * (grad_w - saved_v * (grad_g / norms))
        return grad_v, grad_g
    return run
