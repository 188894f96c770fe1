"""Tensor factories: full, zeros, ones, empty, arange, eye, scalar_tensor,
linspace and the *_like / new_* forms; casts (_to_copy); the random
factories, which draw on the host.

Factory arguments (sizes, fill values, start / end / step) are Python values
fixed in the graph, unless their registration lifts them; `dtype` may be None, and
then the caller casts to the dtype torch's meta kernel gives. Layout, device,
pin_memory and memory_format say nothing about values and are ignored.
"""
from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .dtypes import jax_dtype
from .registry import RANDOM_REASON, Handling, handled_as, lowers


# Factories whose value follows from their operands' shapes and their constant arguments
# (the random ones draw on the host: their values are not constants of a graph).
FILLS = frozenset({"zeros", "ones", "full", "empty", "scalar_tensor", "zeros_like", "ones_like", "full_like",
                   "empty_like", "new_zeros", "new_ones", "new_full", "new_empty"})


# -- casts ----------------------------------------------------------------------------
def cast(x, dtype):
    """x as `dtype` (a jax dtype), converted as eager torch converts on CPU:
    complex to real keeps the real part, anything to bool is `!= 0`, and a
    float becomes a narrow integer through int64 (torch's uint8 rule; for
    int8 / int16 it is what x86 does with values in int32's range), NaN and
    out-of-range values the integer's minimum, as x86 converts them."""
    x = jnp.asarray(x)
    dtype = jnp.dtype(dtype)
    if x.dtype == dtype:
        return x
    if dtype == jnp.bool_:
        return x != 0
    if jnp.issubdtype(x.dtype, jnp.complexfloating) and not jnp.issubdtype(dtype, jnp.complexfloating):
        x = jnp.real(x)
    if jnp.issubdtype(x.dtype, jnp.floating) and jnp.issubdtype(dtype, jnp.integer):
        # x86's truncating conversion gives the "integer indefinite" value (the
        # minimum) for NaN, infinities and values out of range; XLA saturates
        wide = jnp.dtype(jnp.int32) if dtype == jnp.int32 else jnp.dtype(jnp.int64)
        limit = 2.0 ** (8 * wide.itemsize - 1)
        out_of_range = jnp.isnan(x) | (x >= limit) | (x < -limit)
        x = jnp.where(out_of_range, jnp.iinfo(wide).min, x.astype(wide))
    return x.astype(dtype)


def _target(dtype, default=None):
    """The jax dtype of an optional torch dtype argument."""
    return jax_dtype(dtype) if dtype is not None else default


@lowers("aten::_to_copy")
def _to_copy(self, *, dtype=None, **_):
    return cast(self, jax_dtype(dtype)) if dtype is not None else self


@lowers("aten::to")
def to(self, *args, **kwargs):
    """Every overload of aten::to: a dtype given positionally or by keyword
    (to.dtype, to.device, to.dtype_layout), or another tensor's (to.other)."""
    dtype = kwargs.get("dtype")
    other = kwargs.get("other")
    for a in args:
        if isinstance(a, torch.dtype) and dtype is None:
            dtype = a
        elif hasattr(a, "dtype") and hasattr(a, "shape") and other is None:
            other = a
    if dtype is not None:
        return cast(self, jax_dtype(dtype))
    if other is not None:
        return cast(self, other.dtype)
    return self


@lowers("aten::type_as")
def type_as(self, other):
    return cast(self, other.dtype)


# -- filled tensors ---------------------------------------------------------------------
def _full(shape, value, dtype):
    """`value` (a Python number or a 0-d array) broadcast to `shape`, cast to
    dtype (a jax dtype, or None: the value's own, cast by the caller)."""
    value = jnp.asarray(value)
    if dtype is not None:
        value = cast(value, dtype)
    return jnp.broadcast_to(value, tuple(shape))


@lowers("aten::full.default", checked_scalars=("fill_value",), fill=True)
def full(size, fill_value, *, dtype=None, **_):
    return _full(size, fill_value, _target(dtype))


@lowers("aten::full_like", checked_scalars=("fill_value",), fill=True)
def full_like(self, fill_value, *, dtype=None, **_):
    return _full(self.shape, fill_value, _target(dtype, self.dtype))


@lowers("aten::new_full", checked_scalars=("fill_value",), fill=True)
def new_full(self, size, fill_value, *, dtype=None, **_):
    return _full(size, fill_value, _target(dtype, self.dtype))


@lowers("aten::scalar_tensor", checked_scalars=("s",), fill=True)
def scalar_tensor(s, *, dtype=None, **_):
    return _full((), s, _target(dtype))


def _constant(value):
    def zeros(size, *args, dtype=None, **_):
        return _full(size, value, _target(dtype, jnp.float32))

    def like(self, *args, dtype=None, **_):
        return _full(self.shape, value, _target(dtype, self.dtype))

    def new(self, size, *args, dtype=None, **_):
        return _full(size, value, _target(dtype, self.dtype))

    return zeros, like, new


# empty: any values are right; zeros are reproducible.
_zeros, _zeros_like, _new_zeros = _constant(0)
_ones, _ones_like, _new_ones = _constant(1)
lowers("aten::zeros.default", "aten::empty.memory_format", "aten::empty_strided", "aten::empty_permuted",
       "aten::_efficientzerotensor")(_zeros)
lowers("aten::zeros_like", "aten::empty_like", "aten::zero")(_zeros_like)
lowers("aten::new_zeros", "aten::new_empty", "aten::new_empty_strided")(_new_zeros)
lowers("aten::ones.default")(_ones)
lowers("aten::ones_like")(_ones_like)
lowers("aten::new_ones")(_new_ones)


# -- ranges --------------------------------------------------------------------------------
def _range_dtype(dtype, *values) -> torch.dtype:
    """The result dtype: `dtype`, or with none given int64 if every value is
    an integer, else torch's default float dtype (read when the graph is traced)."""
    if dtype is not None:
        return dtype
    integral = all(isinstance(v, (bool, int)) for v in values)
    return torch.int64 if integral else torch.get_default_dtype()


def _accumulate(dtype: torch.dtype):
    """The jax dtype torch's CPU kernels compute a range in (at::acc_type):
    int64 for integer results, float for half and bfloat16, else double."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return jnp.int64
    return jnp.float32 if dtype in (torch.float16, torch.bfloat16) else jnp.float64


def _arange_count(start, end, step, dtype) -> int:
    """Torch's own count: its meta kernel on the same arguments."""
    return torch.arange(start, end, step, dtype=dtype, device="meta").shape[0]


# torch's CPU arange kernel (RangeFactoriesKernel.cpp) fills the output in
# chunks of GRAIN_SIZE split among its threads; in each chunk, whole pairs of
# vectors of 32 bytes (AVX2, which serves AVX512 machines too for this kernel;
# NEON) take base = start + step * first, then base + k * step rounded from the
# result dtype, and the tail elements start + step * i. Its x86 build contracts
# a * b + c into one fused multiply-add.
_GRAIN_SIZE = 32768
_VECTOR_BYTES = 32


def _fma(a, b, c):
    """a * b + c with one rounding (error-free transformations: Dekker's
    product, Knuth's sum), in a's dtype (float64)."""
    def split(x):
        scaled = 134217729.0 * x  # 2**27 + 1
        high = scaled - (scaled - x)
        return high, x - high
    product = a * b
    a_high, a_low = split(a)
    b_high, b_low = split(b)
    product_error = ((a_high * b_high - product) + a_high * b_low + a_low * b_high) + a_low * b_low
    total = product + c
    virtual = total - product
    sum_error = (product - (total - virtual)) + (c - virtual)
    return total + (sum_error + product_error)


def _arange_float(start, step, count, dtype: torch.dtype):
    out = jax_dtype(dtype)
    acc = _accumulate(dtype)
    fma = _fma if acc == jnp.float64 else (lambda a, b, c: a * b + c)  # (measured: no contraction in float)
    to_out = (lambda v: _round_float32(v, out)) if acc == jnp.float32 else (lambda v: v.astype(out).astype(acc))
    lanes = _VECTOR_BYTES // dtype.itemsize
    threads = min(torch.get_num_threads(), -(-count // _GRAIN_SIZE)) if count > _GRAIN_SIZE else 1
    chunk = -(-count // threads) if count else 1
    i = jnp.arange(count, dtype=jnp.int64)
    begin = (i // chunk) * chunk
    size = jnp.minimum(begin + chunk, count) - begin
    vector = i < begin + size - size % (2 * lanes)
    first = begin + ((i - begin) // lanes) * lanes
    start, step = jnp.asarray(start, acc), jnp.asarray(step, acc)
    base = to_out(fma(step, first.astype(acc), start))
    in_vector = fma((i - first).astype(acc), step, base)
    return jnp.where(vector, in_vector, fma(step, i.astype(acc), start))


@lowers("aten::arange.start_step")
def arange(start, end, step=1, *, dtype=None, **_):
    """arange as torch's CPU kernel computes it (above): in its accumulate
    type, then cast."""
    out = _range_dtype(dtype, start, end, step)
    count = _arange_count(start, end, step, out)
    if _accumulate(out) == jnp.int64:
        return int(start) + jnp.arange(count, dtype=jnp.int64) * int(step)
    return _arange_float(start, step, count, out)


@lowers("aten::arange.default")
def arange_end(end, *, dtype=None, **_):
    return arange(0, end, 1, dtype=dtype)


@lowers("aten::arange.start")
def arange_start(start, end, *, dtype=None, **_):
    return arange(start, end, 1, dtype=dtype)


@lowers("aten::range")
def range_(start, end, step=1, *, dtype=None, **_):
    """The deprecated inclusive torch.range."""
    acc = _accumulate(_range_dtype(dtype, start, end, step))
    if acc == jnp.int64:
        start, end, step = int(start), int(end), int(step)
    with warnings.catch_warnings():  # torch.range is deprecated
        warnings.simplefilter("ignore")
        count = torch.range(start, end, step, dtype=_range_dtype(dtype, start, end, step), device="meta").shape[0]
    # RangeFactories.cpp is built without fused multiply-adds (measured)
    return jnp.asarray(start, acc) + jnp.arange(count, dtype=acc) * jnp.asarray(step, acc)


def _float_dtype(dtype):
    """dtype None means torch's default float dtype (read when the graph is traced)."""
    return jax_dtype(dtype if dtype is not None else torch.get_default_dtype())


def _divisor(value, dtype):
    """A constant divisor XLA must divide by: it rewrites x / c as x * (1 / c),
    which is off by an ulp for a third of all x when c = 3 (torch divides)."""
    return lax.optimization_barrier(jnp.asarray(value, dtype))


def _linspace_values(start, end, steps, dtype):
    """torch's CPU kernel: start and end in the result dtype, step in it too
    (in double for integers), the first half counted up from start, the rest
    down from end. Half and bfloat16 round every operation's result, as
    c10::Half's operators do (XLA would keep float32 in between); complex
    numbers are scaled by real counts, so each part is a real linspace."""
    out = jnp.dtype(dtype)
    if jnp.issubdtype(out, jnp.complexfloating):
        part = jnp.finfo(out).dtype
        start, end = jnp.asarray(start), jnp.asarray(end)
        return lax.complex(_linspace_values(jnp.real(start), jnp.real(end), steps, part),
                           _linspace_values(jnp.imag(start), jnp.imag(end), steps, part))
    i = jnp.arange(steps)
    if out in (jnp.float16, jnp.bfloat16):
        rounded = lambda v: _round_float32(v, out)  # noqa: E731
        start = rounded(_scalar_as(start, out, jnp.float32))
        end = rounded(_scalar_as(end, out, jnp.float32))
        if steps == 1:
            return jnp.reshape(start, (1,))
        step = rounded(rounded(end - start) / rounded(_divisor(steps - 1, jnp.float32)))
        up = rounded(start + rounded(step * rounded(i.astype(jnp.float32))))
        down = rounded(end - rounded(step * rounded((steps - 1 - i).astype(jnp.float32))))
        return jnp.where(i < steps // 2, up, down)
    # float, double, and integers (whose step is a double): the x86 build
    # contracts start + step * i into one fused multiply-add
    compute = out if jnp.issubdtype(out, jnp.inexact) else jnp.float64
    start = _scalar_as(start, out, compute)
    end = _scalar_as(end, out, compute)
    if steps == 1:
        return jnp.reshape(start, (1,))
    step = (end - start) / _divisor(steps - 1, compute)
    up = _fused_multiply_add(step, i.astype(compute), start)
    down = _fused_multiply_add(-step, (steps - 1 - i).astype(compute), end)
    return jnp.where(i < steps // 2, up, down)


def _fused_multiply_add(a, b, c):
    """a * b + c rounded once, in a's dtype: float32 through float64 (the
    product is exact there), float64 by error-free transformations."""
    if a.dtype == jnp.float32:
        return (a.astype(jnp.float64) * b.astype(jnp.float64) + c.astype(jnp.float64)).astype(jnp.float32)
    return _fma(a, b, c)


def _round_float32(x, dtype):
    """float32 x rounded to the precision of dtype (half or bfloat16), still float32: kept, as
    every op's rounding is (to_jax.COMPILER_OPTIONS)."""
    return x.astype(dtype).astype(jnp.float32)


def _scalar_as(value, dtype, compute):
    """A Scalar's value in `dtype` (c10's Scalar::to: floats narrow through
    float32), as `compute`."""
    value = jnp.asarray(value)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize < 4:
        value = lax.optimization_barrier(cast(value, jnp.float32))
    return cast(value, dtype).astype(compute)


@lowers("aten::linspace")
def linspace(start, end, steps, *, dtype=None, **_):
    dtype = _float_dtype(dtype)
    if steps == 0:
        return jnp.zeros((0,), dtype)
    return cast(_linspace_values(start, end, steps, dtype), dtype)


@lowers("aten::logspace")
def logspace(start, end, steps, base=10.0, *, dtype=None, **_):
    """torch's CPU loop (RangeFactories.cpp, built without fused
    multiply-adds): base ** (start + step * i), the second half counted from
    end, start and end in the result dtype, step and the power in double
    (complex results: in the result dtype). XLA's pow can differ from libm's
    by an ulp in double (float32 results come out equal)."""
    dtype = jnp.dtype(_float_dtype(dtype))
    if steps == 0:
        return jnp.zeros((0,), dtype)
    if steps == 1:
        exponent = jnp.asarray(start).astype(jnp.complex128 if jnp.issubdtype(dtype, jnp.complexfloating)
                                             else jnp.float64)
        return cast(jnp.reshape(jnp.power(jnp.asarray(base, exponent.dtype), exponent), (1,)), dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        exponent = _linspace_values(start, end, steps, dtype)
        return jnp.power(jnp.asarray(base, dtype), exponent)
    start = _scalar_as(start, dtype, dtype)
    end = _scalar_as(end, dtype, dtype)
    step = (end - start).astype(jnp.float64) / _divisor(steps - 1, jnp.float64)
    i = jnp.arange(steps)
    up = start.astype(jnp.float64) + step * i
    down = end.astype(jnp.float64) - step * (steps - 1 - i)
    exponent = jnp.where(i < steps // 2, up, down)
    return cast(jnp.power(jnp.float64(base), exponent), dtype)


@lowers("aten::eye")
def eye(n, m=None, *, dtype=None, **_):
    return jnp.eye(n, n if m is None else m, dtype=_target(dtype, jnp.float32))


def _triangle_indices(row, col, offset, dtype, upper: bool):
    """The (row, column) pairs of a triangle, row by row: entry k lies in the
    row whose running count first exceeds k (iotas and a search over the
    row counts, not a constant as large as the result)."""
    rows = np.arange(row)
    first = np.clip(rows + offset, 0, col) if upper else np.zeros(row, np.int64)
    counts = (col - first) if upper else np.clip(rows + offset + 1, 0, col)
    ends = np.cumsum(counts)
    k = jnp.arange(int(ends[-1]) if row else 0, dtype=jnp.int64)
    r = jnp.searchsorted(jnp.asarray(ends), k, side="right")
    c = k - jnp.asarray(ends - counts)[r] + jnp.asarray(first)[r]
    return jnp.stack([r, c]).astype(_target(dtype, jnp.int64))


@lowers("aten::tril_indices")
def tril_indices(row, col, offset=0, *, dtype=None, **_):
    return _triangle_indices(row, col, offset, dtype, upper=False)


@lowers("aten::triu_indices")
def triu_indices(row, col, offset=0, *, dtype=None, **_):
    return _triangle_indices(row, col, offset, dtype, upper=True)


# -- random: drawn on the host by torch's CPU generator, so torch.manual_seed holds ------------
# (an op with a Generator argument is random by its schema; these have none)
handled_as(Handling.RANDOM, "aten::rand", "aten::randn", "aten::randint", "aten::randperm", reason=RANDOM_REASON)
handled_as(Handling.RANDOM_LIKE, "aten::rand_like", "aten::randn_like", "aten::randint_like",
           reason="reads only its input's shape and dtype")


# -- PyTorch's primitives (torch._prims), where its decompositions reach them ----------------------
@lowers("prims::convert_element_type")
def prims_convert_element_type(a, dtype):
    return cast(a, jax_dtype(dtype))


@lowers("prims::iota")
def prims_iota(length, *, start, step, dtype, **_):
    return start + jnp.arange(length, dtype=jax_dtype(dtype)) * step


@lowers("prims::full")
def prims_full(shape, fill_value, *, dtype, **_):
    return _full(shape, fill_value, jax_dtype(dtype))


@lowers("prims::full_like")
def prims_full_like(a, fill_value, *, dtype, **_):
    return _full(a.shape, fill_value, jax_dtype(dtype))


@lowers("prims::empty", "prims::empty_strided", "prims::empty_permuted")
def prims_empty(shape, *args, dtype, **_):
    return jnp.zeros(tuple(shape), jax_dtype(dtype))


@lowers("prims::scalar_tensor")
def prims_scalar_tensor(s, *, dtype=None, **_):
    return _full((), s, _target(dtype))


@lowers("prims::fill")
def prims_fill(self, value):
    return _full(self.shape, value, self.dtype)
