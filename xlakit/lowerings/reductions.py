"""Reductions and scans: sum, mean, max/min, var/std, norms, cumulative ops,
sort and top-k.

Eager CPU's rules these entries keep:
- a `dim` list that is empty (or None) reduces every dimension, except in
  any.dims / all.dims, where an empty list reduces none; a 0-d tensor takes
  dim 0 or -1 as itself;
- integer and bool inputs sum, multiply and accumulate in int64 (unless a
  `dtype` is given); float16 and bfloat16 accumulate in float32, as torch's
  CPU sums do, and round once at the end (the caller casts). Where eager
  rounds each step to the half type (prod, logsumexp), the result may differ
  from eager's in the last place (it is the better rounded);
- NaN propagates through max, min, amax, amin, aminmax and cummax/cummin, and
  argmax/argmin and the indices of max/min pick the first NaN; otherwise the
  first of equal values, except cummax/cummin, which take the last;
- sort orders NaN above +inf, and keeps equal values in their input order;
  topk, kthvalue, median and nanmedian take the same order. Where torch
  leaves the order of equal values open (sort without stable=True: eager
  CPU's keeps input order up to 16 values, not beyond; topk's "not guaranteed
  to be stable"; median's "not necessarily the first occurrence"), the
  indices are those of the stable order, and the values are always eager's;
- a reduction over a zero-size dimension that eager refuses but whose meta
  kernel accepts (max, min, median, mode) raises NeedsEager, so eager raises.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from .dtypes import jax_dtype
from .registry import lowers
from .verdicts import NeedsEager

_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


# -- helpers ------------------------------------------------------------------------
def _axes(x, dim) -> tuple[int, ...]:
    """The axes a `dim` argument reduces: None or [] is every axis."""
    if x.ndim == 0:
        return ()
    if dim is None:
        return tuple(range(x.ndim))
    if isinstance(dim, int):
        return (dim % x.ndim,)
    if len(dim) == 0:
        return tuple(range(x.ndim))
    return tuple(sorted(d % x.ndim for d in dim))


def _axis(x, dim: int) -> int | None:
    """One dimension argument; None for a 0-d tensor (dim 0 or -1 is the tensor itself)."""
    return None if x.ndim == 0 else dim % x.ndim


def _is_integral(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_


def _is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def _acc(x):
    """float16 / bfloat16 accumulate in float32, as torch's CPU kernels do."""
    return x.astype(jnp.float32) if x.dtype in _HALF else x


def _accumulating(x, dtype):
    """The input of sum / prod / cumsum / cumprod in the dtype they accumulate
    in: `dtype` if given, int64 for integers and bool."""
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    elif _is_integral(x.dtype):
        x = x.astype(jnp.int64)
    return _acc(x)


def _count(x, axes) -> int:
    return math.prod(x.shape[a] for a in axes)


def _comparable(x):
    """bool as uint8 for comparisons and sorting."""
    return x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x


def _eager_refuses(x, op: str, *, complex_=True, bool_=False, integer=False):
    """The meta kernels accept dtypes that eager CPU's kernels refuse (complex
    max, bool argmax, integer var, ...): such a call goes to eager, which raises."""
    refused = ((complex_ and jnp.iscomplexobj(x)) or (bool_ and x.dtype == jnp.bool_)
               or (integer and _is_integral(x.dtype)))
    if refused:
        raise NeedsEager(f"{op} of {x.dtype}: eager CPU refuses it")


def _nonempty(x, axis, op: str):
    """Eager refuses to reduce a zero-size dimension where the meta kernel does not."""
    if (x.size if axis is None else x.shape[axis]) == 0:
        raise NeedsEager(f"{op} of a zero-size dimension raises in eager torch")


def _keep(x, axis, keepdim: bool):
    return jnp.expand_dims(x, axis) if keepdim and axis is not None else x


def _take(x, index, axis):
    """x at `index` (broadcast along `axis` with size 1) along `axis`, that axis dropped."""
    return jnp.squeeze(jnp.take_along_axis(x, index, axis=axis), axis)


def _from_zero(total):
    """A float sum as eager's, which starts from +0.0: a sum of -0.0 alone is +0.0,
    where XLA folds a one-element reduction to the element itself."""
    if jnp.iscomplexobj(total):
        return lax.complex(_from_zero(total.real), _from_zero(total.imag))
    if not _is_float(total.dtype):
        return total
    return jnp.where(total == 0, jnp.zeros_like(total), total)


# -- sums, means, products ------------------------------------------------------------
@lowers("aten::sum.default", "aten::sum.dim_IntList")
def sum_(self, dim=None, keepdim=False, *, dtype=None):
    return _from_zero(_accumulating(self, dtype).sum(axis=_axes(self, dim), keepdims=keepdim))


@lowers("aten::nansum")
def nansum(self, dim=None, keepdim=False, *, dtype=None):
    _eager_refuses(self, "nansum")
    x = _accumulating(self, dtype)
    if not _is_integral(x.dtype):
        x = jnp.where(jnp.isnan(x), jnp.zeros((), x.dtype), x)
    return _from_zero(x.sum(axis=_axes(self, dim), keepdims=keepdim))


@lowers("aten::mean.default", "aten::mean.dim")
def mean(self, dim=None, keepdim=False, *, dtype=None):
    axes = _axes(self, dim)
    x = _acc(self.astype(jax_dtype(dtype)) if dtype is not None else self)
    # sum / count, as torch (a count of 0 gives NaN)
    return _from_zero(x.sum(axis=axes, keepdims=keepdim)) / x.dtype.type(_count(self, axes))


@lowers("aten::prod.default", "aten::prod.dim_int")
def prod(self, dim=None, keepdim=False, *, dtype=None):
    return _accumulating(self, dtype).prod(axis=_axes(self, dim), keepdims=keepdim)


@lowers("aten::trace")
def trace(self):
    _eager_refuses(self, "trace", complex_=False, bool_=True)
    return jnp.trace(_accumulating(self, None))


@lowers("aten::count_nonzero.default", "aten::count_nonzero.dim_IntList")
def count_nonzero(self, dim=None):
    return (self != 0).sum(axis=_axes(self, dim), dtype=jnp.int64)


@lowers("aten::any.default", "aten::any.dim", "aten::any.dims")
def any_(self, dim=None, keepdim=False):
    if isinstance(dim, (list, tuple)) and len(dim) == 0:  # any.dims with no dims reduces none
        return self != 0
    return (self != 0).any(axis=_axes(self, dim), keepdims=keepdim)


@lowers("aten::all.default", "aten::all.dim", "aten::all.dims")
def all_(self, dim=None, keepdim=False):
    if isinstance(dim, (list, tuple)) and len(dim) == 0:
        return self != 0
    return (self != 0).all(axis=_axes(self, dim), keepdims=keepdim)


# -- max and min ---------------------------------------------------------------------
@lowers("aten::amax")
def amax(self, dim=(), keepdim=False):
    _eager_refuses(self, "amax")
    return self.max(axis=_axes(self, dim), keepdims=keepdim)  # NaN propagates


@lowers("aten::amin")
def amin(self, dim=(), keepdim=False):
    _eager_refuses(self, "amin")
    return self.min(axis=_axes(self, dim), keepdims=keepdim)


@lowers("aten::aminmax")
def aminmax(self, *, dim=None, keepdim=False):
    _eager_refuses(self, "aminmax")
    axes = _axes(self, dim)
    return self.min(axis=axes, keepdims=keepdim), self.max(axis=axes, keepdims=keepdim)


def _arg_extreme(x, axis, largest: bool):
    """First index of the max (min); the first NaN where there is one (jnp's rule, torch's too)."""
    x = _comparable(x)
    return jnp.argmax(x, axis=axis) if largest else jnp.argmin(x, axis=axis)


def _max_or_min(largest: bool):
    def full(self):
        _eager_refuses(self, "max" if largest else "min")
        _nonempty(self, None, "max" if largest else "min")
        return self.max() if largest else self.min()

    def along(self, dim, keepdim=False):
        _eager_refuses(self, "max" if largest else "min")
        axis = _axis(self, dim)
        if axis is None:
            return self, jnp.zeros((), jnp.int64)
        _nonempty(self, axis, "max" if largest else "min")
        values = self.max(axis=axis, keepdims=keepdim) if largest else self.min(axis=axis, keepdims=keepdim)
        return values, _keep(_arg_extreme(self, axis, largest), axis, keepdim)
    return full, along


lowers("aten::max.default")(_max_or_min(True)[0])
lowers("aten::max.dim")(_max_or_min(True)[1])
lowers("aten::min.default")(_max_or_min(False)[0])
lowers("aten::min.dim")(_max_or_min(False)[1])


def _argmax_or_argmin(largest: bool):
    def lowering(self, dim=None, keepdim=False):
        _eager_refuses(self, "argmax" if largest else "argmin", bool_=True)
        if dim is None:
            index = _arg_extreme(self.reshape(-1), 0, largest)
            return index.reshape((1,) * self.ndim) if keepdim else index
        axis = _axis(self, dim)
        if axis is None:
            return jnp.zeros((), jnp.int64)
        return _keep(_arg_extreme(self, axis, largest), axis, keepdim)
    return lowering


lowers("aten::argmax")(_argmax_or_argmin(True))
lowers("aten::argmin")(_argmax_or_argmin(False))


# -- variance, log-sum-exp, norms --------------------------------------------------------
def _var_and_mean(x, dim, correction, keepdim):
    _eager_refuses(x, "var", complex_=False, bool_=True, integer=True)
    axes = _axes(x, dim)
    n = _count(x, axes)
    xa = _acc(x)
    mean = xa.sum(axis=axes, keepdims=True) / xa.dtype.type(n)
    deviation = xa - mean
    if jnp.iscomplexobj(deviation):
        squares = deviation.real * deviation.real + deviation.imag * deviation.imag
    else:
        squares = deviation * deviation
    correction = 1 if correction is None else correction
    # torch divides by max(0, n - correction): inf, or NaN for 0/0
    var = squares.sum(axis=axes, keepdims=keepdim) / squares.dtype.type(max(0, n - correction))
    return var, (mean if keepdim else mean.reshape(var.shape))


@lowers("aten::var.correction")
def var(self, dim=None, *, correction=None, keepdim=False):
    return _var_and_mean(self, dim, correction, keepdim)[0]


@lowers("aten::std.correction")
def std(self, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var_and_mean(self, dim, correction, keepdim)[0])


@lowers("aten::var_mean.correction")
def var_mean(self, dim=None, *, correction=None, keepdim=False):
    return _var_and_mean(self, dim, correction, keepdim)


@lowers("aten::std_mean.correction")
def std_mean(self, dim=None, *, correction=None, keepdim=False):
    var, mean = _var_and_mean(self, dim, correction, keepdim)
    return jnp.sqrt(var), mean


@lowers("aten::logsumexp")
def logsumexp(self, dim, keepdim=False):
    _eager_refuses(self, "logsumexp")  # eager's complex logsumexp: not lowered
    if isinstance(dim, (list, tuple)) and len(dim) == 0:
        raise NeedsEager("logsumexp over no dims: eager raises")
    if _is_integral(self.dtype):
        self = self.astype(jax_dtype(torch.get_default_dtype()))
    x = _acc(self)
    axes = _axes(self, dim)
    # torch's formula: the max taken out, except where it is infinite
    # (an empty reduction: the sum of nothing, log(0) = -inf)
    maxes = x.max(axis=axes, keepdims=True, initial=-jnp.inf) if x.size == 0 else x.max(axis=axes, keepdims=True)
    maxes = jnp.where(jnp.isinf(maxes), jnp.zeros((), maxes.dtype), maxes)
    result = jnp.log(jnp.exp(x - maxes).sum(axis=axes, keepdims=True)) + maxes
    return result if keepdim else jnp.squeeze(result, axes)


@lowers("aten::linalg_vector_norm")
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    # dim 0 or -1 of a 0-d tensor is the tensor itself (found by xlakit.opinfo: masked.norm)
    axis = None if not dim or x.ndim == 0 else tuple(d % x.ndim for d in dim)
    magnitude = _acc(jnp.abs(x))
    if ord == float("inf"):
        return magnitude.max(axis=axis, keepdims=keepdim)
    if ord == float("-inf"):
        return magnitude.min(axis=axis, keepdims=keepdim)
    if ord == 0:
        return (x != 0).sum(axis=axis, keepdims=keepdim).astype(magnitude.dtype)
    if ord == 1:
        return magnitude.sum(axis=axis, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt((magnitude * magnitude).sum(axis=axis, keepdims=keepdim))
    return (magnitude ** ord).sum(axis=axis, keepdims=keepdim) ** (1.0 / ord)


@lowers("aten::histc")
def histc(self, bins=100, min=0, max=0):
    """Eager CPU's kernel: bins from the data's range where min == max (then
    widened by 1 each side if still equal); elements outside [min, max] and
    NaN are not counted; bin = int((x - min) * bins / (max - min)) in the
    input's dtype, the last bin closed. Eager raises where the data's range is
    not finite; here such a call counts nothing. Integers: see `_histc_integers`."""
    if jnp.issubdtype(self.dtype, jnp.integer):
        return _histc_integers(self, bins, min, max)
    if self.dtype not in (jnp.float32, jnp.float64):
        raise NeedsEager(f"histc of {self.dtype}: eager rounds each step in that dtype")
    if min > max:
        raise NeedsEager("histc: eager raises where max < min")
    dtype = self.dtype
    if min == max and self.size > 0:
        lo, hi = self.min().astype(jnp.float64), self.max().astype(jnp.float64)
    else:
        lo, hi = jnp.float64(min), jnp.float64(max)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo).astype(dtype), jnp.where(same, hi + 1, hi).astype(dtype)
    flat = self.reshape(-1)
    inside = (flat >= lo) & (flat <= hi) & jnp.isfinite(lo) & jnp.isfinite(hi)
    # XLA turns a division by a scalar into a product with its reciprocal,
    # which moves elements near a bin's edge; eager divides
    span = lax.optimization_barrier(jnp.broadcast_to(hi - lo, flat.shape))
    position = (flat - lo) * dtype.type(bins) / span
    position = jnp.where(inside, position, 0).astype(jnp.int64)
    position = jnp.minimum(position, bins - 1)
    return jnp.zeros((bins,), dtype).at[position].add(inside.astype(dtype))


def _histc_integers(self, bins, min, max):
    """Eager CPU has no integer histc, CUDA's kernel has, and transformers' MoE layers
    count tokens per expert with it on every device but CPU and MPS (a float histc
    there): the lazy device counts as CUDA does. Bounds are the Scalars truncated to
    int64, or the data's range where they are equal (then widened by 1 each side if
    still equal); bin = (x - min) * bins // (max - min) in int64, the last bin closed;
    elements outside [min, max] are not counted; counts in the input's dtype."""
    if min > max:
        raise NeedsEager("histc: eager raises where max < min")
    flat = self.reshape(-1).astype(jnp.int64)
    if int(min) == int(max) and self.size > 0:
        lo, hi = flat.min(), flat.max()
    else:
        lo, hi = jnp.int64(int(min)), jnp.int64(int(max))
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    inside = (flat >= lo) & (flat <= hi)
    position = jnp.minimum(jnp.where(inside, (flat - lo) * bins // (hi - lo), 0), bins - 1)
    return jnp.zeros((bins,), self.dtype).at[position].add(inside.astype(self.dtype))


# -- cumulative ops ----------------------------------------------------------------------
@lowers("aten::cumsum")
def cumsum(self, dim, *, dtype=None):
    x = _accumulating(self, dtype)
    axis = _axis(self, dim)
    return x if axis is None else _from_zero(jnp.cumsum(x, axis=axis))


@lowers("aten::cumprod")
def cumprod(self, dim, *, dtype=None):
    x = _accumulating(self, dtype)
    axis = _axis(self, dim)
    return x if axis is None else jnp.cumprod(x, axis=axis)


@lowers("aten::logcumsumexp")
def logcumsumexp(self, dim):
    _eager_refuses(self, "logcumsumexp", bool_=True, integer=True)  # complex: not lowered
    axis = _axis(self, dim)
    x = _acc(self)
    return x if axis is None or x.shape[axis] == 0 else lax.cumlogsumexp(x, axis=axis)


def _cumulative_extreme(largest: bool):
    """cummax / cummin: a running (value, index) pair that a later element
    replaces when it is NaN or, the pair not being NaN, at least as large (as
    small): eager takes the last of equal values and of NaNs. The order
    (NaN above all, then value, then index) is total, so the scan is associative."""
    def lowering(self, dim):
        _eager_refuses(self, "cummax" if largest else "cummin")
        axis = _axis(self, dim)
        if axis is None:
            return self, jnp.zeros((), jnp.int64)
        x = _comparable(self)
        index = lax.broadcasted_iota(jnp.int64, x.shape, axis)

        def combine(earlier, later):
            (a, ai), (b, bi) = earlier, later
            beats = (b >= a) if largest else (b <= a)
            if _is_float(x.dtype) or jnp.iscomplexobj(x):
                beats = jnp.isnan(b) | (~jnp.isnan(a) & beats)
            return jnp.where(beats, b, a), jnp.where(beats, bi, ai)
        if x.shape[axis] == 0:
            return self, index
        values, indices = lax.associative_scan(combine, (x, index), axis=axis)
        return values.astype(self.dtype), indices
    return lowering


lowers("aten::cummax")(_cumulative_extreme(True))
lowers("aten::cummin")(_cumulative_extreme(False))


# -- sort and selection -------------------------------------------------------------------
def _sorted(x, axis: int, descending: bool = False):
    """(values, int64 indices) of x sorted along `axis`, NaN above +inf,
    equal values in input order (stable). Descending: the stable ascending
    sort of the reversed input, reversed back, keeps equal values in input
    order too and needs no negation (which integers' minimum would overflow)."""
    n = x.shape[axis]
    if descending:
        x = jnp.flip(x, axis)
    index = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    # lax.sort orders NaN last and treats -0.0 and 0.0 as equal, as torch
    _, indices, values = lax.sort((_comparable(x), index, x), dimension=axis, num_keys=1, is_stable=True)
    if descending:
        values, indices = jnp.flip(values, axis), (n - 1) - jnp.flip(indices, axis)
    return values, indices


@lowers("aten::sort.default", "aten::sort.stable")
def sort(self, dim=-1, descending=False, *, stable=None):
    _eager_refuses(self, "sort")
    axis = _axis(self, dim)
    if axis is None:
        return self, jnp.zeros((), jnp.int64)
    return _sorted(self, axis, descending)


@lowers("aten::argsort.stable")
def argsort(self, *, stable, dim=-1, descending=False):
    return sort(self, dim, descending)[1]


@lowers("aten::topk")
def topk(self, k, dim=-1, largest=True, sorted=True):
    _eager_refuses(self, "topk", bool_=True)
    axis = _axis(self, dim)
    if axis is None:
        return self, jnp.zeros((), jnp.int64)
    values, indices = _sorted(self, axis, descending=largest)
    # sorted=False leaves the order open: the sorted order is one
    return lax.slice_in_dim(values, 0, k, axis=axis), lax.slice_in_dim(indices, 0, k, axis=axis)


@lowers("aten::kthvalue")
def kthvalue(self, k, dim=-1, keepdim=False):
    _eager_refuses(self, "kthvalue", bool_=True)
    axis = _axis(self, dim)
    if axis is None:
        return self, jnp.zeros((), jnp.int64)
    values, indices = _sorted(self, axis)
    return (_keep(lax.index_in_dim(values, k - 1, axis, keepdims=False), axis, keepdim),
            _keep(lax.index_in_dim(indices, k - 1, axis, keepdims=False), axis, keepdim))


def _median_along(x, axis: int, ignore_nan: bool):
    """(values, indices) of the lower median along `axis`: with NaN, median
    gives the first NaN; nanmedian, the lower median of the other values (NaN
    where all are NaN)."""
    values, indices = _sorted(x, axis)
    n = x.shape[axis]
    if _is_float(x.dtype):
        nan = jnp.isnan(x)
        if ignore_nan:
            count = n - nan.sum(axis=axis, keepdims=True)
            k = jnp.maximum(count - 1, 0) // 2
            return _take(values, k, axis), _take(indices, k, axis)
        k = (n - 1) // 2
        any_nan = nan.any(axis=axis)
        first_nan = jnp.argmax(nan, axis=axis)
        value = lax.index_in_dim(values, k, axis, keepdims=False)
        index = lax.index_in_dim(indices, k, axis, keepdims=False)
        return (jnp.where(any_nan, jnp.full((), jnp.nan, x.dtype), value),
                jnp.where(any_nan, first_nan, index))
    k = (n - 1) // 2
    return lax.index_in_dim(values, k, axis, keepdims=False), lax.index_in_dim(indices, k, axis, keepdims=False)


def _median(ignore_nan: bool):
    def full(self):
        _eager_refuses(self, "median", bool_=True)
        if self.size == 0:
            if not _is_float(self.dtype):
                raise NeedsEager("median of an empty integer tensor")
            return jnp.full((), jnp.nan, self.dtype)
        return _median_along(self.reshape(-1), 0, ignore_nan)[0]

    def along(self, dim, keepdim=False):
        _eager_refuses(self, "median", bool_=True)
        axis = _axis(self, dim)
        if axis is None:
            return self, jnp.zeros((), jnp.int64)
        _nonempty(self, axis, "median")
        values, indices = _median_along(self, axis, ignore_nan)
        return _keep(values, axis, keepdim), _keep(indices, axis, keepdim)
    return full, along


lowers("aten::median.default")(_median(False)[0])
lowers("aten::median.dim")(_median(False)[1])
lowers("aten::nanmedian.default")(_median(True)[0])
lowers("aten::nanmedian.dim")(_median(True)[1])

# Eager CPU's mode sorts (value, index) pairs by value with std::sort and
# takes the last pair of the first longest run of equal values. On 16 pairs or
# fewer, libstdc++'s std::sort is an insertion sort, emulated exactly below
# (NaN included, which compares neither less nor greater than anything);
# beyond, it is an introsort whose order of equal values cannot be had here.
_MODE_INSERTION_SORT_LIMIT = 16


def _insertion_sorted(values, indices):
    """libstdc++'s __insertion_sort by `<` on values, along the last axis."""
    n = values.shape[-1]
    for i in range(1, n):
        v, vi = values[..., i:i + 1], indices[..., i:i + 1]
        # move to the front if less than the first; else step back while less than the previous
        to_front = v[..., 0] < values[..., 0]
        less = v < values[..., :i]
        run = jnp.cumprod(jnp.flip(less, -1), axis=-1).sum(axis=-1)
        position = jnp.where(to_front, 0, i - run)[..., None]
        q = jnp.arange(n)
        shifted_v = jnp.concatenate([values[..., :1], values[..., :-1]], axis=-1)
        shifted_i = jnp.concatenate([indices[..., :1], indices[..., :-1]], axis=-1)
        moved = (q > position) & (q <= i)
        values = jnp.where(q == position, v, jnp.where(moved, shifted_v, values))
        indices = jnp.where(q == position, vi, jnp.where(moved, shifted_i, indices))
    return values, indices


@lowers("aten::mode")
def mode(self, dim=-1, keepdim=False):
    _eager_refuses(self, "mode")
    axis = _axis(self, dim)
    if axis is None:
        return self, jnp.zeros((), jnp.int64)
    n = self.shape[axis]
    _nonempty(self, axis, "mode")
    if n > _MODE_INSERTION_SORT_LIMIT:
        raise NeedsEager(f"mode of {n} > {_MODE_INSERTION_SORT_LIMIT} values: eager's introsort order")
    x = jnp.moveaxis(_comparable(self), axis, -1)
    index = lax.broadcasted_iota(jnp.int64, x.shape, x.ndim - 1)
    values, indices = _insertion_sorted(x, index)
    # a run ends where the next value differs (NaN differs from everything)
    ends = jnp.concatenate([values[..., :-1] != values[..., 1:], jnp.ones(x.shape[:-1] + (1,), bool)], axis=-1)
    position = jnp.arange(n)
    previous_end = lax.cummax(jnp.where(ends, position, -1), axis=x.ndim - 1)
    previous_end = jnp.concatenate([jnp.full(x.shape[:-1] + (1,), -1), previous_end[..., :-1]], axis=-1)
    lengths = jnp.where(ends, position - previous_end, 0)
    best = jnp.argmax(lengths, axis=-1)[..., None]  # the first longest run
    value = jnp.take_along_axis(values, best, axis=-1)[..., 0].astype(self.dtype)
    index = jnp.take_along_axis(indices, best, axis=-1)[..., 0]
    return _keep(value, axis, keepdim), _keep(index, axis, keepdim)

