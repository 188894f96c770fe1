"""Neural-network ops: convolution, pooling, softmax, normalization, losses,
interpolation, and their backward ops.

Where a backward op is the exact transpose of a linear forward (convolution,
average pooling, interpolation) it is JAX's vjp of the forward lowering;
where torch's backward kernel has its own formula (max pooling's scatter by
index, losses) it is written out.
"""
from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..core import checks
from .dtypes import jax_dtype
from .pointwise import common
from .verdicts import NeedsEager
from .registry import lowers

_HALF = (jnp.float16, jnp.bfloat16)


def _acc(x):
    """x in the dtype torch's CPU kernels accumulate in: float32 for half types."""
    return x.astype(jnp.float32) if x.dtype in _HALF else x


def _ntuple(value, n: int) -> tuple[int, ...]:
    """An `int[n]` argument: one int (or a one-element list) stands for all n."""
    if isinstance(value, (list, tuple)):
        if len(value) == 1:
            return tuple(int(value[0]) for _ in range(n))
        return tuple(int(v) for v in value)
    return (int(value),) * n


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _batched(x, nd: int):
    """(x with a batch dim, whether one was added): ops accept (C, *spatial) too."""
    if x.ndim == nd + 1:
        return x[None], True
    return x, False


# -- convolution ----------------------------------------------------------------------
def _conv_numbers(nd: int):
    spatial = "DHW"[-nd:] if nd <= 3 else "".join(chr(ord("a") + i) for i in range(nd))
    return ("NC" + spatial, "OI" + spatial, "NC" + spatial)


@lowers("aten::convolution")
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    nd = weight.ndim - 2
    stride, padding, dilation = _ntuple(stride, nd), _ntuple(padding, nd), _ntuple(dilation, nd)
    x, added = _batched(input, nd)
    # torch's CPU kernels accumulate half types in float32
    preferred = jnp.float32 if x.dtype in _HALF else None
    if transposed:
        output_padding = _ntuple(output_padding, nd)
        # the transpose of a strided convolution: the input dilated by the stride,
        # the kernel flipped and its in/out channels swapped within each group
        c_in, c_out_g = weight.shape[:2]
        kernel = weight.reshape(groups, c_in // groups, c_out_g, *weight.shape[2:])
        kernel = jnp.swapaxes(kernel, 1, 2).reshape(groups * c_out_g, c_in // groups, *weight.shape[2:])
        kernel = jnp.flip(kernel, axis=tuple(range(2, 2 + nd)))
        pads = [(d * (k - 1) - p, d * (k - 1) - p + op)
                for k, p, d, op in zip(weight.shape[2:], padding, dilation, output_padding)]
        out = lax.conv_general_dilated(x, kernel, window_strides=(1,) * nd, padding=pads,
                                       lhs_dilation=stride, rhs_dilation=dilation,
                                       dimension_numbers=_conv_numbers(nd), feature_group_count=groups,
                                       preferred_element_type=preferred)
    else:
        out = lax.conv_general_dilated(x, weight, window_strides=stride, padding=[(p, p) for p in padding],
                                       rhs_dilation=dilation, dimension_numbers=_conv_numbers(nd),
                                       feature_group_count=groups, preferred_element_type=preferred)
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape(-1, *(1,) * nd)
    out = out.astype(input.dtype)
    return out[0] if added else out


@lowers("aten::convolution_backward")
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
    """JAX's vjp of the forward lowering (a convolution is linear in each operand)."""
    def forward(x, w):
        return convolution(x, w, None, stride, padding, dilation, transposed, output_padding, groups)

    # in float32 for half types, as torch's CPU kernels accumulate (and jax 0.7's
    # transpose rule refuses a float32 cotangent against a half kernel)
    compute = jnp.float32 if input.dtype in _HALF else input.dtype
    _, vjp = jax.vjp(forward, input.astype(compute), weight.astype(compute))
    grad_input, grad_weight = vjp(grad_output.astype(compute))
    grad_input, grad_weight = grad_input.astype(input.dtype), grad_weight.astype(weight.dtype)
    grad_bias = None
    if output_mask[2]:
        nd = weight.ndim - 2
        axes = tuple(d for d in range(grad_output.ndim) if d != grad_output.ndim - nd - 1)
        grad_bias = _acc(grad_output).sum(axis=axes)
    return (grad_input if output_mask[0] else None, grad_weight if output_mask[1] else None, grad_bias)


# -- pooling --------------------------------------------------------------------------
def _pool_out_size(size, kernel, stride, pad, dilation, ceil_mode) -> int:
    """torch's pooling_output_shape."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _select_max(values, valid, positions):
    """Max over the last axis of `values` (the candidates of each window) and the
    position torch's CPU kernel records: it scans a window in order and takes a
    candidate if it is greater than the best so far or NaN, so a window with a
    NaN gives its last NaN, otherwise the first maximum. `valid` (broadcastable)
    marks candidates inside the input; `positions` (broadcastable, int64) their
    flat index in the input plane."""
    lowest = _lowest(values.dtype)
    masked = jnp.where(valid, values, lowest)
    positions = jnp.broadcast_to(positions, values.shape)
    k = values.shape[-1]
    if jnp.issubdtype(values.dtype, jnp.floating):
        nan = jnp.isnan(values) & valid
        best = masked.max(axis=-1)   # NaN if the window holds one
        last_nan = k - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
        first_max = jnp.argmax(valid & (masked == best[..., None]), axis=-1)
        chosen = jnp.where(nan.any(axis=-1), last_nan, first_max)
    else:
        best = masked.max(axis=-1)
        chosen = jnp.argmax(valid & (masked == best[..., None]), axis=-1)
    index = jnp.take_along_axis(positions, chosen[..., None], axis=-1)[..., 0]
    return best, index.astype(jnp.int64)


def _plane_positions(coords, sizes):
    """Flat row-major index in a plane of `sizes` from per-dim coordinate arrays
    (numpy, broadcastable)."""
    flat = 0
    for c, s in zip(coords, sizes):
        flat = flat * s + c
    return flat


def _max_pool(self, nd, kernel_size, stride, padding, dilation, ceil_mode):
    kernel = _ntuple(kernel_size, nd)
    stride = _ntuple(stride, nd) if stride else kernel
    padding, dilation = _ntuple(padding, nd), _ntuple(dilation, nd)
    sizes = self.shape[-nd:]
    outs = [_pool_out_size(*a, ceil_mode) for a in zip(sizes, kernel, stride, padding, dilation)]
    # pad so every window's candidates can be taken as one strided slice
    high = [max(0, (o - 1) * s + d * (k - 1) + 1 - n - p)
            for o, s, d, k, n, p in zip(outs, stride, dilation, kernel, sizes, padding)]
    lead = self.ndim - nd
    padded = jnp.pad(self, [(0, 0)] * lead + [(p, h) for p, h in zip(padding, high)])
    values, valids, positions = [], [], []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        starts = [o * d for o, d in zip(offsets, dilation)]
        values.append(lax.slice(padded, (0,) * lead + tuple(starts),
                                padded.shape[:lead] + tuple(st + (o - 1) * s + 1 for st, o, s
                                                            in zip(starts, outs, stride)),
                                (1,) * lead + stride))
        coords = []
        valid = np.ones((1,) * nd, bool)
        for i in range(nd):
            shape = [1] * nd
            shape[i] = outs[i]
            c = (np.arange(outs[i]) * stride[i] - padding[i] + starts[i]).reshape(shape)
            valid = valid & (c >= 0) & (c < sizes[i])
            coords.append(c)
        valids.append(np.broadcast_to(valid, outs))
        positions.append(np.broadcast_to(_plane_positions(coords, sizes), outs))
    stacked = jnp.stack(values, axis=-1)
    return _select_max(stacked, np.stack(valids, -1), np.stack(positions, -1).astype(np.int64))


def _max_pool_with_indices(nd):
    def lowering(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        return _max_pool(self, nd, kernel_size, stride, padding, dilation, ceil_mode)
    return lowering


def _max_pool_values(nd):
    def lowering(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        return _max_pool(self, nd, kernel_size, stride, padding, dilation, ceil_mode)[0]
    return lowering


for _nd in (1, 2, 3):
    lowers(f"aten::max_pool{_nd}d_with_indices")(_max_pool_with_indices(_nd))
    lowers(f"aten::max_pool{_nd}d")(_max_pool_values(_nd))


def _scatter_to_planes(grad_output, input_shape, indices, nd):
    """Add each gradient to the input position torch recorded in `indices`
    (a flat index into its plane), as torch's backward kernels do."""
    plane = math.prod(input_shape[-nd:])
    grads = _acc(grad_output).reshape(-1, math.prod(grad_output.shape[-nd:]))
    flat = indices.reshape(grads.shape)
    rows = jnp.arange(grads.shape[0])[:, None]
    out = jnp.zeros((grads.shape[0], plane), grads.dtype).at[rows, flat].add(grads)
    return out.reshape(input_shape)


def _max_pool_backward(nd):
    def lowering(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
        return _scatter_to_planes(grad_output, self.shape, indices, nd)
    return lowering


for _nd in (2, 3):
    lowers(f"aten::max_pool{_nd}d_with_indices_backward")(_max_pool_backward(_nd))


def _avg_pool(self, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel = _ntuple(kernel_size, nd)
    stride = _ntuple(stride, nd) if stride else kernel
    padding = _ntuple(padding, nd)
    sizes = self.shape[-nd:]
    outs = [_pool_out_size(n, k, s, p, 1, ceil_mode) for n, k, s, p in zip(sizes, kernel, stride, padding)]
    high = [max(0, (o - 1) * s + k - n - p) for o, s, k, n, p in zip(outs, stride, kernel, sizes, padding)]
    lead = self.ndim - nd
    x = _acc(self)
    # a concrete 0 lets JAX see the sum monoid (differentiable)
    summed = lax.reduce_window(x, np.zeros((), x.dtype), lax.add, (1,) * lead + kernel,
                               (1,) * lead + stride, [(0, 0)] * lead + list(zip(padding, high)))
    summed = lax.slice(summed, (0,) * summed.ndim, summed.shape[:lead] + tuple(outs))
    if divisor_override:
        divisor = np.asarray(divisor_override)
    else:
        # torch's count per window: clipped to the padded input, then (unless
        # count_include_pad) to the input itself; separable over the dims
        divisor = np.ones((1,) * nd, np.int64)
        for i in range(nd):
            start = np.arange(outs[i]) * stride[i] - padding[i]
            end = np.minimum(start + kernel[i], sizes[i] + padding[i])
            if not count_include_pad:
                start, end = np.maximum(start, 0), np.minimum(end, sizes[i])
            shape = [1] * nd
            shape[i] = outs[i]
            divisor = divisor * (end - start).reshape(shape)
    if jnp.issubdtype(x.dtype, jnp.integer):
        return lax.div(summed, jnp.asarray(divisor, x.dtype))  # integer division truncates, as in C++
    return summed / jnp.asarray(divisor, x.dtype)


def _avg_pool_lowering(nd):
    def lowering(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        return _avg_pool(self, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return lowering


def _avg_pool_backward(nd):
    def lowering(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                 divisor_override):
        def forward(x):
            return _avg_pool(x, nd, kernel_size, stride, padding, ceil_mode, count_include_pad,
                             divisor_override)
        _, vjp = jax.vjp(forward, _acc(self))
        return vjp(_acc(grad_output))[0]
    return lowering


for _nd in (1, 2, 3):
    lowers(f"aten::avg_pool{_nd}d")(_avg_pool_lowering(_nd))
for _nd in (2, 3):
    lowers(f"aten::avg_pool{_nd}d_backward")(_avg_pool_backward(_nd))


def _adaptive_windows(size: int, out: int):
    """torch's adaptive pooling windows: [floor(i*size/out), ceil((i+1)*size/out))."""
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def _adaptive_avg_pool(self, nd, output_size):
    outs = _ntuple(output_size, nd)
    x = _acc(self)
    for i, out in enumerate(outs):
        axis = self.ndim - nd + i
        size = x.shape[axis]
        start, end = _adaptive_windows(size, out)
        if size % out == 0:
            k = size // out
            x = x.reshape(*x.shape[:axis], out, k, *x.shape[axis + 1:]).sum(axis=axis + 1)
        else:
            # windows overlap or differ in length: a 0/1 window matrix
            member = (np.arange(size)[None, :] >= start[:, None]) & (np.arange(size)[None, :] < end[:, None])
            x = jnp.moveaxis(jnp.tensordot(x, jnp.asarray(member.T, x.dtype), axes=[[axis], [0]],
                                           precision=lax.Precision.HIGHEST), -1, axis)
        shape = [1] * self.ndim
        shape[axis] = out
        x = x / jnp.asarray((end - start).reshape(shape), x.dtype)
    return x


def _adaptive_avg_pool_lowering(nd):
    def lowering(self, output_size):
        return _adaptive_avg_pool(self, nd, output_size)
    return lowering


def _adaptive_avg_pool_backward(nd):
    def lowering(grad_output, self):
        _, vjp = jax.vjp(lambda x: _adaptive_avg_pool(x, nd, grad_output.shape[-nd:]), _acc(self))
        return vjp(_acc(grad_output))[0]
    return lowering


for _nd in (2, 3):
    lowers(f"aten::_adaptive_avg_pool{_nd}d")(_adaptive_avg_pool_lowering(_nd))
    lowers(f"aten::_adaptive_avg_pool{_nd}d_backward")(_adaptive_avg_pool_backward(_nd))


def _adaptive_max_pool(self, nd, output_size):
    outs = _ntuple(output_size, nd)
    sizes = self.shape[-nd:]
    lead = self.ndim - nd
    x = self
    coords, valids = [], []
    for i, (size, out) in enumerate(zip(sizes, outs)):
        start, end = _adaptive_windows(size, out)
        width = int((end - start).max()) if out else 0
        pos = start[:, None] + np.arange(width)[None, :]            # (out, width)
        valids.append(pos < end[:, None])
        pos = np.minimum(pos, size - 1)
        coords.append(pos)
        x = jnp.take(x, jnp.asarray(pos.reshape(-1)), axis=lead + 2 * i)
        x = x.reshape(*x.shape[:lead + 2 * i], out, width, *x.shape[lead + 2 * i + 1:])
    # x: (..., out_0, w_0, out_1, w_1, ...) -> (..., out_0, out_1, ..., w_0 * w_1 * ...)
    order = [lead + 2 * i for i in range(nd)] + [lead + 2 * i + 1 for i in range(nd)]
    x = jnp.transpose(x, list(range(lead)) + order).reshape(*x.shape[:lead], *outs, -1)
    # the same layout for validity and positions: (out_0, w_0, ...) broadcast, then transposed
    full = []
    for i in range(nd):
        shape = [1] * (2 * nd)
        shape[2 * i], shape[2 * i + 1] = coords[i].shape
        full.append((coords[i].reshape(shape), valids[i].reshape(shape)))
    positions = _plane_positions([c for c, _ in full], sizes)
    valid = functools.reduce(np.logical_and, [v for _, v in full])
    perm = [2 * i for i in range(nd)] + [2 * i + 1 for i in range(nd)]
    bshape = [s for i in range(nd) for s in (outs[i], coords[i].shape[1])]
    positions = np.transpose(np.broadcast_to(positions, bshape), perm).reshape(*outs, -1)
    valid = np.transpose(np.broadcast_to(valid, bshape), perm).reshape(*outs, -1)
    return _select_max(x, valid, positions.astype(np.int64))


def _adaptive_max_pool_lowering(nd):
    def lowering(self, output_size):
        return _adaptive_max_pool(self, nd, output_size)
    return lowering


def _adaptive_max_pool_backward(nd):
    def lowering(grad_output, self, indices):
        return _scatter_to_planes(grad_output, self.shape, indices, nd)
    return lowering


for _nd in (1, 2, 3):
    lowers(f"aten::adaptive_max_pool{_nd}d")(_adaptive_max_pool_lowering(_nd))
for _nd in (2, 3):
    lowers(f"aten::adaptive_max_pool{_nd}d_backward")(_adaptive_max_pool_backward(_nd))


def _im2col(x, kernel_size, dilation, padding, stride):
    kernel, dilation = _ntuple(kernel_size, 2), _ntuple(dilation, 2)
    padding, stride = _ntuple(padding, 2), _ntuple(stride, 2)
    x, added = _batched(x, 2)
    n, c, h, w = x.shape
    outs = [(size + 2 * p - d * (k - 1) - 1) // s + 1
            for size, k, d, p, s in zip((h, w), kernel, dilation, padding, stride)]
    padded = jnp.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    blocks = []
    for i, j in itertools.product(range(kernel[0]), range(kernel[1])):
        start = (i * dilation[0], j * dilation[1])
        limit = tuple(st + (o - 1) * s + 1 for st, o, s in zip(start, outs, stride))
        blocks.append(lax.slice(padded, (0, 0) + start, (n, c) + limit, (1, 1) + stride))
    # rows ordered (channel, kernel row, kernel column), as torch's unfold
    cols = jnp.stack(blocks, axis=2).reshape(n, c * kernel[0] * kernel[1], outs[0] * outs[1])
    return cols[0] if added else cols


@lowers("aten::im2col")
def im2col(self, kernel_size, dilation, padding, stride):
    return _im2col(self, kernel_size, dilation, padding, stride)


@lowers("aten::col2im")
def col2im(self, output_size, kernel_size, dilation, padding, stride):
    """The adjoint of im2col: each column entry added back to its input position."""
    kernel = _ntuple(kernel_size, 2)
    batched = self.ndim == 3
    channels = self.shape[-2] // (kernel[0] * kernel[1])
    shape = ((self.shape[0],) if batched else ()) + (channels, *_ntuple(output_size, 2))
    zeros = jnp.zeros(shape, _acc(self).dtype)
    _, vjp = jax.vjp(lambda x: _im2col(x, kernel_size, dilation, padding, stride), zeros)
    return vjp(_acc(self))[0]


# -- softmax --------------------------------------------------------------------------
def _shifted(x, dim):
    """x - max(x, dim) (0-d: x - x), in the accumulation dtype."""
    x = _acc(x)
    if x.ndim == 0:
        return x - x
    return x - lax.stop_gradient(x.max(axis=dim, keepdims=True))


def _softmax_of(x, dim):
    if x.ndim == 0:
        return jnp.exp(_shifted(x, dim))
    e = jnp.exp(_shifted(x, dim))
    return e / e.sum(axis=dim, keepdims=True)


@lowers("aten::_softmax")
def _softmax(self, dim, half_to_float):
    return _softmax_of(self, dim)


@lowers("aten::_log_softmax")
def _log_softmax(self, dim, half_to_float):
    shifted = _shifted(self, dim)
    if self.ndim == 0:
        return shifted
    return shifted - jnp.log(jnp.exp(shifted).sum(axis=dim, keepdims=True))


@lowers("aten::_safe_softmax")
def _safe_softmax(self, dim, dtype=None):
    """softmax, with 0 where a whole row is -inf (attention rows fully masked): there the max
    it subtracts is taken as 0, so the row's exponentials are all 0, and their sum as 1. Only
    the two reductions softmax takes; a test of the row (all(x == -inf), or max == -inf beside
    softmax's own max) was one more pass over every attention matrix, which XLA kept."""
    x = _acc(self.astype(jax_dtype(dtype)) if dtype is not None else self)
    if x.ndim == 0:
        return jnp.where(x == -jnp.inf, 0, jnp.exp(x - x))
    row_max = lax.stop_gradient(x.max(axis=dim, keepdims=True))
    masked = row_max == -jnp.inf
    e = jnp.exp(x - jnp.where(masked, 0, row_max))
    return e / jnp.where(masked, 1, e.sum(axis=dim, keepdims=True))


@lowers("aten::_softmax_backward_data")
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _acc(grad_output), _acc(output)
    if y.ndim == 0:
        return g * y - g * y * y
    return y * (g - (g * y).sum(axis=dim, keepdims=True))


@lowers("aten::_log_softmax_backward_data")
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _acc(grad_output), _acc(output)
    if y.ndim == 0:
        return g - jnp.exp(y) * g
    return g - jnp.exp(y) * g.sum(axis=dim, keepdims=True)


# -- normalization --------------------------------------------------------------------
@lowers("aten::native_layer_norm")
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    """(out, mean, rstd); mean and rstd keep the normalized dims as size 1."""
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    x = _acc(input)
    mean = x.mean(axis=axes, keepdims=True)
    var = jnp.square(x - mean).mean(axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * _acc(weight)
    if bias is not None:
        out = out + _acc(bias)
    return out, mean, rstd


# The norms' backward ops and the batch norm, one node each. PyTorch's decompositions recorded ~20-30
# ops each through Python at every call (320-930 µs replayed): up to a third of a model's recording a
# step (bench/RESULTS.md, fifteenth round). Every output is computed: the op's shape rule says which it
# returns (to_jax drops the others), and XLA drops what is not returned.
def _normalized_input_grad(grad_x_hat, x_hat, rstd, axes):
    """The gradient reaching x through x_hat = (x - mean(x)) * rstd, the statistics over `axes`."""
    n = math.prod(x_hat.shape[a] for a in axes)
    return rstd / n * (n * grad_x_hat - grad_x_hat.sum(axis=axes, keepdims=True)
                       - x_hat * (grad_x_hat * x_hat).sum(axis=axes, keepdims=True))


def _per_channel(input) -> tuple:
    """(every axis but the channels', the shape a channel's value broadcasts in): channels on axis 1."""
    return tuple(d for d in range(input.ndim) if d != 1), (1, input.shape[1]) + (1,) * (input.ndim - 2)


@lowers("aten::native_layer_norm_backward")
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    """(grad_input, grad_weight, grad_bias) from the forward's saved mean and rstd."""
    axis = input.ndim - len(normalized_shape)
    inner, outer = tuple(range(axis, input.ndim)), tuple(range(axis))
    stats = tuple(input.shape[:axis]) + (1,) * len(inner)
    g, rstd = _acc(grad_out), _acc(rstd).reshape(stats)
    x_hat = (_acc(input) - _acc(mean).reshape(stats)) * rstd
    grad_x_hat = g * _acc(weight) if weight is not None else g
    return (_normalized_input_grad(grad_x_hat, x_hat, rstd, inner), (g * x_hat).sum(axis=outer),
            g.sum(axis=outer))


@lowers("aten::native_group_norm_backward")
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    """(grad_input, grad_weight, grad_bias): per group, the layer norm's gradient over its
    channels and positions; weight and bias per channel."""
    grouped = (N, group, C // group, HxW)
    g, rstd = _acc(grad_out).reshape(grouped), _acc(rstd).reshape(N, group, 1, 1)
    x_hat = (_acc(input).reshape(grouped) - _acc(mean).reshape(N, group, 1, 1)) * rstd
    grad_x_hat = g * _acc(weight).reshape(1, group, C // group, 1) if weight is not None else g
    return (_normalized_input_grad(grad_x_hat, x_hat, rstd, (2, 3)).reshape(input.shape),
            (g * x_hat).sum(axis=(0, 3)).reshape(C), g.sum(axis=(0, 3)).reshape(C))


def _batch_norm_functional_meta(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """The meta kernel's, whose statistics are as eager CUDA gives them (in float32 for a half input,
    as xlakit's other norms: docs/op_coverage_dtypes.md), but in eval the saved ones empty, as eager
    CPU returns them, not the running ones (found by xlakit.opinfo; eval's backward reads the running ones)."""
    outputs = torch.ops.aten._native_batch_norm_legit_functional.default(
        input, weight, bias, running_mean, running_var, training, momentum, eps)
    if training:
        return outputs
    empty = input.new_empty((0,))
    return outputs[0], empty, empty, *outputs[3:]


@lowers("aten::_native_batch_norm_legit_functional", meta=_batch_norm_functional_meta)
def _native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(output, save_mean, save_invstd, new running mean, new running var), channels on axis 1:
    in training the batch's statistics, the running ones moved toward them (the variance unbiased);
    in eval the running ones, unchanged, and the saved ones empty (_batch_norm_functional_meta)."""
    axes, channel = _per_channel(input)
    x = _acc(input)
    if training:
        mean = x.mean(axis=axes)
        var = jnp.square(x - mean.reshape(channel)).mean(axis=axes)
        n = x.size // input.shape[1]  # above 1: the meta kernel divides by n - 1 first
        new_mean = momentum * mean + (1 - momentum) * _acc(running_mean)
        new_var = momentum * var * (n / (n - 1)) + (1 - momentum) * _acc(running_var)
    else:
        mean, var = _acc(running_mean), _acc(running_var)
        new_mean, new_var = running_mean, running_var
    invstd = lax.rsqrt(var + eps)
    output = (x - mean.reshape(channel)) * invstd.reshape(channel)
    if weight is not None:
        output = output * _acc(weight).reshape(channel)
    if bias is not None:
        output = output + _acc(bias).reshape(channel)
    saved = (mean, invstd) if training else (jnp.zeros((0,), x.dtype),) * 2
    return (output, *saved, new_mean, new_var)


@lowers("aten::native_batch_norm_backward")
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                               train, eps, output_mask):
    """(grad_input, grad_weight, grad_bias), channels on axis 1: in training through the batch's
    saved statistics; in eval the running ones are constants, so the input's gradient is only scaled."""
    axes, channel = _per_channel(input)
    if train:
        mean, invstd = _acc(save_mean), _acc(save_invstd)
    else:
        mean, invstd = _acc(running_mean), lax.rsqrt(_acc(running_var) + eps)
    g, invstd = _acc(grad_out), invstd.reshape(channel)
    x_hat = (_acc(input) - mean.reshape(channel)) * invstd
    grad_x_hat = g * _acc(weight).reshape(channel) if weight is not None else g
    grad_input = _normalized_input_grad(grad_x_hat, x_hat, invstd, axes) if train else grad_x_hat * invstd
    return grad_input, (g * x_hat).sum(axis=axes), g.sum(axis=axes)


@lowers("aten::native_group_norm")
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    """(out, mean, rstd); mean and rstd are (N, group)."""
    x = _acc(input).reshape(N, group, -1)
    mean = x.mean(axis=-1, keepdims=True)
    var = jnp.square(x - mean).mean(axis=-1, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = ((x - mean) * rstd).reshape(N, C, -1)
    if weight is not None:
        out = out * _acc(weight)[:, None]
    if bias is not None:
        out = out + _acc(bias)[:, None]
    return out.reshape(input.shape), mean.reshape(N, group), rstd.reshape(N, group)


# -- losses ---------------------------------------------------------------------------
_NONE, _MEAN, _SUM = 0, 1, 2


def _reduce(loss, reduction):
    if reduction == _MEAN:
        return loss.mean()
    if reduction == _SUM:
        return loss.sum()
    return loss


def _nll_picked(self, target, weight, ignore_index):
    """(the one-hot of target along the class axis, each element's weight), ignored targets 0."""
    class_axis = 0 if self.ndim == 1 else 1
    classes = self.shape[class_axis]
    kept = target != ignore_index
    shape = [1] * self.ndim
    shape[class_axis] = classes
    onehot = jnp.expand_dims(target, class_axis) == jnp.arange(classes).reshape(shape)
    onehot = onehot & jnp.expand_dims(kept, class_axis)
    w = jnp.ones((), self.dtype) if weight is None else weight.astype(self.dtype)
    w = jnp.where(kept, w[jnp.where(kept, target, 0)] if weight is not None else w, 0)
    return onehot, w


@lowers("aten::nll_loss_forward", "aten::nll_loss2d_forward")
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    """(output, total_weight), total_weight 0 when unreduced, as on CPU."""
    classes = self.shape[0 if self.ndim == 1 else 1]
    checks.require((target == ignore_index) | checks.in_range(target, classes, negative=False), IndexError,
                   "Target {index} is out of bounds.", index=target, valid=(0, classes))
    x = _acc(self)
    onehot, w = _nll_picked(x, target, weight, ignore_index)
    class_axis = 0 if x.ndim == 1 else 1
    losses = -jnp.where(onehot, x, 0).sum(axis=class_axis) * w
    if reduction == _NONE:
        return losses, jnp.zeros((), x.dtype)
    total = w.sum()
    if reduction == _SUM:
        return losses.sum(), total
    return losses.sum() / total, total


@lowers("aten::nll_loss_backward", "aten::nll_loss2d_backward")
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    x = _acc(self)
    onehot, w = _nll_picked(x, target, weight, ignore_index)
    class_axis = 0 if x.ndim == 1 else 1
    g = _acc(grad_output)
    if reduction == _MEAN:
        g = g / _acc(total_weight)
    scale = -w * g
    return jnp.where(onehot, jnp.expand_dims(scale, class_axis), jnp.zeros((), x.dtype))


@lowers("aten::mse_loss")
def mse_loss(self, target, reduction=_MEAN):
    return _reduce(jnp.square(_acc(self) - _acc(target)), reduction)


@lowers("aten::mse_loss_backward")
def mse_loss_backward(grad_output, self, target, reduction):
    scale = 2.0 / math.prod(self.shape) if reduction == _MEAN else 2.0
    diff = _acc(self) - _acc(target)
    return jnp.broadcast_to(scale * diff * _acc(grad_output), self.shape)


@lowers("aten::binary_cross_entropy")
def binary_cross_entropy(self, target, weight=None, reduction=_MEAN):
    x, t = _acc(self), _acc(target)
    # torch clamps each log at -100, so 0 and 1 give finite losses
    loss = -(t * jnp.maximum(jnp.log(x), -100.0) + (1 - t) * jnp.maximum(jnp.log1p(-x), -100.0))
    if weight is not None:
        loss = loss * _acc(weight)
    return _reduce(loss, reduction)


@lowers("aten::binary_cross_entropy_backward")
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=_MEAN):
    x, t = _acc(self), _acc(target)
    grad = _acc(grad_output) * (x - t) / jnp.maximum((1 - x) * x, 1e-12)
    if weight is not None:
        grad = grad * _acc(weight)
    if reduction == _MEAN:
        grad = grad / math.prod(self.shape)
    return jnp.broadcast_to(grad, self.shape)


# -- dropout, glu ---------------------------------------------------------------------
@lowers("aten::native_dropout_backward")
def native_dropout_backward(grad_output, mask, scale):
    # eager's grad_output * mask * scale: a bool or integer gradient times the float scale is a float
    grad_output, scale = common(grad_output, scale)
    return grad_output * mask.astype(grad_output.dtype) * scale


@lowers("aten::glu")
def glu(self, dim=-1):
    a, b = jnp.split(_acc(self), 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@lowers("aten::glu_backward")
def glu_backward(grad_output, self, dim):
    a, b = jnp.split(_acc(self), 2, axis=dim)
    g = _acc(grad_output)
    s = jax.nn.sigmoid(b)
    return jnp.concatenate([g * s, g * a * s * (1 - s)], axis=dim)


# -- interpolation --------------------------------------------------------------------
# torch's CPU kernels (UpSample.h) compute source indices and weights from the
# output index in float (double for double tensors): computed here the same way,
# in numpy at trace time, then applied one dim at a time, innermost first.
_CUBIC_A = -0.75


def _scale(in_size, out_size, scale, align_corners, opmath):
    """area_pixel_compute_scale / compute_scales_value."""
    if align_corners:
        return opmath((in_size - 1) / (out_size - 1)) if out_size > 1 else opmath(0)
    if scale is not None and scale > 0:
        return opmath(1.0 / scale)
    return opmath(in_size) / opmath(out_size)


def _taps(kind, in_size, out_size, scale, align_corners, opmath):
    """(indices, weights): each (taps, out_size); weights None for nearest."""
    i = np.arange(out_size)
    if kind in ("nearest", "nearest-exact"):
        if out_size == in_size:
            return i[None], None
        s = _scale(in_size, out_size, scale, False, np.float32)
        if kind == "nearest":
            src = np.floor(i.astype(np.float32) * s)
        else:
            src = np.floor(((i + 0.5) * np.float64(s)).astype(np.float32))
        return np.minimum(src.astype(np.int64), in_size - 1)[None], None
    s = _scale(in_size, out_size, scale, align_corners, opmath)
    if align_corners:
        real = s * i.astype(opmath)
    else:
        real = s * (i.astype(opmath) + opmath(0.5)) - opmath(0.5)
    if kind == "linear":
        if out_size == in_size:
            return np.stack([i, i]), np.stack([np.ones(out_size, opmath), np.zeros(out_size, opmath)])
        real = np.maximum(real, opmath(0))
        i0 = np.minimum(real.astype(np.int64), in_size - 1)
        lambda1 = np.clip(real - i0.astype(opmath), 0, 1).astype(opmath)
        i1 = i0 + (i0 < in_size - 1)
        return np.stack([i0, i1]), np.stack([opmath(1) - lambda1, lambda1])
    # bicubic: 4 taps around floor(real), clamped at the borders
    floor = np.floor(real)
    t = (real - floor).astype(opmath)
    a = opmath(_CUBIC_A)

    def near(x):   # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):    # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)]).astype(opmath)
    base = floor.astype(np.int64)
    indices = np.stack([np.clip(base - 1 + j, 0, in_size - 1) for j in range(4)])
    return indices, weights


def _interpolate(x, nd, out_sizes, scales, kind, align_corners):
    opmath = np.float64 if x.dtype == jnp.float64 else np.float32
    dtype = x.dtype
    # uint8 images: eager's kernel weighs in fixed point and rounds (within 1 of the float
    # answer rounded to nearest, which this gives); weighed in uint8 itself, every weight is 0
    integer = kind not in ("nearest", "nearest-exact") and not jnp.issubdtype(dtype, jnp.inexact)
    if integer and kind == "cubic":
        raise NeedsEager("eager's uint8 bicubic drops the taps past the border and renormalizes (its float "
                         "kernel clamps them): up to 8 apart at the edges")
    x = x.astype(jnp.float32) if integer else _acc(x)
    for i in reversed(range(nd)):
        axis = x.ndim - nd + i
        indices, weights = _taps(kind, x.shape[axis], int(out_sizes[i]), scales[i], align_corners, opmath)
        if weights is None:
            x = jnp.take(x, jnp.asarray(indices[0]), axis=axis)
            continue
        shape = [1] * x.ndim
        shape[axis] = -1
        result = None
        for idx, w in zip(indices, weights):
            term = jnp.take(x, jnp.asarray(idx), axis=axis) * jnp.asarray(w, x.dtype).reshape(shape)
            result = term if result is None else result + term
        x = result
    if integer:
        info = jnp.iinfo(dtype)
        return jnp.clip(jnp.round(x), info.min, info.max).astype(dtype)
    return x


_SCALE_NAMES = {1: ("scales",), 2: ("scales_h", "scales_w"), 3: ("scales_d", "scales_h", "scales_w")}


def _scales(nd, positional, named):
    values = list(positional) + [None] * (nd - len(positional))
    for j, name in enumerate(_SCALE_NAMES[nd]):
        if name in named:
            values[j] = named[name]
    return values


def _vec_sizes(x, nd, output_size, scale_factors):
    """Output sizes and scales of a `.vec` overload: torch truncates size * scale."""
    if output_size is not None:
        return list(output_size), [None] * nd
    factors = list(scale_factors)
    if len(factors) == 1:
        factors = factors * nd
    return [int(n * s) for n, s in zip(x.shape[-nd:], factors)], factors


def _register_interpolation(name, nd, kind, aligned: bool):
    def forward(self, output_size, *rest, **named):
        align_corners = False
        if aligned:
            align_corners, rest = (rest[0], rest[1:]) if rest else (named.pop("align_corners"), rest)
        return _interpolate(self, nd, output_size, _scales(nd, rest, named), kind, align_corners)

    def vec(input, output_size, *rest, **named):
        align_corners = False
        if aligned:
            align_corners, rest = (rest[0], rest[1:]) if rest else (named.pop("align_corners"), rest)
        factors = rest[0] if rest else named.get("scale_factors")
        sizes, scales = _vec_sizes(input, nd, output_size, factors)
        return _interpolate(input, nd, sizes, scales, kind, align_corners)

    def backward(grad_output, output_size, input_size, *rest, **named):
        align_corners = False
        if aligned:
            align_corners, rest = (rest[0], rest[1:]) if rest else (named.pop("align_corners"), rest)
        scales = _scales(nd, rest, named)
        zeros = jnp.zeros(tuple(input_size), _acc(grad_output).dtype)
        _, vjp = jax.vjp(lambda x: _interpolate(x, nd, output_size, scales, kind, align_corners), zeros)
        return vjp(_acc(grad_output))[0]

    lowers(f"aten::{name}")(forward)
    lowers(f"aten::{name}.vec")(vec)
    lowers(f"aten::{name}_backward")(backward)


for _nd in (1, 2, 3):
    _register_interpolation(f"upsample_nearest{_nd}d", _nd, "nearest", False)
    _register_interpolation(f"_upsample_nearest_exact{_nd}d", _nd, "nearest-exact", False)
_register_interpolation("upsample_linear1d", 1, "linear", True)
_register_interpolation("upsample_bilinear2d", 2, "linear", True)
_register_interpolation("upsample_trilinear3d", 3, "linear", True)
_register_interpolation("upsample_bicubic2d", 2, "cubic", True)


# -- grid sampling --------------------------------------------------------------------
# torch's GridSampler.h, per output point: unnormalize the grid coordinate,
# apply the padding mode, then interpolate; taps outside the input read 0.
_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _reflect(coord, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    coord = jnp.abs(coord - low)
    extra = jnp.fmod(coord, span)
    flips = jnp.floor(coord / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _padded_coordinate(coord, size, padding_mode, align_corners):
    if padding_mode == _BORDER:
        return jnp.clip(coord, 0, size - 1)
    if padding_mode == _REFLECTION:
        coord = (_reflect(coord, 0, 2 * (size - 1)) if align_corners
                 else _reflect(coord, -1, 2 * size - 1))
        return jnp.clip(coord, 0, size - 1)
    return coord


def _unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners):
    nd = grid.shape[-1]
    n, c = input.shape[:2]
    sizes = input.shape[2:]
    out_shape = grid.shape[1:-1]
    x = _acc(input).reshape(n, c, -1)
    g = _acc(grid).reshape(n, -1, nd)
    # grid's last axis is (x, y[, z]): W first; sizes are (..., H, W)
    coords = [_unnormalize(g[..., nd - 1 - i], sizes[i], align_corners) for i in range(nd)]

    def read(points):
        """input at integer points (one array per dim, (n, P)); 0 outside."""
        valid = functools.reduce(jnp.logical_and, [(p >= 0) & (p < s) for p, s in zip(points, sizes)])
        flat = _plane_positions([jnp.clip(p, 0, s - 1) for p, s in zip(points, sizes)], sizes)
        values = jnp.take_along_axis(x, flat[:, None, :].astype(jnp.int64), axis=2)
        return jnp.where(valid[:, None, :], values, 0)

    if interpolation_mode == _BICUBIC:
        base = [jnp.floor(co) for co in coords]
        t = [co - b for co, b in zip(coords, base)]
        a = _CUBIC_A
        near = lambda v: ((a + 2) * v - (a + 3)) * v * v + 1          # noqa: E731
        far = lambda v: ((a * v - 5 * a) * v + 8 * a) * v - 4 * a     # noqa: E731
        w = [[far(tt + 1), near(tt), near(1 - tt), far(2 - tt)] for tt in t]
        # rows (y) outer, columns (x) inner, as torch sums them
        result = 0
        for j in range(4):
            row = 0
            for i in range(4):
                ys = _padded_coordinate(base[0] - 1 + j, sizes[0], padding_mode, align_corners)
                xs = _padded_coordinate(base[1] - 1 + i, sizes[1], padding_mode, align_corners)
                row = row + read([ys.astype(jnp.int64), xs.astype(jnp.int64)]) * w[1][i][:, None, :]
            result = result + row * w[0][j][:, None, :]
        return result.reshape(n, c, *out_shape)
    coords = [_padded_coordinate(co, s, padding_mode, align_corners) for co, s in zip(coords, sizes)]
    if interpolation_mode == _NEAREST:
        # nearbyint: halves to even, as jnp.round does
        return read([jnp.round(co).astype(jnp.int64) for co in coords]).reshape(n, c, *out_shape)
    low = [jnp.floor(co) for co in coords]
    result = 0
    for corner in itertools.product((0, 1), repeat=nd):
        weight = 1
        for i in reversed(range(nd)):   # torch multiplies the x factor first
            weight = weight * ((low[i] + 1 - coords[i]) if corner[i] == 0 else (coords[i] - low[i]))
        points = [(low[i] + corner[i]).astype(jnp.int64) for i in range(nd)]
        result = result + read(points) * weight[:, None, :]
    return result.reshape(n, c, *out_shape)


@lowers("aten::grid_sampler_2d", "aten::grid_sampler_3d")
def grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners)


@lowers("aten::grid_sampler_2d_backward", "aten::grid_sampler_3d_backward")
def grid_sampler_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
                          output_mask):
    """JAX's vjp of the forward lowering."""
    _, vjp = jax.vjp(lambda i, g: _grid_sample(i, g, interpolation_mode, padding_mode, align_corners),
                     _acc(input), _acc(grid))
    grad_input, grad_grid = vjp(_acc(grad_output))
    return (grad_input if output_mask[0] else None, grad_grid if output_mask[1] else None)


# -- distances ------------------------------------------------------------------------
def _p_norm(diff, p, axis):
    a = jnp.abs(diff)
    if p == 0:
        return (a != 0).sum(axis=axis).astype(diff.dtype)
    if p == float("inf"):
        return a.max(axis=axis)
    if p == 1:
        return a.sum(axis=axis)
    if p == 2:
        return jnp.sqrt(jnp.square(a).sum(axis=axis))
    return (a ** p).sum(axis=axis) ** (1.0 / p)


@lowers("aten::_cdist_forward")
def _cdist_forward(x1, x2, p, compute_mode):
    """Distances between the rows of x1 (.., P, M) and x2 (.., R, M): (.., P, R)."""
    a, b = _acc(x1), _acc(x2)
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    if a.shape[-1] == 0:
        return jnp.zeros(batch + (a.shape[-2], b.shape[-2]), a.dtype)
    return _p_norm(a[..., :, None, :] - b[..., None, :, :], p, -1)


@lowers("aten::_pdist_forward")
def _pdist_forward(self, p=2.0):
    """Distances between each pair of rows i < j, in row-major order of (i, j)."""
    x = _acc(self)
    i, j = np.triu_indices(x.shape[0], 1)
    if x.shape[1] == 0:
        return jnp.zeros(len(i), x.dtype)
    return _p_norm(x[i] - x[j], p, -1)


# -- elementwise losses and activations with their own kernels ------------------------
@lowers("aten::_prelu_kernel")
def _prelu_kernel(self, weight):
    return jnp.where(self > 0, self, weight * self)


@lowers("aten::_prelu_kernel_backward")
def _prelu_kernel_backward(grad_output, self, weight):
    positive = self > 0
    return (jnp.where(positive, grad_output, weight * grad_output),
            jnp.where(positive, 0, self * grad_output))


def _smooth_l1(diff, beta):
    a = jnp.abs(diff)
    if beta == 0:
        return a
    return jnp.where(a < beta, 0.5 * diff * diff / beta, a - 0.5 * beta)


@lowers("aten::smooth_l1_loss")
def smooth_l1_loss(self, target, reduction=_MEAN, beta=1.0):
    return _reduce(_smooth_l1(_acc(self) - _acc(target), beta), reduction)


@lowers("aten::smooth_l1_loss_backward")
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    diff = _acc(self) - _acc(target)
    norm = 1.0 / math.prod(self.shape) if reduction == _MEAN else 1.0
    if beta == 0:
        grad = jnp.sign(diff)
    else:
        grad = jnp.where(diff < -beta, -1.0, jnp.where(diff > beta, 1.0, diff / beta))
    return jnp.broadcast_to(norm * grad * _acc(grad_output), self.shape)


@lowers("aten::huber_loss")
def huber_loss(self, target, reduction=_MEAN, delta=1.0):
    diff = _acc(self) - _acc(target)
    a = jnp.abs(diff)
    return _reduce(jnp.where(a < delta, 0.5 * diff * diff, delta * (a - 0.5 * delta)), reduction)


@lowers("aten::huber_loss_backward")
def huber_loss_backward(grad_output, self, target, reduction, delta):
    diff = _acc(self) - _acc(target)
    norm = 1.0 / math.prod(self.shape) if reduction == _MEAN else 1.0
    grad = jnp.where(diff < -delta, -delta, jnp.where(diff > delta, delta, diff))
    return jnp.broadcast_to(norm * grad * _acc(grad_output), self.shape)
