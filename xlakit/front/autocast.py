"""torch.autocast for tensors on the lazy device.

torch's autocast casts only tensors of its own device type ("cpu", "cuda", ...;
torch refuses "lazy"), through dispatch keys a lazy tensor does not have: inside
an autocast region a lazy model silently ran in float32. So xlakit applies
PyTorch's CPU autocast policy to lazy tensors inside `torch.autocast("cpu")`.
The casts happen in a TorchFunctionMode, the one Python hook above autograd, so
autograd records them and gradients reach float32 parameters in float32, as in
eager; below the Python dispatch key (where ops are recorded) it is too late,
and every autocast key is excluded there. The mode is on the stack only inside
a CPU autocast region entered while lazy tensors exist: other code pays nothing.
It covers the whole region, not only modules: the usual recipe computes the
loss (F.cross_entropy, an fp32 op) after the model, inside the region.

A TorchFunctionMode sees the calls torch's Python API receives, not the ops a
C++ composite calls inside (einsum's bmm): composites are handled by name below
where their casts follow from the arguments, and warn where they do not.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import threading

import torch
from torch.amp.autocast_mode import autocast
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves, tree_map_only

from ..core import sources
from ..core.state import PROCESS
from ..engine.executor import current
from .recorder import DEVICE

# PyTorch's CPU autocast policy, from the TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)
# block of aten/src/ATen/autocast_mode.cpp (torch 2.9). torch keeps it in C++ and
# exposes no table, so it is copied by hand; tests/test_amp.py checks the names
# against the kernels the installed torch registers under AutocastCPU.
_LOWER_PRECISION = """
    conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm _addmm_activation addbmm linear _convolution
    matmul conv_tbc mkldnn_rnn_layer conv_transpose1d conv_transpose2d conv_transpose3d prelu
    scaled_dot_product_attention _native_multi_head_attention""".split()
_FP32 = """
    avg_pool3d binary_cross_entropy grid_sampler polar prod quantile nanquantile stft cdist grid_sampler_2d
    _grid_sampler_2d_cpu_fallback grid_sampler_3d trace view_as_complex cholesky cholesky_inverse
    cholesky_solve inverse lu_solve orgqr ormqr pinverse max_pool3d max_unpool2d max_unpool3d
    adaptive_avg_pool3d reflection_pad1d reflection_pad2d replication_pad1d replication_pad2d
    replication_pad3d mse_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss
    poisson_nll_loss smooth_l1_loss cross_entropy_loss l1_loss huber_loss margin_ranking_loss
    soft_margin_loss triplet_margin_loss multi_margin_loss ctc_loss kl_div multilabel_margin_loss
    binary_cross_entropy_with_logits fft_fft fft_ifft fft_fft2 fft_ifft2 fft_fftn fft_ifftn fft_rfft
    fft_irfft fft_rfft2 fft_irfft2 fft_rfftn fft_irfftn fft_hfft fft_ihfft linalg_cond linalg_matrix_rank
    linalg_solve linalg_cholesky linalg_svdvals linalg_eigvals linalg_eigvalsh linalg_inv
    linalg_householder_product linalg_tensorinv linalg_tensorsolve fake_quantize_per_tensor_affine geqrf
    _lu_with_info qr svd triangular_solve fractional_max_pool2d fractional_max_pool3d adaptive_max_pool3d
    multilabel_margin_loss_forward linalg_qr linalg_cholesky_ex linalg_svd linalg_eig linalg_eigh
    linalg_lstsq linalg_inv_ex""".split()
_PROMOTE = ["stack", "cat", "index_copy"]

# Python names (what a TorchFunctionMode sees) of those aten ops
_ALIASES = {"__matmul__": "matmul", "__rmatmul__": "matmul", "linalg_matmul": "matmul",
            "cross_entropy": "cross_entropy_loss", "grid_sample": "grid_sampler", "concat": "cat",
            "concatenate": "cat", "lu": "_lu_with_info"}


def _eligible(t: torch.Tensor) -> bool:
    """What CPU autocast casts (at::autocast::is_eligible), on the lazy device."""
    return t.device == DEVICE and t.is_floating_point() and t.dtype != torch.float64


def _lower_precision(args, kwargs):
    return torch.get_autocast_dtype("cpu")


def _fp32(args, kwargs):
    return torch.float32


def _promote(args, kwargs):  # the widest floating dtype among the arguments
    wide = any(t.dtype == torch.float32 for t in tree_leaves((args, kwargs))
               if isinstance(t, torch.Tensor) and _eligible(t))
    return torch.float32 if wide else torch.get_autocast_dtype("cpu")


def _arg(args, kwargs, index, name, default):
    return args[index] if len(args) > index else kwargs.get(name, default)


def _pad(args, kwargs):
    # F.pad runs reflection_pad1d/2d (not 3d) or replication_pad*: fp32 ops
    mode, pad = _arg(args, kwargs, 2, "mode", "constant"), _arg(args, kwargs, 1, "pad", ())
    return torch.float32 if mode == "replicate" or (mode == "reflect" and len(pad) in (2, 4)) else None


def _max_pool3d(args, kwargs):  # with indices it is max_pool3d_with_indices, which autocast leaves alone
    return None if _arg(args, kwargs, 6, "return_indices", False) else torch.float32


def _inner(args, kwargs):  # a 0-d operand makes it a mul, else a tensordot
    return None if any(t.dim() == 0 for t in args[:2]) else torch.get_autocast_dtype("cpu")


_POLICY = {**{name: _lower_precision for name in _LOWER_PRECISION}, **{name: _fp32 for name in _FP32},
           **{name: _promote for name in _PROMOTE}}
_POLICY.update({alias: _POLICY[name] for alias, name in _ALIASES.items()})
# Composites, whose bodies eager autocast casts op by op. In these every matrix
# product (mm, bmm, linear) is an autocast op and the rest of the body computes
# from the products, so casting the inputs up front gives eager's dtypes; F.pad
# and F.max_pool3d become an fp32 op or not depending on their arguments.
_POLICY.update(tensordot=_lower_precision, linalg_multi_dot=_lower_precision, chain_matmul=_lower_precision,
               multi_head_attention_forward=_lower_precision, inner=_inner, pad=_pad, max_pool3d=_max_pool3d)
# Composites whose bodies eager autocast casts only in part, depending on the
# equation or the RNN kernel (measured on torch 2.9: nn.LSTM and nn.RNN give
# bfloat16, nn.GRU and nn.LSTMCell float32): they run in their inputs' dtypes.
_UNCOVERED = frozenset({"einsum", "lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell",
                        "rnn_tanh_cell", "rnn_relu_cell"})
_WARNED: set[str] = PROCESS.seen("front.autocast: warned", 64, "each autocast warning is given once")


class _Autocast(TorchFunctionMode):
    """Casts lazy tensor arguments as CPU autocast would cast CPU ones."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", None)
        policy = _POLICY.get(name)
        # out= variants are not autocast ops; nested autocast(enabled=False) turns it off
        if policy is not None and kwargs.get("out") is None and torch.is_autocast_enabled("cpu"):
            dtype = policy(args, kwargs)
            if dtype is not None:
                args, kwargs = tree_map_only(
                    torch.Tensor, lambda t: t.to(dtype) if t.dtype != dtype and _eligible(t) else t, (args, kwargs))
        elif name in _UNCOVERED and name not in _WARNED and torch.is_autocast_enabled("cpu") and any(
                isinstance(t, torch.Tensor) and _eligible(t) for t in tree_leaves((args, kwargs))):
            _WARNED.add(name)
            sources.warn(f"xlakit: under torch.autocast, {name} on the lazy device runs in its inputs' dtypes; "
                         f"eager CPU autocast may cast matrix products inside it. Cast its inputs to the dtype "
                         f"you want.", sources.capture())
        return func(*args, **kwargs)


class _Pushed(threading.local):
    value = False


_PUSHED = _Pushed()
_enter, _exit = autocast.__enter__, autocast.__exit__
_COMPILED_ENTER = torch.amp.autocast_mode._enter_autocast.__code__


def _autocast_enter(self):
    result = _enter(self)
    # The outermost CPU region pushes the mode. Regions that torch.compile and
    # torch.export enter (through torch.amp._enter_autocast) are theirs: Dynamo
    # forbids changes to the mode stack while it traces.
    if (self.device == "cpu" and self._enabled and not _PUSHED.value and current().has_live_tensors()
            and not torch.compiler.is_compiling() and sys._getframe(1).f_code is not _COMPILED_ENTER):
        _PUSHED.value = True
        self._xlakit_mode = _Autocast()
        self._xlakit_mode.__enter__()
    return result


def _autocast_exit(self, *exc):
    mode = self.__dict__.pop("_xlakit_mode", None)
    if mode is not None:
        _PUSHED.value = False
        mode.__exit__(*exc)
    return _exit(self, *exc)


@contextlib.contextmanager
def in_traced_graphs():
    """The policy applied while torch.compile's backend traces a graph: the regions the
    graph enters itself (through torch.amp._enter_autocast) push no mode, and the mode
    casts only inside them (it reads the autocast state at each call)."""
    if _PUSHED.value:
        yield
        return
    _PUSHED.value = True
    try:
        with _Autocast():
            yield
    finally:
        _PUSHED.value = False


_OTHER_DEVICE = "autocast for another device type"  # its warning's entry in _WARNED


def warn_other_device_type(module: torch.nn.Module, args) -> None:
    """Autocast for another device type ("cuda", "xla") leaves lazy tensors alone: say so once."""
    if (_OTHER_DEVICE in _WARNED or not torch._C._is_any_autocast_enabled() or torch.is_autocast_enabled("cpu")
            or torch.compiler.is_compiling()):
        return
    if not any(t.device == DEVICE for t in module.parameters()) and not any(
            isinstance(a, torch.Tensor) and a.device == DEVICE for a in args):
        return
    _WARNED.add(_OTHER_DEVICE)
    sources.warn("xlakit: torch.autocast applies to tensors on the lazy device only as "
                 "torch.autocast(\"cpu\", dtype=torch.bfloat16): other device types leave them in their "
                 "dtypes.", sources.capture())


_init, _is_enabled, _get_dtype = autocast.__init__, torch.is_autocast_enabled, torch.get_autocast_dtype


def _as_cpu(device_type):
    # Library code asks autocast about its own tensors' device type (transformers' rotary
    # embeddings enter torch.autocast(x.device.type, enabled=False)); torch has no autocast
    # for "lazy" and raises, and lazy tensors follow CPU autocast: "lazy" is read as "cpu".
    return "cpu" if device_type == DEVICE.type else device_type


@functools.wraps(_init)  # Dynamo binds torch.autocast's arguments by its signature
def _autocast_init(self, device_type, *args, **kwargs):
    _init(self, _as_cpu(device_type), *args, **kwargs)


def _is_autocast_enabled(*device_type):
    return _is_enabled(*map(_as_cpu, device_type))


def _get_autocast_dtype(device_type):
    return _get_dtype(_as_cpu(device_type))


def install() -> None:
    """Autocast regions of device type "cpu" (or "lazy", the same) cast lazy tensors; other device types warn."""
    autocast.__init__, autocast.__enter__, autocast.__exit__ = _autocast_init, _autocast_enter, _autocast_exit
    torch.is_autocast_enabled, torch.get_autocast_dtype = _is_autocast_enabled, _get_autocast_dtype
