"""Shape and layout ops: views (and their functional `_copy` forms), reshape,
permute, expand, slicing, concatenation, splitting, padding, flips, and the
scatter-into-a-view ops.

A lazy tensor owns just its own elements, in row-major order: a view is a new
value computed from its base (functionalization replays writes through the
`*_scatter` ops below), and `as_strided` addresses that row-major storage.
Index arithmetic that depends only on shapes is done at trace time: XLA
sees slices, and gathers by iotas or small constants.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .dtypes import _promote, jax_dtype, torch_dtype
from .registry import lowers
from .verdicts import NeedsEager


# -- helpers ------------------------------------------------------------------------
def _dim(dim: int, ndim: int) -> int:
    """torch's wrap of a dim index: a 0-d tensor takes dims 0 and -1."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


def _dims(dims, ndim: int) -> tuple[int, ...]:
    return tuple(_dim(d, ndim) for d in dims)


def _clamp_slice(start, end, step, length):
    """torch's slice bounds: None means the end, negatives count from the end,
    both clamp to [0, length], and an end before the start is an empty slice."""
    if step <= 0:
        raise ValueError("slice step must be positive")
    start = 0 if start is None else start
    end = length if end is None else end
    if start < 0:
        start += length
    if end < 0:
        end += length
    start = min(max(start, 0), length)
    end = min(max(end, start), length)
    return start, end


def _slice(x, dim, start, end, step):
    if x.ndim == 0:
        return x
    start, end = _clamp_slice(start, end, step, x.shape[dim])
    return lax.slice_in_dim(x, start, end, step, axis=dim)


def _common_dtype(arrays):
    """torch's promotion across tensors that cat / stack join."""
    return jax_dtype(_promote([torch_dtype(a.dtype) for a in arrays]))


def _strided_indices(size, stride, storage_offset):
    """Flat row-major positions that as_strided(size, stride, offset) reads
    (iotas in the graph, not a constant the size of the output)."""
    size = tuple(size)
    index = jnp.full(size, storage_offset or 0, dtype=jnp.int64)
    for d, st in enumerate(stride):
        if size[d] > 1 and st:
            index = index + lax.broadcasted_iota(jnp.int64, size, d) * st
    return index


def _diagonal_indices(shape, offset, dim1, dim2):
    """(rows, cols) of the diagonal `offset` of the (dim1, dim2) plane."""
    rows, cols = shape[dim1], shape[dim2]
    if offset >= 0:
        length = max(min(rows, cols - offset), 0)
        return np.arange(length), np.arange(length) + offset
    length = max(min(rows + offset, cols), 0)
    return np.arange(length) - offset, np.arange(length)


def _identity(self, *args, **kwargs):
    return self


# -- views and their _copy forms: reshape ---------------------------------------------
lowers("aten::alias", "aten::alias_copy", "aten::clone", "aten::lift_fresh_copy", "aten::lift",
       "aten::lift_fresh", "aten::detach", "aten::detach_copy", "aten::contiguous")(_identity)


@lowers("aten::view.default", "aten::_unsafe_view", "aten::reshape",
        "aten::_reshape_copy", "aten::_reshape_alias", "aten::_reshape_alias_copy")
def view(self, size, *args, **kwargs):
    """`size` may hold one -1 (jnp infers it as torch does)."""
    return jnp.reshape(self, tuple(size))


def _view_copy_meta(self, size):
    """Eager's view_copy copies what view's strides cannot give; its Python reference, the meta
    kernel, raises instead. Functionalization writes through views with it: zero_ on
    `t.t().flatten().view(5, 4).t()` gives a value laid out row-major (zero's meta kernel, where
    eager's keeps self's strides), whose inverse view_copy the reference refused."""
    return self.reshape(size).contiguous()


lowers("aten::view_copy.default", meta=_view_copy_meta)(view)


@lowers("aten::view.dtype", "aten::view_copy.dtype")
def view_dtype(self, dtype):
    """Reinterpret the bytes: elements of another width change the last dim."""
    target = jnp.dtype(jax_dtype(dtype))
    source = self.dtype
    as_bits = self.astype(jnp.uint8) if source == jnp.bool_ else self
    bits_target = jnp.uint8 if target == jnp.bool_ else target
    if jnp.dtype(bits_target).itemsize == as_bits.dtype.itemsize:
        out = lax.bitcast_convert_type(as_bits, bits_target)
    elif jnp.dtype(bits_target).itemsize < as_bits.dtype.itemsize:
        out = lax.bitcast_convert_type(as_bits, bits_target)  # adds a trailing dim
        out = out.reshape(*self.shape[:-1], -1) if self.ndim else out.reshape(-1)
    else:
        ratio = jnp.dtype(bits_target).itemsize // as_bits.dtype.itemsize
        out = lax.bitcast_convert_type(as_bits.reshape(*self.shape[:-1], -1, ratio), bits_target)
    return out != 0 if target == jnp.bool_ else out


@lowers("aten::flatten.using_ints")
def flatten(self, start_dim=0, end_dim=-1):
    if self.ndim == 0:
        return self.reshape(1)
    start, end = _dim(start_dim, self.ndim), _dim(end_dim, self.ndim)
    return self.reshape(*self.shape[:start], math.prod(self.shape[start:end + 1]), *self.shape[end + 1:])


@lowers("aten::unflatten.int")
def unflatten(self, dim, sizes):
    dim = _dim(dim, self.ndim)
    return self.reshape(*self.shape[:dim], *sizes, *self.shape[dim + 1:])


@lowers("aten::ravel")
def ravel(self):
    return self.reshape(-1)


@lowers("aten::view_as", "aten::reshape_as")
def view_as(self, other):
    return self.reshape(other.shape)


def _at_least(ndim, place):
    """atleast_1d / 2d / 3d of one tensor or a list of them."""
    def one(x):
        while x.ndim < ndim:
            x = place(x)
        return x

    def lowering(tensors):
        return tuple(one(t) for t in tensors) if isinstance(tensors, (list, tuple)) else one(tensors)
    return lowering


lowers("aten::atleast_1d")(_at_least(1, lambda x: x.reshape(1)))
lowers("aten::atleast_2d")(_at_least(2, lambda x: x[None]))
# a 1-d (n,) becomes (1, n, 1), a 2-d (m, n) becomes (m, n, 1)
lowers("aten::atleast_3d")(_at_least(3, lambda x: x[None] if x.ndim == 0 else x[..., None] if x.ndim == 2
                                     else x[None, :, None]))


@lowers("aten::broadcast_tensors")
def broadcast_tensors(tensors):
    return tuple(jnp.broadcast_arrays(*tensors))


# -- permutations ---------------------------------------------------------------------
@lowers("aten::permute", "aten::permute_copy")
def permute(self, dims):
    return jnp.transpose(self, _dims(dims, self.ndim)) if self.ndim else self


@lowers("aten::t", "aten::t_copy", "aten::numpy_T")
def t(self):
    return self.T if self.ndim >= 2 else self


@lowers("aten::transpose.int", "aten::transpose_copy.int", "aten::swapaxes", "aten::swapdims")
def transpose(self, dim0, dim1):
    if self.ndim == 0:
        _dims((dim0, dim1), 0)  # 0 and -1 only, as torch checks
        return self
    return jnp.swapaxes(self, _dim(dim0, self.ndim), _dim(dim1, self.ndim))


@lowers("aten::movedim", "aten::moveaxis")
def movedim(self, source, destination):
    if isinstance(source, int):
        source, destination = [source], [destination]
    if self.ndim == 0:
        return self
    return jnp.moveaxis(self, _dims(source, self.ndim), _dims(destination, self.ndim))


@lowers("aten::mT")
def matrix_transpose(self):
    return jnp.swapaxes(self, -1, -2)


@lowers("aten::mH", "aten::adjoint")
def matrix_adjoint(self):
    return jnp.conj(jnp.swapaxes(self, -1, -2))


# -- expand, squeeze, unsqueeze ---------------------------------------------------------
def _expanded_shape(shape, size):
    leading = len(size) - len(shape)
    if leading < 0:
        raise ValueError(f"expand: the number of sizes ({len(size)}) is less than the tensor's dims ({len(shape)})")
    out = []
    for i, s in enumerate(size):
        if s == -1:
            if i < leading:
                raise ValueError("expand: -1 is not allowed in a leading, non-existing dimension")
            s = shape[i - leading]
        out.append(s)
    return tuple(out)


@lowers("aten::expand", "aten::expand_copy")
def expand(self, size, *, implicit=False):
    return jnp.broadcast_to(self, _expanded_shape(self.shape, size))


@lowers("aten::expand_as")
def expand_as(self, other):
    return jnp.broadcast_to(self, other.shape)


@lowers("aten::broadcast_to")
def broadcast_to(self, size):
    return expand(self, size)


@lowers("aten::squeeze", "aten::squeeze_copy")
def squeeze(self, dim=None):
    if self.ndim == 0:
        if dim is not None:
            _dims([dim] if isinstance(dim, int) else dim, 0)
        return self
    if dim is None:
        dims = range(self.ndim)
    else:
        dims = _dims([dim] if isinstance(dim, int) else dim, self.ndim)
    return jnp.squeeze(self, tuple(d for d in set(dims) if self.shape[d] == 1))


@lowers("aten::unsqueeze", "aten::unsqueeze_copy")
def unsqueeze(self, dim):
    return jnp.expand_dims(self, _dim(dim, self.ndim + 1))


# -- slicing ----------------------------------------------------------------------------
@lowers("aten::slice.Tensor", "aten::slice_copy.Tensor")
def slice_(self, dim=0, start=None, end=None, step=1):
    return _slice(self, _dim(dim, self.ndim), start, end, step)


@lowers("aten::select.int", "aten::select_copy.int")
def select(self, dim, index):
    dim = _dim(dim, self.ndim)
    length = self.shape[dim]
    if not -length <= index < length:
        raise IndexError(f"select(): index {index} out of range for tensor of size {self.shape} at dim {dim}")
    return lax.index_in_dim(self, index % length, axis=dim, keepdims=False)


def _narrow(self, dim, start, length):
    dim = _dim(dim, self.ndim)
    size = self.shape[dim]
    if isinstance(start, int):
        if start < 0:
            start += size
        return lax.slice_in_dim(self, start, start + length, axis=dim)
    start = jnp.asarray(start).astype(jnp.int64)
    start = jnp.where(start < 0, start + size, start)
    return lax.dynamic_slice_in_dim(self, start, length, axis=dim)


lowers("aten::narrow", "aten::narrow_copy")(_narrow)


@lowers("aten::diagonal.default", "aten::diagonal_copy.default", "aten::linalg_diagonal")
def diagonal_view(self, offset=0, dim1=0, dim2=1):
    dim1, dim2 = _dim(dim1, self.ndim), _dim(dim2, self.ndim)
    if dim1 == dim2:
        raise ValueError("diagonal dimensions cannot be identical")
    rows, cols = _diagonal_indices(self.shape, offset, dim1, dim2)
    moved = jnp.moveaxis(self, (dim1, dim2), (-2, -1))
    return moved[..., rows, cols]


def _strided_in_bounds(self, size, stride, storage_offset=None):
    """A lazy tensor owns just its own elements, in row-major order; XLA clamps
    (as_strided) or drops (as_strided_scatter) an access past them, where eager
    torch raises. Such a node runs eagerly, so the user sees torch's error."""
    if any(s == 0 for s in size):
        return
    last = (storage_offset or 0) + sum((s - 1) * st for s, st in zip(size, stride))
    if last >= math.prod(self.shape):
        raise NeedsEager(f"reads element {last} of a tensor of {math.prod(self.shape)}")


@lowers("aten::as_strided", "aten::as_strided_copy", guard=_strided_in_bounds)
def as_strided(self, size, stride, storage_offset=None):
    """A gather of the row-major storage (its guard sends reads past it to
    eager torch, which raises)."""
    index = _strided_indices(size, stride, storage_offset)
    if index.size == 0:
        return jnp.zeros(index.shape, self.dtype)
    return jnp.take(self.reshape(-1), index)


@lowers("aten::unfold", "aten::unfold_copy")
def unfold(self, dimension, size, step):
    if self.ndim == 0:
        return self.reshape(1)[:size]
    dim = _dim(dimension, self.ndim)
    count = (self.shape[dim] - size) // step + 1
    index = jnp.arange(count)[:, None] * step + jnp.arange(size)[None, :]
    windows = jnp.take(self, index.reshape(-1), axis=dim)
    windows = windows.reshape(*self.shape[:dim], count, size, *self.shape[dim + 1:])
    return jnp.moveaxis(windows, dim + 1, -1)


@lowers("aten::unfold_backward")
def unfold_backward(grad_in, input_sizes, dim, size, step):
    zeros = jnp.zeros(tuple(input_sizes), grad_in.dtype)
    _, vjp = jax.vjp(lambda x: unfold(x, dim, size, step), zeros)
    return vjp(grad_in)[0]


# -- splitting ----------------------------------------------------------------------------
def _split_sizes(length: int, split_size: int) -> list[int]:
    if split_size == 0 and length == 0:
        return [0]
    if split_size <= 0:
        raise ValueError(f"split expects split_size be positive, but got split_size={split_size}")
    count = max((length + split_size - 1) // split_size, 1)
    return [split_size] * (count - 1) + [length - split_size * (count - 1)]


def _pieces(self, sizes, dim):
    out, offset = [], 0
    for size in sizes:
        out.append(lax.slice_in_dim(self, offset, offset + size, axis=dim))
        offset += size
    if offset != self.shape[dim]:
        raise ValueError(f"split_with_sizes expects split_sizes to sum exactly to {self.shape[dim]}")
    return tuple(out)


@lowers("aten::split.Tensor", "aten::split_copy.Tensor", "aten::unsafe_split.Tensor")
def split(self, split_size, dim=0):
    dim = _dim(dim, self.ndim)
    return _pieces(self, _split_sizes(self.shape[dim], split_size), dim)


@lowers("aten::split_with_sizes", "aten::split_with_sizes_copy", "aten::unsafe_split_with_sizes",
        "aten::split.sizes")
def split_with_sizes(self, split_sizes, dim=0):
    return _pieces(self, split_sizes, _dim(dim, self.ndim))


@lowers("aten::unbind.int", "aten::unbind_copy.int")
def unbind(self, dim=0):
    dim = _dim(dim, self.ndim)
    return tuple(lax.index_in_dim(self, i, axis=dim, keepdims=False) for i in range(self.shape[dim]))


@lowers("aten::chunk", "aten::unsafe_chunk")
def chunk(self, chunks, dim=0):
    dim = _dim(dim, self.ndim)
    return split(self, -(-self.shape[dim] // chunks) if self.shape[dim] else 0, dim)


@lowers("aten::tensor_split.sections")
def tensor_split_sections(self, sections, dim=0):
    dim = _dim(dim, self.ndim)
    length = self.shape[dim]
    base, extra = divmod(length, sections)
    return _pieces(self, [base + 1] * extra + [base] * (sections - extra), dim)


@lowers("aten::tensor_split.indices")
def tensor_split_indices(self, indices, dim=0):
    dim = _dim(dim, self.ndim)
    bounds = [0, *indices, self.shape[dim]]
    return tuple(_slice(self, dim, a, b, 1) for a, b in zip(bounds, bounds[1:]))


# -- joining ----------------------------------------------------------------------------------
@lowers("aten::cat", "aten::concat", "aten::concatenate")
def cat(tensors, dim=0):
    """1-d empty inputs are skipped (torch's legacy rule); all take torch's
    promoted dtype."""
    dtype = _common_dtype(tensors)
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return jnp.zeros((0,), dtype)
    dim = _dim(dim, kept[0].ndim)
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=dim)


@lowers("aten::stack")
def stack(tensors, dim=0):
    dtype = _common_dtype(tensors)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=_dim(dim, tensors[0].ndim + 1))


@lowers("aten::hstack")
def hstack(tensors):
    tensors = [jnp.atleast_1d(t) for t in tensors]
    return cat(tensors, 0 if tensors[0].ndim == 1 else 1)


@lowers("aten::vstack", "aten::row_stack")
def vstack(tensors):
    return cat([jnp.atleast_2d(t) for t in tensors], 0)


@lowers("aten::dstack")
def dstack(tensors):
    return cat([jnp.atleast_3d(t) for t in tensors], 2)


@lowers("aten::column_stack")
def column_stack(tensors):
    return cat([t.reshape(-1, 1) if t.ndim <= 1 else t for t in tensors], 1)


@lowers("aten::_chunk_cat")
def _chunk_cat(tensors, dim, num_chunks):
    """Each tensor split into num_chunks along dim (zero-padded to a
    multiple), its chunks flattened, joined along dim + 1."""
    dim = _dim(dim, tensors[0].ndim)
    dtype = _common_dtype(tensors)
    pieces = []
    for t in tensors:
        size = t.shape[dim]
        padded = -(-size // num_chunks) * num_chunks
        if padded != size:
            pad = [(0, 0)] * t.ndim
            pad[dim] = (0, padded - size)
            t = jnp.pad(t, pad)
        pieces.append(t.astype(dtype).reshape(*t.shape[:dim], num_chunks, -1))
    return jnp.concatenate(pieces, axis=dim + 1)


@lowers("aten::block_diag")
def block_diag(tensors):
    dtype = _common_dtype(tensors)
    mats = [t.reshape(1, -1) if t.ndim == 1 else t.reshape(1, 1) if t.ndim == 0 else t for t in tensors]
    rows = sum(m.shape[0] for m in mats)
    cols = sum(m.shape[1] for m in mats)
    out = jnp.zeros((rows, cols), dtype)
    r = c = 0
    for m in mats:
        out = lax.dynamic_update_slice(out, m.astype(dtype), (r, c))
        r, c = r + m.shape[0], c + m.shape[1]
    return out


# -- flips, rolls, repeats -------------------------------------------------------------------
@lowers("aten::flip")
def flip(self, dims):
    if self.ndim == 0:
        return self
    return jnp.flip(self, _dims(dims, self.ndim)) if dims else self


@lowers("aten::fliplr")
def fliplr(self):
    return jnp.flip(self, 1)


@lowers("aten::flipud")
def flipud(self):
    return jnp.flip(self, 0)


@lowers("aten::roll")
def roll(self, shifts, dims=()):
    if not dims:
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    dims = _dims(dims, self.ndim)
    if self.ndim == 0:
        return self
    return jnp.roll(self, tuple(shifts), dims)


@lowers("aten::rot90")
def rot90(self, k=1, dims=(0, 1)):
    return jnp.rot90(self, k, axes=_dims(dims, self.ndim))


@lowers("aten::repeat")
def repeat(self, repeats):
    repeats = tuple(repeats)
    if len(repeats) < self.ndim:
        raise ValueError("Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor")
    x = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    return jnp.tile(x, repeats)


@lowers("aten::tile")
def tile(self, dims):
    dims = tuple(dims)
    return repeat(self, (1,) * (self.ndim - len(dims)) + dims)


# -- padding ----------------------------------------------------------------------------------
def _pad_value(value, dtype):
    """torch casts the pad value to the tensor's dtype (a float truncates to an int)."""
    if dtype == jnp.bool_:
        return jnp.asarray(bool(value))
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.asarray(value, dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        value = int(value.real) if isinstance(value, complex) else int(value)
        return jnp.asarray(value).astype(dtype)
    return jnp.asarray(value.real if isinstance(value, complex) else value).astype(dtype)


@lowers("aten::constant_pad_nd")
def constant_pad_nd(self, pad, value=0):
    """pad: (before, after) pairs from the last dim backwards; negative crops."""
    if len(pad) % 2 or len(pad) // 2 > self.ndim:
        raise ValueError("constant_pad_nd: padding length must be even and at most twice the dims")
    config = [(0, 0, 0)] * self.ndim
    for i in range(len(pad) // 2):
        config[self.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    for d, (lo, hi, _) in enumerate(config):
        if self.shape[d] + lo + hi < 0:
            raise ValueError(f"constant_pad_nd: the padded size of dim {d} would be negative")
    if isinstance(value, (bool, int, float, complex)):
        value = _pad_value(value, self.dtype)
    else:
        value = jnp.asarray(value).astype(self.dtype)
    return lax.pad(self, value, config)


def _take_static(x, index: np.ndarray, axis: int):
    """x at constant positions along axis: runs of consecutive, reversed or
    repeated positions become slices, reversals and broadcasts (a gather only
    where there would be many runs)."""
    runs, start = [], 0
    while start < len(index):
        end = start + 1
        step = int(index[end] - index[start]) if end < len(index) else 1
        step = step if step in (-1, 0, 1) else 1
        while end < len(index) and index[end] - index[end - 1] == step:
            end += 1
        runs.append((int(index[start]), int(index[end - 1]), end - start, step))
        start = end
    if not runs or len(runs) > 8:
        return jnp.take(x, index, axis=axis)
    pieces = []
    for first, last, count, step in runs:
        if step == 0 and count > 1:
            piece = lax.slice_in_dim(x, first, first + 1, axis=axis)
            pieces.append(jnp.repeat(piece, count, axis=axis))
        elif step == -1 and count > 1:
            pieces.append(lax.rev(lax.slice_in_dim(x, last, first + 1, axis=axis), (axis,)))
        else:
            pieces.append(lax.slice_in_dim(x, first, last + 1, axis=axis))
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=axis)


def _pad_by_index(self, padding, source_index):
    """Along each padded dim (the last len(padding) // 2, from the last
    backwards), position i of the output, i in [-before, n + after), reads
    input position source_index(i, n); negative pads crop."""
    out = self
    for i in range(len(padding) // 2):
        dim = self.ndim - 1 - i
        before, after = padding[2 * i], padding[2 * i + 1]
        n = self.shape[dim]
        if n + before + after < 0 or (n == 0 and before + after > 0):
            raise ValueError(f"padding {before, after} of a dim of size {n}")
        out = _take_static(out, source_index(np.arange(-before, n + after), n), dim)
    return out


def _reflect(positions, n):
    period = max(2 * (n - 1), 1)
    p = np.abs(positions) % period
    return np.where(p >= n, period - p, p)


def _replicate(positions, n):
    return np.clip(positions, 0, n - 1)


def _reflection_pad(self, padding):
    return _pad_by_index(self, padding, _reflect)


def _replication_pad(self, padding):
    return _pad_by_index(self, padding, _replicate)


def _pad_backward(forward):
    def backward(grad_output, self, padding):
        _, vjp = jax.vjp(lambda x: forward(x, padding), jnp.zeros(self.shape, grad_output.dtype))
        return vjp(grad_output)[0]
    return backward


for _n in (1, 2, 3):
    lowers(f"aten::reflection_pad{_n}d")(_reflection_pad)
    lowers(f"aten::replication_pad{_n}d")(_replication_pad)
    lowers(f"aten::reflection_pad{_n}d_backward")(_pad_backward(_reflection_pad))
    lowers(f"aten::replication_pad{_n}d_backward")(_pad_backward(_replication_pad))


@lowers("aten::_pad_circular")
def _pad_circular(self, pad):
    return _pad_by_index(self, pad, lambda positions, n: positions % n)


@lowers("aten::pad")
def pad(self, pad, mode="constant", value=None):
    if mode == "constant":
        return constant_pad_nd(self, pad, 0 if value is None else value)
    if value is not None and value != 0:
        raise ValueError(f"padding mode {mode!r} doesn't take a value")
    source_index = {"reflect": _reflect, "replicate": _replicate, "circular": lambda p, n: p % n}[mode]
    return _pad_by_index(self, pad, source_index)


# -- writing into a view ------------------------------------------------------------------------
@lowers("aten::slice_scatter")
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    dim = _dim(dim, self.ndim)
    start, end = _clamp_slice(start, end, step, self.shape[dim])
    index = [slice(None)] * self.ndim
    index[dim] = slice(start, end, step)
    return self.at[tuple(index)].set(src.astype(self.dtype))


@lowers("aten::select_scatter")
def select_scatter(self, src, dim, index):
    dim = _dim(dim, self.ndim)
    at = [slice(None)] * self.ndim
    at[dim] = index % self.shape[dim]
    return self.at[tuple(at)].set(src.astype(self.dtype))


@lowers("aten::diagonal_scatter")
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    dim1, dim2 = _dim(dim1, self.ndim), _dim(dim2, self.ndim)
    rows, cols = _diagonal_indices(self.shape, offset, dim1, dim2)
    moved = jnp.moveaxis(self, (dim1, dim2), (-2, -1))
    moved = moved.at[..., rows, cols].set(src.astype(self.dtype))
    return jnp.moveaxis(moved, (-2, -1), (dim1, dim2))


@lowers("aten::as_strided_scatter",
        guard=lambda self, src, *args, **kwargs: _strided_in_bounds(self, *args, **kwargs))
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    """Where src's elements share a storage place (overlapping windows), the one that
    differs from what is there is written: functionalization scatters a view written
    through (`u[:, 0] = -1` on an unfold) with its unchanged elements too, and eager
    wrote only the changed ones. Elsewhere that is every element."""
    index = _strided_indices(size, stride, storage_offset).reshape(-1)
    if index.size == 0:
        return self
    flat, new = self.reshape(-1), src.astype(self.dtype).reshape(-1)
    old = flat[index]
    same = (new == old) | (jnp.isnan(new) & jnp.isnan(old)) if jnp.issubdtype(new.dtype, jnp.inexact) else new == old
    changed = jnp.where(same, flat.size, index)  # unchanged: out of range, dropped
    return flat.at[changed].set(new, mode="drop").reshape(self.shape)


@lowers("aten::select_backward")
def select_backward(grad_output, input_sizes, dim, index):
    return select_scatter(jnp.zeros(tuple(input_sizes), grad_output.dtype), grad_output, dim, index)


@lowers("aten::slice_backward")
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    return slice_scatter(jnp.zeros(tuple(input_sizes), grad_output.dtype), grad_output, dim, start, end, step)


@lowers("aten::diagonal_backward")
def diagonal_backward(grad_output, input_sizes, offset, dim1, dim2):
    return diagonal_scatter(jnp.zeros(tuple(input_sizes), grad_output.dtype), grad_output, offset, dim1, dim2)


# -- triangles and diagonals ---------------------------------------------------------------------
@lowers("aten::tril")
def tril(self, diagonal=0):
    return jnp.tril(self, diagonal)


@lowers("aten::triu")
def triu(self, diagonal=0):
    return jnp.triu(self, diagonal)


@lowers("aten::diag_embed")
def diag_embed(self, offset=0, dim1=-2, dim2=-1):
    ndim = self.ndim + 1
    dim1, dim2 = _dim(dim1, ndim), _dim(dim2, ndim)
    n = self.shape[-1] + abs(offset) if self.ndim else 1 + abs(offset)
    src = self if self.ndim else self.reshape(1)
    # the output's dims other than dim1, dim2 are the input's leading dims, in order
    out = jnp.zeros((*src.shape[:-1], n, n), self.dtype)
    rows, cols = _diagonal_indices((n, n), offset, 0, 1)
    out = out.at[..., rows, cols].set(src)
    return jnp.moveaxis(out, (-2, -1), (dim1, dim2))


@lowers("aten::diag")
def diag(self, diagonal=0):
    if self.ndim == 1:
        return diag_embed(self, diagonal, 0, 1)
    if self.ndim == 2:
        return diagonal_view(self, diagonal, 0, 1)
    raise ValueError("diag(): Supports 1D or 2D tensors")


# -- complex views -------------------------------------------------------------------------------
@lowers("aten::view_as_real", "aten::view_as_real_copy")
def view_as_real(self):
    return jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)


@lowers("aten::view_as_complex", "aten::view_as_complex_copy")
def view_as_complex(self):
    return lax.complex(self[..., 0], self[..., 1])


@lowers("aten::_conj", "aten::_conj_copy")
def conj_view(self):
    """A lazy value holds its elements, never a conjugate bit: the view is the
    conjugated value, and resolving the bit is nothing to do."""
    return jnp.conj(self)


@lowers("aten::_neg_view", "aten::_neg_view_copy")
def neg_view(self):
    return -self


lowers("aten::resolve_conj", "aten::resolve_neg")(_identity)


@lowers("aten::real")
def real(self):
    return jnp.real(self)


@lowers("aten::imag")
def imag(self):
    return jnp.imag(self)


# -- shuffles -----------------------------------------------------------------------------------
@lowers("aten::pixel_shuffle")
def pixel_shuffle(self, upscale_factor):
    r = upscale_factor
    *batch, c, h, w = self.shape
    x = self.reshape(*batch, c // (r * r), r, r, h, w)
    n = len(batch)
    x = jnp.transpose(x, (*range(n), n, n + 3, n + 1, n + 4, n + 2))
    return x.reshape(*batch, c // (r * r), h * r, w * r)


@lowers("aten::pixel_unshuffle")
def pixel_unshuffle(self, downscale_factor):
    r = downscale_factor
    *batch, c, h, w = self.shape
    x = self.reshape(*batch, c, h // r, r, w // r, r)
    n = len(batch)
    x = jnp.transpose(x, (*range(n), n, n + 2, n + 4, n + 1, n + 3))
    return x.reshape(*batch, c * r * r, h // r, w // r)


@lowers("aten::channel_shuffle", "aten::native_channel_shuffle")
def channel_shuffle(self, groups):
    b, c, *rest = self.shape
    x = self.reshape(b, groups, c // groups, *rest)
    return jnp.swapaxes(x, 1, 2).reshape(self.shape)



# -- PyTorch's primitives (torch._prims), where its decompositions reach them ----------------------
@lowers("prims::broadcast_in_dim")
def prims_broadcast_in_dim(a, shape, broadcast_dimensions):
    return lax.broadcast_in_dim(a, tuple(shape), tuple(broadcast_dimensions))


@lowers("prims::squeeze")
def prims_squeeze(a, dimensions):
    return jnp.squeeze(a, tuple(dimensions)) if dimensions else a


@lowers("prims::transpose")
def prims_transpose(a, permutation):
    return jnp.transpose(a, tuple(permutation)) if a.ndim else a


@lowers("prims::collapse_view", "prims::collapse")
def prims_collapse(a, start, end):
    """Dims start..end (inclusive) merged into one."""
    if a.ndim == 0:
        return a.reshape(1)
    return a.reshape(*a.shape[:start], math.prod(a.shape[start:end + 1]), *a.shape[end + 1:])


@lowers("prims::split_dim")
def prims_split_dim(a, dim, outer_length):
    return a.reshape(*a.shape[:dim], outer_length, a.shape[dim] // outer_length, *a.shape[dim + 1:])


@lowers("prims::rev")
def prims_rev(a, dims):
    return jnp.flip(a, tuple(dims)) if dims else a


@lowers("prims::cat")
def prims_cat(tensors, dim):
    return jnp.concatenate(tensors, axis=dim)


@lowers("prims::reshape")
def prims_reshape(a, shape):
    return jnp.reshape(a, tuple(shape))


lowers("prims::view_of", "prims::clone", "prims::copy_strided")(_identity)
lowers("prims::as_strided")(as_strided)
lowers("prims::as_strided_scatter")(as_strided_scatter)
