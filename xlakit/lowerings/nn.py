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
from jax import lax

from . import jax_dtype, lowers

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

    _, vjp = jax.vjp(forward, input, weight)
    grad_input, grad_weight = vjp(grad_output.astype(input.dtype))
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
    """softmax, with 0 where a whole row is -inf (attention rows fully masked)."""
    x = self.astype(jax_dtype(dtype)) if dtype is not None else self
    out = _softmax_of(x, dim)
    if x.ndim == 0:
        return jnp.where(x == -jnp.inf, 0, out)
    return jnp.where((x == -jnp.inf).all(axis=dim, keepdims=True), 0, out)


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
    return grad_output * mask.astype(grad_output.dtype) * jnp.asarray(scale, grad_output.dtype)


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
