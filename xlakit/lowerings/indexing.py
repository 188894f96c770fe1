"""Indexing ops: advanced indexing, gather/scatter, index_select/add/copy/fill,
index_put, masked ops, embedding and its backward, searchsorted, isin.

Index semantics are eager torch's for in-range indices: negative indices wrap
where torch wraps them (index, index_put, index_fill, take, put: jnp's
indexing normalizes negative indices as NumPy does). Where eager torch raises
on a negative index (gather, scatter, index_select/add/copy/reduce,
embedding) it is out of range. XLA clamps, drops or wraps an out-of-range
index where eager torch raises, so each op states eager's check
(checks.require: computed in the executable, raised as eager's exception
after the step); the `_unsafe_*` ops, which torch's decompositions make with
in-range indices, are not checked, as in eager. A write of
several values to one place keeps one of them, as torch's does (which one is
unspecified in both); an accumulating write sums them all. A boolean mask
index selects a data-dependent number of elements: it runs eagerly, except
`x[mask] = v` (and +=) where v does not depend on that number, a select.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from ..core import checks
from .dtypes import category, computation_dtype, jax_dtype
from .registry import Handling, handled_as, lowers
from .verdicts import NeedsEager

# -- helpers ----------------------------------------------------------------------
_OUT_OF_BOUNDS = "index {index} is out of bounds for dimension %d with size %d"
_OUT_OF_RANGE = "index out of range in self"


def _require_in(index, size: int, *, negative: bool, message: str, error=IndexError) -> None:
    """Eager's bounds check of `index` against a dimension of `size`: [-size,
    size) where it wraps negative indices, [0, size) where it does not."""
    checks.require(checks.in_range(index, size, negative=negative), error, message, index=index,
                   valid=(-size if negative else 0, size))


def _require_key_in(self, key) -> None:
    """advanced indexing's check: each index tensor against the dim it indexes
    (eager's message numbers the dim among the indexed ones, and says it its
    own way for a dim of size 0); none where nothing is read or written."""
    tensors = [(d, index) for d, index in enumerate(key) if not isinstance(index, slice)]
    rest = [n for d, n in enumerate(self.shape) if d >= len(key) or isinstance(key[d], slice)]
    if math.prod(jnp.broadcast_shapes(*(i.shape for _, i in tensors))) * math.prod(rest) == 0:
        return
    for k, (d, index) in enumerate(tensors):
        size = self.shape[d]
        message = _OUT_OF_BOUNDS % (k, size) if size else "index is out of bounds for dimension with size 0"
        _require_in(index, size, negative=True, message=message)


def _cast(value, dtype):
    """A Python scalar or array in `dtype`, as torch converts a Scalar argument
    to the tensor's dtype (a float into an integer tensor truncates)."""
    return jnp.asarray(value).astype(dtype)


def _key(self, indices):
    """aten's `Tensor?[] indices` as a jnp index: None is a full slice, trailing
    dims are implied. Integer index tensors broadcast together; where they are
    not adjacent their dims go first (torch's rule, which is NumPy's)."""
    key = []
    for index in indices:
        if index is None:
            key.append(slice(None))
        elif index.dtype in (jnp.bool_, jnp.uint8):
            # a mask selects a data-dependent number of elements
            raise NeedsEager("a boolean (or uint8) mask index selects a data-dependent number of elements")
        else:
            key.append(index)
    if len(key) > self.ndim:  # eager's error, from eager
        raise NeedsEager(f"too many indices for tensor of dimension {self.ndim} (got {len(key)})")
    return tuple(key)


def _from_empty(size: int, index) -> None:
    """No index reads a dim of size 0 (nor can XLA's gather be built there): eager's error, from eager."""
    if size == 0 and index.size:
        raise NeedsEager("an index into a dim of size 0")


def _add_at(ref, values):
    """ref.add(values) where `ref` is `x.at[...]`; bool sums are logical or (torch: True + True is True)."""
    return ref.max(values) if values.dtype == jnp.bool_ else ref.add(values)


def _along(dim, index):
    """The jnp index that puts `index` at dimension `dim`."""
    return (slice(None),) * dim + (index,)


def _as_1d(self):
    """torch lets the dim ops take a 0-d tensor as if it had one element."""
    return self.reshape(1) if self.ndim == 0 else self


def _scatter_coords(index, dim):
    """For scatter/gather-style ops: the coordinates each element of `index`
    addresses (index itself at `dim`, its own position elsewhere)."""
    return tuple(index if d == dim else lax.broadcasted_iota(index.dtype, index.shape, d)
                 for d in range(index.ndim))


def _leading(x, shape):
    """x's leading block of `shape` (scatter's src and gather's self may be larger than index)."""
    return x[tuple(slice(0, n) for n in shape)]


def _identity(reduce, dtype):
    """The value a reduction starts from where include_self=False."""
    dtype = jnp.dtype(dtype)
    if reduce in ("sum", "mean"):
        return jnp.zeros((), dtype)
    if reduce == "prod":
        return jnp.ones((), dtype)
    if dtype == jnp.bool_:
        return jnp.asarray(reduce == "amin")
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.asarray(-jnp.inf if reduce == "amax" else jnp.inf, dtype)
    info = jnp.iinfo(dtype)
    return jnp.asarray(info.min if reduce == "amax" else info.max, dtype)


def _reduce_at(ref, values, reduce):
    """One scatter reduction at `ref` (x.at[...]). NaN propagates through
    amax/amin as in torch (XLA's max and min propagate NaN)."""
    if reduce in ("sum", "mean", "add"):
        return _add_at(ref, values)
    if reduce in ("prod", "multiply"):
        return ref.min(values) if values.dtype == jnp.bool_ else ref.multiply(values)
    if reduce == "amax":
        return ref.max(values)
    if reduce == "amin":
        return ref.min(values)
    raise ValueError(f"reduce argument must be sum, prod, mean, amax or amin, got {reduce}")


def _divide_by_count(total, count):
    """scatter_reduce / index_reduce 'mean': float division, floor division for integers (as torch)."""
    count = jnp.where(count == 0, 1, count)
    if jnp.issubdtype(total.dtype, jnp.inexact):
        return total / count.astype(total.dtype)
    return jnp.floor_divide(total, count.astype(total.dtype))


def _reduce_into(self, where, values, reduce, include_self):
    """scatter_reduce / index_reduce: reduce `values` into self at the
    positions `where` (a jnp index); include_self=False first sets every
    addressed position to the reduction's identity, as torch does."""
    out = self
    if not include_self:
        out = out.at[where].set(_identity(reduce, out.dtype))
    out = _reduce_at(out.at[where], values.astype(out.dtype), reduce)
    if reduce == "mean":
        count = jnp.full(self.shape, 1 if include_self else 0, jnp.int64)
        count = count.at[where].add(jnp.ones(values.shape, jnp.int64))
        out = _divide_by_count(out, count)
    return out


# -- advanced indexing ----------------------------------------------------------------
@lowers("aten::_unsafe_index")
def unsafe_index(self, indices):
    return self[_key(self, indices)]


@lowers("aten::index", cpu_indices=True)
def index(self, indices):
    key = _key(self, indices)
    for d, i in enumerate(key):
        if not isinstance(i, slice):
            _from_empty(self.shape[d], i)
    _require_key_in(self, key)
    return self[key]


def _is_mask(index) -> bool:
    return index is not None and index.dtype in (jnp.bool_, jnp.uint8)


@lowers("aten::_unsafe_index_put")
def unsafe_index_put(self, indices, values, accumulate=False):
    return _index_put(self, indices, values, accumulate, checked=False)


@lowers("aten::index_put", "aten::_index_put_impl", cpu_indices=True)
def index_put(self, indices, values, accumulate=False, unsafe=False):
    """(eager CPU checks the indices of _index_put_impl also where unsafe=True)"""
    return _index_put(self, indices, values, accumulate, checked=True)


def _index_put(self, indices, values, accumulate, checked):
    values = values.astype(self.dtype)
    if any(_is_mask(i) for i in indices):
        return _masked_put(self, indices, values, accumulate)
    key = _key(self, indices)
    if checked:
        _require_key_in(self, key)
    ref = self.at[key]
    return _add_at(ref, values) if accumulate else ref.set(values)


def _masked_put(self, indices, values, accumulate):
    """`x[mask] = v` (or +=) for one mask among full slices, when v does not
    depend on how many elements the mask selects (it broadcasts along that
    dim): a select, no data-dependent shape. Other mask writes run eagerly."""
    masks = [d for d, i in enumerate(indices) if i is not None]
    if len(masks) != 1 or not _is_mask(indices[masks[0]]) or indices[masks[0]].ndim == 0:
        raise NeedsEager("a boolean (or uint8) mask index with other indices selects a data-dependent number "
                         "of elements")
    mask = indices[masks[0]] != 0
    rest = self.ndim - masks[0] - mask.ndim  # dims after the mask's
    if values.ndim > rest:  # values has a dim where the selected elements go
        if values.shape[values.ndim - rest - 1] != 1:
            raise NeedsEager("the values of a mask write depend on how many elements the mask selects")
        values = jnp.squeeze(values, values.ndim - rest - 1)
        if values.ndim > rest:  # a dim of 1 for each of the mask's dims
            values = values.reshape(values.shape[:values.ndim - rest] + (1,) * mask.ndim
                                    + values.shape[values.ndim - rest:])
    mask = mask.reshape(mask.shape + (1,) * rest)
    if accumulate:
        values = jnp.where(mask, values, jnp.zeros((), self.dtype))
        return (self | values) if self.dtype == jnp.bool_ else self + values
    return jnp.where(mask, values, self)


@lowers("aten::_unsafe_masked_index")
def _unsafe_masked_index(self, mask, indices, fill):
    """self[indices] where mask, else fill. Indices under a false mask may be
    out of range (as torch's decomposition, they are clamped: never read)."""
    key = tuple(None if i is None else jnp.clip(i, -self.shape[d], self.shape[d] - 1)
                for d, i in enumerate(indices))
    return jnp.where(mask, unsafe_index(self, key), _cast(fill, self.dtype))


@lowers("aten::_unsafe_masked_index_put_accumulate")
def _unsafe_masked_index_put_accumulate(self, mask, indices, values):
    key = tuple(None if i is None else jnp.clip(i, -self.shape[d], self.shape[d] - 1)
                for d, i in enumerate(indices))
    values = jnp.where(mask, values, jnp.zeros((), values.dtype))
    return unsafe_index_put(self, key, values, accumulate=True)


# -- gather / scatter ---------------------------------------------------------------
@lowers("aten::gather")
def gather(self, dim, index, *, sparse_grad=False):
    if index.size == 0:  # torch checks nothing of an empty index (its dtype, its rank)
        return jnp.zeros(index.shape, self.dtype)
    if index.ndim == 0 or self.ndim == 0:
        dim = 0
    base = _as_1d(self)
    dim %= base.ndim
    _require_in(index, base.shape[dim], negative=False, message=_OUT_OF_BOUNDS % (dim, base.shape[dim]),
                error=RuntimeError)
    if index.ndim == 0 or self.ndim == 0:
        return base[_as_1d(index)].reshape(index.shape)
    source = self[tuple(slice(None) if d == dim else slice(0, n) for d, n in enumerate(index.shape))]
    return jnp.take_along_axis(source, index, axis=dim, mode="promise_in_bounds")


def _scatter(self, dim, index, src, reduce):
    """scatter's family: `reduce` None writes, else 'add'/'multiply'/'sum'/... reduce."""
    shape = self.shape
    if index.size == 0:
        return self
    if self.ndim == 0:
        self, index = self.reshape(1), index.reshape(1)
        src = src.reshape(1) if getattr(src, "ndim", 0) else src
    elif index.ndim == 0:
        index = index.reshape((1,) * self.ndim)
        src = src.reshape((1,) * self.ndim) if getattr(src, "ndim", 0) == 0 else src
    dim %= self.ndim
    _require_scatter_index(self, dim, index)
    where = _scatter_coords(index, dim)
    values = (_leading(src, index.shape) if src.ndim else jnp.broadcast_to(src, index.shape)).astype(self.dtype)
    out = self.at[where].set(values) if reduce is None else _reduce_at(self.at[where], values, reduce)
    return out.reshape(shape)


def _require_scatter_index(self, dim, index) -> None:
    _require_in(index, self.shape[dim], negative=False, message=_OUT_OF_BOUNDS % (dim, self.shape[dim]),
                error=RuntimeError)


@lowers("aten::scatter.src", "aten::scatter.reduce")
def scatter_src(self, dim, index, src, *, reduce=None):
    return _scatter(self, dim, index, src, reduce)


@lowers("aten::scatter.value", "aten::scatter.value_reduce", checked_scalars=("value",))
def scatter_value(self, dim, index, value, *, reduce=None):
    return _scatter(self, dim, index, _cast(value, self.dtype), reduce)


@lowers("aten::scatter_add")
def scatter_add(self, dim, index, src):
    return _scatter(self, dim, index, src, "add")


@lowers("aten::scatter_reduce.two")
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    shape = self.shape
    if index.size == 0:
        return self
    if self.ndim == 0 or index.ndim == 0:
        self, index, src = _as_1d(self), _as_1d(index), _as_1d(src)
    dim %= self.ndim
    _require_scatter_index(self, dim, index)
    out = _reduce_into(self, _scatter_coords(index, dim), _leading(src, index.shape), reduce, include_self)
    return out.reshape(shape)


# -- index_* along one dim ------------------------------------------------------------
@lowers("aten::index_select")
def index_select(self, dim, index):
    dim, size = _dim_size(self, dim)
    _from_empty(size, index)
    if self.ndim > 1 and (dim == 1 or self.size == 0):  # eager CPU's batched copy, which says it its own way
        _require_in(index, size, negative=False, error=RuntimeError,
                    message=f"INDICES element is out of DATA bounds, id={{index}} axis_dim={size}")
    else:
        _require_in(index, size, negative=False, message=_OUT_OF_RANGE)
    if self.ndim == 0:
        return self.reshape(1)[index.reshape(-1)].reshape(())
    return jnp.take(self, index.reshape(-1), axis=dim % self.ndim, mode="clip")


def _require_long(index) -> None:
    """index_copy and index_fill take int64 indices only: eager's error, from eager (its meta kernel lets int32 by)."""
    if index.dtype != jnp.int64:
        raise NeedsEager("an index that is not int64")


def _require_in_or_empty(self, index, dim, size, *, negative, message) -> None:
    """index_copy's and index_fill's check (`message`: given dim and size):
    none of an empty self, except that no index fits a dim of size 0 (eager
    raises a RuntimeError from its storage checks there)."""
    if size == 0:
        checks.require(jnp.zeros(index.shape, jnp.bool_), RuntimeError, message % (dim, size), index=index)
    elif self.size:
        _require_in(index, size, negative=negative, message=message % (dim, size))


def _dim_size(self, dim):
    """(dim in range, its size), a 0-d tensor as a 1-element one."""
    dim %= max(self.ndim, 1)
    return dim, self.shape[dim] if self.ndim else 1


def _index_along(self, dim, index, source):
    """(self, where, source) for index_add/copy/reduce, 0-d tensors as 1-element ones."""
    if self.ndim == 0:
        return self.reshape(1), (index.reshape(-1),), source.reshape(-1)
    return self, _along(dim % self.ndim, index.reshape(-1)), source


@lowers("aten::index_add")
def index_add(self, dim, index, source, *, alpha=1):
    dim, size = _dim_size(self, dim)
    if self.ndim > 1 and dim in (0, self.ndim - 1) and alpha == 1 and index.dtype == jnp.int64:
        # eager CPU adds through scatter_add here, which says it its own way
        message, error = _OUT_OF_BOUNDS % (dim, size), RuntimeError
    else:
        message, error = _OUT_OF_RANGE, IndexError
    if self.size:  # eager checks nothing of an empty self
        _require_in(index, size, negative=False, message=message, error=error)
    base, where, source = _index_along(self, dim, index, source)
    source = source.astype(self.dtype)
    if alpha != 1:
        source = source * _cast(alpha, self.dtype)
    return _add_at(base.at[where], source).reshape(self.shape)


@lowers("aten::index_copy")
def index_copy(self, dim, index, source):
    _require_long(index)
    dim, size = _dim_size(self, dim)
    _require_in_or_empty(self, index, dim, size, negative=False, message="index_copy_(): " + _OUT_OF_BOUNDS)
    base, where, source = _index_along(self, dim, index, source)
    return base.at[where].set(source.astype(self.dtype)).reshape(self.shape)


@lowers("aten::index_fill", checked_scalars=("value",))
def index_fill(self, dim, index, value):
    _require_long(index)
    dim, size = _dim_size(self, dim)
    _require_in_or_empty(self, index, dim, size, negative=True, message=_OUT_OF_BOUNDS)
    base = _as_1d(self)
    where = _along(dim, index.reshape(-1))
    return base.at[where].set(_cast(value, self.dtype)).reshape(self.shape)


@lowers("aten::index_reduce")
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    _require_in(index, _dim_size(self, dim)[1], negative=False, message=_OUT_OF_RANGE)
    base, where, source = _index_along(self, dim, index, source)
    return _reduce_into(base, where, source, reduce, include_self).reshape(self.shape)


# -- masks, flat indices ----------------------------------------------------------------
@lowers("aten::masked_scatter")
def masked_scatter(self, mask, source):
    """Where mask, source's elements in order (row-major), else self."""
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    flat_mask = jnp.broadcast_to(mask, shape).reshape(-1)
    flat_self = jnp.broadcast_to(self, shape).reshape(-1)
    source = source.reshape(-1).astype(self.dtype)
    checks.require(flat_mask.sum() <= source.size, RuntimeError,
                   "Number of elements of source < number of ones in mask")
    if source.size == 0:  # then no element is masked (checked above)
        return flat_self.reshape(shape)
    position = jnp.cumsum(flat_mask.astype(jnp.int64)) - 1
    taken = source[jnp.clip(position, 0, source.size - 1)]
    return jnp.where(flat_mask, taken, flat_self).reshape(shape)


@lowers("aten::take")
def take(self, index):
    _require_flat_in(self, index)
    return self.reshape(-1)[index]


def _require_flat_in(self, index) -> None:
    _require_in(index, self.size, negative=True,
                message=f"out of range: tried to access index {{index}} on a tensor of {self.size} elements.")


@lowers("aten::put")
def put(self, index, source, accumulate=False):
    _require_flat_in(self, index)
    ref = self.reshape(-1).at[index.reshape(-1)]
    source = source.reshape(-1).astype(self.dtype)
    return (_add_at(ref, source) if accumulate else ref.set(source)).reshape(self.shape)


@lowers("aten::one_hot")
def one_hot(self, num_classes=-1):
    """(recorded only with num_classes given, functionalization._one_hot: -1
    makes the shape depend on the data)"""
    checks.require(self >= 0, RuntimeError, "Class values must be non-negative.")
    checks.require(self < num_classes, RuntimeError, "Class values must be smaller than num_classes.")
    return (self[..., None] == jnp.arange(num_classes)).astype(jnp.int64)


# -- embedding ----------------------------------------------------------------------------
handled_as(Handling.EAGER, "aten::_embedding_bag_forward_only",
           reason="eager CPU returns an empty offset2bag where the meta kernel says (n,): only a fallback at "
                  "record time takes eager's shapes")


@lowers("aten::embedding")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """Rows of weight (padding_idx only matters to the backward)."""
    _require_in(indices, weight.shape[0], negative=False, message=_OUT_OF_RANGE)
    return jnp.take(weight, indices, axis=0, mode="clip")


@lowers("aten::embedding_renorm")
def embedding_renorm(self, indices, max_norm, norm_type):
    """F.embedding's max_norm: each row an index names whose norm exceeds
    max_norm is scaled by max_norm / (norm + 1e-7) (eager CPU's formula: the
    norm and the scale rounded to the weight's dtype)."""
    wide = self.astype(jnp.float32) if self.dtype in (jnp.float16, jnp.bfloat16) else self
    magnitude = jnp.abs(wide)
    if norm_type == float("inf"):
        norm = magnitude.max(axis=-1)
    elif norm_type == 0:
        norm = (wide != 0).sum(axis=-1).astype(wide.dtype)
    else:
        norm = (magnitude ** norm_type).sum(axis=-1) ** (1.0 / norm_type)
    norm = norm.astype(self.dtype).astype(jnp.float64)
    _require_in(indices, self.shape[0], negative=True,
                message=f"select(): index {{index}} out of range for tensor of size {list(self.shape)} at dimension 0")
    named = jnp.zeros(self.shape[:1], jnp.bool_).at[indices.reshape(-1)].set(True)
    scale = jnp.where(named & (norm > max_norm), max_norm / (norm + 1e-7), 1.0)
    scale = scale.astype(self.dtype).astype(wide.dtype)  # eager rounds the scale to the weight's dtype
    return (wide * scale[:, None]).astype(self.dtype)


@lowers("aten::embedding_dense_backward")
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """The gradient rows summed into each index's row; an index equal to
    padding_idx contributes nothing; scale_grad_by_freq divides each
    contribution by how often its index occurs. Summed in the gradient's
    dtype, in index order, as eager CPU adds them (bfloat16 sums round at
    each step there too). Eager CPU drops an index outside [0, num_weights)
    without an error (the forward raised on it): negative ones too, which
    jnp would wrap."""
    dtype = grad_output.dtype
    flat = jnp.where(indices.reshape(-1) < 0, num_weights, indices.reshape(-1))
    grad = grad_output.reshape((flat.size,) + grad_output.shape[indices.ndim:])
    rows = (-1,) + (1,) * (grad.ndim - 1)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), jnp.int64).at[flat].add(1, mode="drop")
        wide = jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype
        grad = (grad.astype(wide) / counts[flat].astype(wide).reshape(rows)).astype(dtype)
    grad = jnp.where((flat != padding_idx).reshape(rows), grad, jnp.zeros((), dtype))
    return jnp.zeros((num_weights,) + grad.shape[1:], dtype).at[flat].add(grad, mode="drop")


# -- searches -------------------------------------------------------------------------------
def _common(a, b):
    """Both arrays in the dtype torch compares them in (its promotion, a 0-d
    tensor giving way to a dimensioned one of the same category)."""
    dtype = jax_dtype(computation_dtype([a, b], None))
    return a.astype(dtype), b.astype(dtype)


def _scalar_array(value, other):
    """A Python Scalar argument as torch wraps it against tensor `other`: in
    other's dtype unless the scalar's category is higher (then long, or the
    default float or complex dtype)."""
    if hasattr(value, "dtype"):
        return value
    rank = 0 if isinstance(value, bool) else 1 if isinstance(value, int) else \
        3 if isinstance(value, complex) else 2
    if rank <= category(other.dtype):
        return _cast(value, other.dtype)
    default = torch.get_default_dtype()
    dtype = {1: torch.int64, 2: default,
             3: torch.complex128 if default == torch.float64 else torch.complex64}[rank]
    return _cast(value, jax_dtype(dtype))


def _binary_search(boundaries, values, right):
    """torch's own binary search, step for step (so NaN lands where it does in
    eager: the search moves right past any element that is not >= (left) or
    > (right) the value). boundaries: (..., n); values: (..., m) with the same
    leading dims, or boundaries 1-D. jnp.searchsorted orders NaN differently."""
    n = boundaries.shape[-1]
    one_d = boundaries.ndim == 1
    start = jnp.zeros(values.shape, jnp.int64)
    end = jnp.full(values.shape, n, jnp.int64)
    for _ in range(n.bit_length()):  # each step at least halves end - start
        active = start < end
        mid = start + ((end - start) >> 1)
        probe = jnp.clip(mid, 0, n - 1)
        mid_val = boundaries[probe] if one_d else jnp.take_along_axis(boundaries, probe, axis=-1)
        go_right = ~(mid_val > values) if right else ~(mid_val >= values)
        start = jnp.where(active & go_right, mid + 1, start)
        end = jnp.where(active & ~go_right, mid, end)
    return start


def _searchsorted(sorted_sequence, values, right, side, sorter):
    right = right or side == "right"
    values = _scalar_array(values, sorted_sequence)
    if sorter is not None:
        checks.require(checks.in_range(sorter, sorted_sequence.shape[-1], negative=False), RuntimeError,
                       "torch.searchsorted(): sorter index out of range")
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    sorted_sequence, values = _common(sorted_sequence, values)
    if sorted_sequence.shape[-1] == 0:
        return jnp.zeros(values.shape, jnp.int64)
    return _binary_search(sorted_sequence, values, right)


@lowers("aten::searchsorted")
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    return _searchsorted(sorted_sequence, self, right, side, sorter)


@lowers("aten::bucketize")
def bucketize(self, boundaries, *, out_int32=False, right=False):
    return _searchsorted(boundaries, self, right, None, None)


@lowers("aten::isin")
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    """Whether each element equals any test element (NaN equals nothing)."""
    if not hasattr(elements, "dtype"):
        elements = _scalar_array(elements, test_elements)
    test_elements = _scalar_array(test_elements, elements)
    elements, test_elements = _common(elements, test_elements)
    test = test_elements.reshape(-1)
    if test.size == 0:
        found = jnp.zeros(elements.shape, jnp.bool_)
    elif elements.size * test.size <= 1 << 22:
        found = (elements[..., None] == test).any(axis=-1)
    else:
        # the test elements sorted, and a search (jnp's sort and search hold
        # -0.0 and 0.0 equal, as == does; NaN, sorted last, equals nothing)
        ordered = jnp.sort(test)
        at = jnp.searchsorted(ordered, elements)
        found = ordered[jnp.clip(at, 0, test.size - 1)] == elements
    return ~found if invert else found
