"""xlakit's own decompositions: ops replaced at record time by a function of
ours in aten ops, each registered with its reason, and the ops that take
PyTorch's decomposition instead of a lowering.
"""
from __future__ import annotations

import torch
import torch._decomp

from .registry import Handling, decomposes, handled_as

handled_as(Handling.DECOMPOSED, "aten::_native_batch_norm_legit_no_training",
           reason="PyTorch's decomposition, with eval-mode statistics as eager CPU returns them")


@decomposes("aten::native_batch_norm", "aten::_native_batch_norm_legit",
            reason="one node (lowerings/nn.py's _native_batch_norm_legit_functional), then the running "
                   "statistics written in training; without them, PyTorch's decomposition")
def _batch_norm_in_one_node(op):
    """PyTorch's decomposition recorded ~30 ops in Python a call (450-520 µs replayed, an EfficientNet
    step's 13 took a third of its recording: bench/RESULTS.md, fifteenth round). The functional op is
    lowered whole; the in-place writes of the running statistics are the copies PyTorch's makes."""
    without_statistics = torch._decomp.decomposition_table[op]
    if "running_mean" not in (a.name for a in op._schema.arguments):
        return without_statistics  # _native_batch_norm_legit.no_stats (training only: eager's eval crashes)
    functional = torch.ops.aten._native_batch_norm_legit_functional.default

    def run(input, weight, bias, running_mean, running_var, training, momentum, eps):
        if running_mean is None or running_var is None:
            return without_statistics(input, weight, bias, running_mean, running_var, training, momentum, eps)
        output, mean, invstd, new_mean, new_var = functional(input, weight, bias, running_mean, running_var,
                                                             training, momentum, eps)
        if training:
            running_mean.copy_(new_mean)
            running_var.copy_(new_var)
        return output, mean, invstd
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
