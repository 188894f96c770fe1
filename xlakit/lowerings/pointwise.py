"""Elementwise ops: arithmetic, rounding, clamping, selection, comparisons and
logic, complex parts, and the helpers the family shares. The family's other
modules, which import these helpers: activations.py (activations and their backward
ops), special.py (special functions) and bessel.py (the Bessel and Airy
functions ATen ports from Cephes).

Each lowering follows eager CPU torch's kernel formula (ATen's
BinaryOpsKernel / UnaryOpsKernel, or PyTorch's decompositions where they
state the same formula), edge cases included: NaN and -0.0, integer wrap,
shifts past the bit width, Python's sign rules for floor division and
remainder. `promote=True` entries get their array operands in the dtype torch
computes in; Python numbers (ints and bools, and floats of ops that do not
lift them) become arrays of that dtype by `as_dtype`, wrapping as C casts do
(an int8 tensor plus 300 adds 44, as in eager). float16 and bfloat16 compute
in float32 (`opmath`), as torch's CPU kernels do, and are rounded once by the
caller's cast.

Integer division or remainder by zero, where XLA gives a value, raises
eager's RuntimeError("ZeroDivisionError") through an in-graph check
(checks.require); an int tensor to a negative Python int power runs eagerly,
which raises as eager does. A Python number or 0-d tensor met by a float16 /
bfloat16 tensor is read as eager's kernel reads it: rounded to the tensor's
dtype (add, sub, clamp, pow), or in float32 (mul, div, addcmul, addcdiv,
lerp's Scalar weight: Lowering.opmath_scalar). Not matched: the last bit of
some float16 / bfloat16 results (eager's scalar and vectorized loops round
differently).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..core import checks
from .dtypes import category, computation_dtype, jax_dtype
from .registry import lowers
from .verdicts import NeedsEager

NUMBER = (bool, int, float, complex)


# -- helpers --------------------------------------------------------------------------
def is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


def is_int(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.integer)


def is_complex(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.complexfloating)


def as_dtype(value, dtype):
    """A Python number (or an array) as an array of `dtype`; ints wrap as a C cast does."""
    dtype = jnp.dtype(dtype)
    if not isinstance(value, NUMBER):
        return jnp.asarray(value).astype(dtype)
    if jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
        if isinstance(value, complex):
            value = value.real
        return jnp.asarray(np.array(value).astype(dtype))
    return jnp.asarray(value, dtype)


def _scalar_category(value) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return 1
    return 2 if isinstance(value, float) else 3


def _default_float():
    return jax_dtype(torch.get_default_dtype())


def _raised(dtype, rank: int):
    """torch's dtype for a tensor of `dtype` met by a Python number of a higher category."""
    if rank == 1:
        return jnp.int64
    if rank == 2:
        return _default_float()
    if jnp.dtype(dtype) == jnp.float64 or _default_float() == jnp.float64:
        return jnp.complex128
    return jnp.complex64


def common(*values):
    """Arrays and Python numbers in the dtype torch computes them in: the arrays'
    promotion (a 0-d array gives way to a dimensioned one of its category), raised
    by a Python number of a higher category. Returns the values as arrays."""
    arrays = [v for v in values if not isinstance(v, NUMBER)]
    numbers = [v for v in values if isinstance(v, NUMBER)]
    dtype = jax_dtype(computation_dtype(arrays, None)) if arrays else None
    if numbers:
        top = max(_scalar_category(n) for n in numbers)
        if dtype is None:
            dtype = {0: jnp.bool_, 1: jnp.int64, 2: _default_float(), 3: _raised(None, 3)}[top]
        elif top > category(dtype):
            dtype = _raised(dtype, top)
    return tuple(as_dtype(v, dtype) for v in values)


def _with(x, value):
    """`value` (a Python number or an array) in x's dtype, x raised first where a
    Python number of a higher category meets it (comparisons: int tensor < 2.5)."""
    if isinstance(value, NUMBER) and _scalar_category(value) > category(x.dtype):
        x = x.astype(_raised(x.dtype, _scalar_category(value)))
    return x, as_dtype(value, x.dtype)


def opmath(*xs):
    """float16 / bfloat16 arrays in float32, where torch's CPU kernels compute them."""
    out = tuple(x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x for x in xs)
    return out if len(out) != 1 else out[0]


def with_scalar(self, other):
    """self and other as eager's mul / div kernels read them: a scalar `other` (a
    Python number, or a 0-d operand: Lowering.opmath_scalar) of a float16 /
    bfloat16 self in float32, unrounded, and the op in float32; otherwise
    other in self's dtype."""
    if self.dtype in (jnp.float16, jnp.bfloat16) and jnp.ndim(other) == 0:
        return opmath(self), as_dtype(other, jnp.float32)
    return self, as_dtype(other, self.dtype)


# -- arithmetic -----------------------------------------------------------------------
@lowers("aten::add", promote=True, lift_scalars=True, checked_scalars=("alpha",))
def add(self, other, *, alpha=1):
    other = as_dtype(other, self.dtype)
    if self.dtype == jnp.bool_:
        return self | (other & as_dtype(alpha, jnp.bool_))
    if not (isinstance(alpha, NUMBER) and alpha == 1):
        x, y, a = opmath(self, other, as_dtype(alpha, self.dtype))  # eager's vectorized loop
        return x + a * y
    return self + other


def _refusing_bools(subtract):
    """sub's and rsub's shape rule: their meta kernels refuse two bool operands, eager any one
    (`tensor([True]) - tensor([1])`): eager's own error, asked of empty CPU tensors of the
    operands' dtypes, then the meta kernel."""
    def meta(self, other, *, alpha=1):
        if any(x.dtype == torch.bool if isinstance(x, torch.Tensor) else type(x) is bool for x in (self, other)):
            subtract(*(torch.empty(0, dtype=x.dtype) if isinstance(x, torch.Tensor) else x for x in (self, other)),
                     alpha=alpha)
        return subtract(self, other, alpha=alpha)
    return meta


@lowers("aten::sub", promote=True, lift_scalars=True, checked_scalars=("alpha",), meta=_refusing_bools(torch.sub))
def sub(self, other, *, alpha=1):
    other = as_dtype(other, self.dtype)
    if not (isinstance(alpha, NUMBER) and alpha == 1):
        x, y, a = opmath(self, other, as_dtype(alpha, self.dtype))
        return x - a * y
    return self - other


@lowers("aten::rsub", promote=True, lift_scalars=True, checked_scalars=("alpha",), meta=_refusing_bools(torch.rsub))
def rsub(self, other, alpha=1):
    return sub(as_dtype(other, self.dtype), self, alpha=alpha)


@lowers("aten::mul", promote=True, opmath_scalar="other", lift_scalars=True)
def mul(self, other):
    self, other = with_scalar(self, other)
    if self.dtype == jnp.bool_:
        return self & other
    return self * other


def _div_trunc(a, b):
    if is_int(a) or a.dtype == jnp.bool_:
        return lax.div(*jnp.broadcast_arrays(a, b))  # C division: rounds toward zero
    return jnp.trunc(a / b)


def _div_floor(a, b):
    if is_int(a):
        a, b = jnp.broadcast_arrays(a, b)
        q = lax.div(a, b)
        r = lax.rem(a, b)
        return jnp.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)
    if a.dtype == jnp.bool_:
        return a  # True // True
    # ATen's div_floor_floating
    mod = jnp.fmod(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floordiv = jnp.floor(div)
    floordiv = jnp.where(div - floordiv > 0.5, floordiv + 1, floordiv)
    floordiv = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), a / b), floordiv)
    return jnp.where(b == 0, a / b, floordiv)


def _require_nonzero_divisor(a, b) -> None:
    """Eager raises on an integer division by zero (of a non-empty result)."""
    if is_int(a) or is_int(b):
        shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
        checks.require(jnp.broadcast_to(jnp.asarray(b) != 0, shape), RuntimeError, "ZeroDivisionError")


@lowers("aten::true_divide", promote=True, opmath_scalar="other")
@lowers("aten::div", promote=True, opmath_scalar="other", lift_scalars=True)
def div(self, other, *, rounding_mode=None):
    self, other = with_scalar(self, other)
    if rounding_mode is not None:
        _require_nonzero_divisor(self, other)
    if rounding_mode == "trunc":
        return _div_trunc(self, other)
    if rounding_mode == "floor":
        return _div_floor(self, other)
    # in float32 for half types, as eager's kernel: XLA turns a division by a broadcast
    # divisor into a product with its reciprocal, which in float16 rounds twice (~1 ulp off)
    self, other = opmath(self, other)
    if self.dtype == jnp.float32 and jnp.shape(other) != jnp.shape(self) and jax.default_backend() == "cpu":
        # that product is an ulp off eager CPU's float32 quotient for about a third of all
        # dividends (and a float16 tie then rounds the other way). Taken in float64, even as the
        # product, it rounds to the correctly rounded float32 quotient (53 >= 2 * 24 + 2 bits).
        # Not off the CPU: eager CUDA multiplies by a scalar divisor's reciprocal itself.
        return (self.astype(jnp.float64) / other.astype(jnp.float64)).astype(jnp.float32)
    return self / other


@lowers("aten::floor_divide", promote=True, opmath_scalar="other")
def floor_divide(self, other):
    self, other = with_scalar(self, other)
    _require_nonzero_divisor(self, other)
    return _div_floor(self, other)


def _remainder(a, b):
    if isinstance(a, NUMBER):
        a = as_dtype(a, b.dtype)
    b = as_dtype(b, a.dtype)
    _require_nonzero_divisor(a, b)
    if a.dtype == jnp.bool_:
        a, b = a.astype(jnp.uint8), b.astype(jnp.uint8)
    mod = jnp.fmod(a, b)  # C's % for integers
    return jnp.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


@lowers("aten::remainder", promote=True)
def remainder(self, other):
    return _remainder(self, other)


@lowers("aten::fmod", promote=True)
def fmod(self, other):
    other = as_dtype(other, self.dtype)
    _require_nonzero_divisor(self, other)
    return jnp.fmod(self, other)  # C's fmod, and % for integers


def _int_pow(base, exp):
    """ATen's powi: a negative exponent gives 1 for base 1, +-1 for base -1 and 0 otherwise."""
    positive = jnp.power(base, jnp.maximum(exp, 0))  # repeated squaring, wrapping
    one = jnp.ones_like(base)
    negative = jnp.where(base == 1, one, jnp.where(base == -1, jnp.where(exp % 2 == 0, one, -one),
                                                   jnp.zeros_like(base)))
    return jnp.where(exp < 0, negative, positive)


def _pow_scalar_exponent(base, exp):
    """ATen's pow(Tensor, Scalar): 0 -> ones, 1 -> copy, and the kernel's special cases."""
    if not isinstance(exp, NUMBER):  # a lifted 0-d exponent
        return _pow(base, exp.astype(base.dtype))
    if base.dtype in (jnp.float16, jnp.bfloat16) and not isinstance(exp, complex):
        exp = float(np.asarray(exp, base.dtype))  # the kernel reads it rounded (float16 ** 1e-8 is 1)
    if exp == 0:
        return jnp.ones_like(base)
    if exp == 1:
        return base
    if not (is_float(base) or is_complex(base)):
        if exp < 0:  # eager raises, whatever the data: its message comes from running it
            raise NeedsEager("an integer tensor to a negative integer power")
        if base.dtype == jnp.bool_:
            return base
        return lax.integer_pow(base, int(exp)) if exp > 0 else _int_pow(base, as_dtype(exp, base.dtype))
    x = opmath(base)
    if exp == 2:
        return x * x
    if exp == 3:
        return x * x * x
    if exp == -2:
        return 1 / (x * x)
    if exp == 0.5 and not is_complex(x):
        return jnp.sqrt(x)
    if exp == -0.5 and not is_complex(x):
        return lax.rsqrt(x)
    if exp == -1:
        return 1 / x
    return jnp.power(x, as_dtype(exp, x.dtype))


def _pow(base, exp):
    if is_float(base) or is_complex(base):
        base, exp = opmath(base, exp)
        return jnp.power(base, exp)
    if base.dtype == jnp.bool_:
        return base | ~exp  # x ** False == True
    return _int_pow(base, exp)


@lowers("aten::pow.Tensor_Tensor", promote=True)
def pow_tensor_tensor(self, exponent):
    return _pow(self, exponent)


@lowers("aten::pow.Tensor_Scalar", promote=True, checked_scalars=("exponent",))
def pow_tensor_scalar(self, exponent):
    return _pow_scalar_exponent(self, exponent)


@lowers("aten::pow.Scalar", promote=True)
def pow_scalar(self, exponent):
    if isinstance(self, NUMBER) and self == 1:
        return jnp.ones_like(exponent)
    return _pow(as_dtype(self, exponent.dtype), exponent)


@lowers("aten::float_power", promote=True)
def float_power(self, exponent):
    if isinstance(self, NUMBER):
        self = as_dtype(self, exponent.dtype)
    if isinstance(exponent, NUMBER):
        return _pow_scalar_exponent(self, exponent)
    return _pow(self, exponent)


@lowers("aten::neg", promote=True)
def neg(self):
    return -self


@lowers("aten::positive", promote=True)
def positive(self):
    return self


@lowers("aten::abs", promote=True)
def abs_(self):
    return self if self.dtype == jnp.bool_ else jnp.abs(self)


@lowers("aten::sign", promote=True)
def sign(self):
    if self.dtype == jnp.bool_:
        return self
    if is_float(self):  # (0 < x) - (x < 0): sign(NaN) and sign(-0.0) are +0.0
        return (self > 0).astype(self.dtype) - (self < 0).astype(self.dtype)
    return jnp.sign(self)


@lowers("aten::sgn", promote=True)
def sgn(self):
    if not is_complex(self):
        return sign(self)
    magnitude = jnp.abs(self)
    return jnp.where(magnitude == 0, jnp.zeros_like(self), self / magnitude.astype(self.dtype))


@lowers("aten::signbit", promote=True)
def signbit(self):
    if is_float(self):
        return jnp.signbit(self)
    if self.dtype == jnp.bool_ or jnp.issubdtype(self.dtype, jnp.unsignedinteger):
        return jnp.zeros(self.shape, jnp.bool_)
    return self < 0


@lowers("aten::reciprocal", promote=True)
def reciprocal(self):
    return 1 / self


@lowers("aten::square", promote=True)
def square(self):
    return self & self if self.dtype == jnp.bool_ else self * self


def register_unary(table):
    """float16 / bfloat16 in float32: XLA's own half-precision exp2, asin... are
    several ulps off where eager's (float32, rounded once) are not."""
    for name, fn in table.items():
        lowers(name, promote=True)(lambda self, _fn=fn: _fn(opmath(self)))


register_unary({
    "aten::sqrt": jnp.sqrt, "aten::rsqrt": lax.rsqrt, "aten::exp": jnp.exp, "aten::exp2": jnp.exp2,
    "aten::expm1": jnp.expm1, "aten::log": jnp.log, "aten::log2": jnp.log2, "aten::log10": jnp.log10,
    "aten::log1p": jnp.log1p, "aten::sin": jnp.sin, "aten::cos": jnp.cos, "aten::tan": jnp.tan,
    "aten::asin": jnp.arcsin, "aten::acos": jnp.arccos, "aten::atan": jnp.arctan, "aten::sinh": jnp.sinh,
    "aten::cosh": jnp.cosh, "aten::tanh": jnp.tanh, "aten::asinh": jnp.arcsinh, "aten::acosh": jnp.arccosh,
    "aten::atanh": jnp.arctanh,
    "aten::conj_physical": jnp.conj, "aten::_conj_physical": jnp.conj,
})


def _rounding(fn):
    """floor / ceil / trunc / round: integers and bools are their own value."""
    def lowering(self):
        return fn(self) if is_float(self) else self
    return lowering


lowers("aten::floor", promote=True)(_rounding(jnp.floor))
lowers("aten::ceil", promote=True)(_rounding(jnp.ceil))
lowers("aten::trunc", "aten::fix", promote=True)(_rounding(jnp.trunc))


@lowers("aten::round", promote=True)
def round_(self, *, decimals=0):
    if not is_float(self):
        return self
    if decimals == 0:
        return jnp.round(self)  # half to even, as nearbyint
    x = opmath(self)
    ten_pow = as_dtype(10.0 ** abs(decimals), x.dtype)
    if decimals < 0:
        return jnp.round(x / ten_pow) * ten_pow
    return jnp.round(x * ten_pow) / ten_pow


@lowers("aten::frac", promote=True)
def frac(self):
    return self - jnp.trunc(self)


@lowers("aten::deg2rad", promote=True)
def deg2rad(self):
    return self * as_dtype(math.pi / 180, self.dtype)


@lowers("aten::rad2deg", promote=True)
def rad2deg(self):
    return self * as_dtype(180 / math.pi, self.dtype)


@lowers("aten::sinc", promote=True)
def sinc(self):
    x = opmath(self)
    product = x * as_dtype(math.pi, x.dtype)
    return jnp.where(product == 0, jnp.ones_like(x), jnp.sin(product) / product)


@lowers("aten::atan2", "aten::arctan2", promote=True)
def atan2(self, other):
    return jnp.arctan2(self, other)


@lowers("aten::hypot", promote=True)
def hypot(self, other):
    return jnp.hypot(*opmath(self, other))


@lowers("aten::copysign", promote=True)
def copysign(self, other):
    return jnp.copysign(self, as_dtype(other, self.dtype))


@lowers("aten::nextafter", promote=True)
def nextafter(self, other):
    return jnp.nextafter(self, other)


@lowers("aten::ldexp", promote=True)
def ldexp(self, other):
    return self * jnp.exp2(other)


@lowers("aten::logaddexp", promote=True)
def logaddexp(self, other):
    a, b = opmath(self, other)
    if is_complex(a):
        raise NeedsEager("complex logaddexp is not lowered")
    m = jnp.maximum(a, b)
    out = m + jnp.log1p(jnp.exp(-jnp.abs(a - b)))
    return jnp.where(jnp.isinf(a) & (a == b), a, out)


@lowers("aten::logaddexp2", promote=True)
def logaddexp2(self, other):
    a, b = opmath(self, other)
    m = jnp.maximum(a, b)
    out = m + jnp.log1p(jnp.exp2(-jnp.abs(a - b))) / as_dtype(math.log(2), a.dtype)
    return jnp.where(jnp.isinf(a) & (a == b), a, out)


@lowers("aten::frexp", promote=True)
def frexp(self):
    """From the bits: XLA's CPU arithmetic flushes subnormals, whose exponent
    eager gives (frexp(1e-40) is 0.544 * 2**-132)."""
    info = jnp.finfo(self.dtype)
    uint = {16: jnp.uint16, 32: jnp.uint32, 64: jnp.uint64}[info.bits]
    one = lambda v: jnp.asarray(v, uint)  # noqa: E731
    bits = lax.bitcast_convert_type(self, uint)
    nmant, bias = info.nmant, info.maxexp - 1
    field = (bits >> one(nmant)) & one(2 * bias + 1)
    fraction = bits & one((1 << nmant) - 1)
    # a subnormal's fraction shifted until its leading one leaves the field
    leading = lax.clz(fraction).astype(jnp.int32) - (info.bits - nmant)
    normalized = (fraction << (leading + 1).astype(uint)) & one((1 << nmant) - 1)
    subnormal = field == 0
    exponent = jnp.where(subnormal, -(bias - 1) - leading, field.astype(jnp.int32) - (bias - 1))
    mantissa_bits = (bits & ~one((1 << (info.bits - 1)) - 1)) | one((bias - 1) << nmant) \
        | jnp.where(subnormal, normalized, fraction)
    mantissa = lax.bitcast_convert_type(mantissa_bits, self.dtype)
    special = (self == 0) | ~jnp.isfinite(self)
    return (jnp.where(special, self, mantissa),
            jnp.where(special, 0, exponent).astype(jnp.int32))


@lowers("aten::gcd", promote=True)
def gcd(self, other):
    return jnp.gcd(self, other)


@lowers("aten::lcm", promote=True)
def lcm(self, other):
    g = jnp.gcd(self, other)
    safe = jnp.where(g == 0, jnp.ones_like(g), g)
    return jnp.where(g == 0, jnp.zeros_like(g), jnp.abs(self // safe * other))


# -- clamping, maxima and minima ---------------------------------------------------------
def clamp_values(x, lo, hi):
    """minimum(maximum(x, lo), hi): NaN in any operand propagates; lo > hi gives hi."""
    if lo is not None:
        x = jnp.maximum(x, as_dtype(lo, x.dtype))
    if hi is not None:
        x = jnp.minimum(x, as_dtype(hi, x.dtype))
    return x


@lowers("aten::clip.Tensor", promote=True)
@lowers("aten::clamp.Tensor", promote=True, lift_scalars=True, checked_scalars=("min", "max"))
def clamp_tensor(self, min=None, max=None):
    return clamp_values(self, min, max)


@lowers("aten::clip.default", promote=True)
@lowers("aten::clamp.default", promote=True, lift_scalars=True, checked_scalars=("min", "max"))
def clamp(self, min=None, max=None):
    """Scalar bounds (lifted to 0-d arrays), as ATen's clamp_out: one NaN bound of
    two makes every element NaN; a NaN bound alone is ignored before torch 2.13."""
    if min is None or max is None:
        bound = as_dtype(max if min is None else min, self.dtype)
        out = clamp_values(self, min, max)
        ignored = is_float(self) and _nan_bound_alone_is_ignored()
        return jnp.where(jnp.isnan(bound), self, out) if ignored else out
    out = clamp_values(self, min, max)
    if not is_float(self):
        return out
    lo, hi = as_dtype(min, self.dtype), as_dtype(max, self.dtype)
    return jnp.where(jnp.isnan(lo) | jnp.isnan(hi), jnp.full_like(out, jnp.nan), out)


@functools.cache
def _nan_bound_alone_is_ignored() -> bool:
    """torch 2.9's clamp(x, min=nan) is x, torch 2.13's NaN: asked of eager once."""
    return not torch.tensor([1.0]).clamp(min=float("nan")).isnan().item()


@lowers("aten::clamp_min", promote=True, checked_scalars=("min",))
def clamp_min(self, min):
    return clamp_values(self, min, None)


@lowers("aten::clamp_max", promote=True, checked_scalars=("max",))
def clamp_max(self, max):
    return clamp_values(self, None, max)


@lowers("aten::maximum", "aten::max.other", promote=True)
def maximum(self, other):
    return jnp.maximum(self, other)


@lowers("aten::minimum", "aten::min.other", promote=True)
def minimum(self, other):
    return jnp.minimum(self, other)


@lowers("aten::fmax", promote=True)
def fmax(self, other):
    return jnp.fmax(self, other)


@lowers("aten::fmin", promote=True)
def fmin(self, other):
    return jnp.fmin(self, other)


def lerp(self, end, weight):
    """ATen's lerp: weight < 0.5 in magnitude counts from start, otherwise from end."""
    start, end = opmath(self, end)
    weight = as_dtype(weight, start.dtype)
    from_start = start + weight * (end - start)
    from_end = end - (end - start) * (1 - weight)
    return jnp.where(jnp.abs(weight) < 0.5, from_start, from_end)


# a Scalar weight is read in float32 for float16 / bfloat16 (`weight.to<opmath_t>()`), a tensor one rounded
lowers("aten::lerp.Tensor", promote=True, lift_scalars=True, checked_scalars=("weight",))(lerp)
lowers("aten::lerp.Scalar", promote=True, opmath_scalar="weight", lift_scalars=True, checked_scalars=("weight",))(lerp)


# -- selection and filling ------------------------------------------------------------------
def _as_bool(mask):
    return mask if mask.dtype == jnp.bool_ else mask != 0


@lowers("aten::where.self", "aten::where.ScalarSelf", "aten::where.ScalarOther", "aten::where.Scalar",
        lift_scalars=True)
def where(condition, self, other):
    """The condition is bool and takes no part in the promotion."""
    self, other = common(self, other)
    return jnp.where(_as_bool(condition), self, other)


@lowers("aten::masked_fill", lift_scalars=True, checked_scalars=("value",))
def masked_fill(self, mask, value):
    """The result keeps self's dtype; value (a number or 0-d array) is cast to it."""
    return jnp.where(_as_bool(mask), as_dtype(value, self.dtype), self)


@lowers("aten::fill", lift_scalars=True, checked_scalars=("value",), fill=True)
def fill(self, value):
    return jnp.broadcast_to(as_dtype(value, self.dtype), self.shape)


@lowers("aten::heaviside", promote=True)
def heaviside(self, values):
    return jnp.where(self == 0, values, (self > 0).astype(self.dtype))


@lowers("aten::nan_to_num", promote=True)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    if not (is_float(self) or is_complex(self)):
        return self
    if is_complex(self):
        return lax.complex(nan_to_num(self.real, nan, posinf, neginf),
                           nan_to_num(self.imag, nan, posinf, neginf))
    info = jnp.finfo(self.dtype)
    x = jnp.where(jnp.isnan(self), as_dtype(0.0 if nan is None else nan, self.dtype), self)
    x = jnp.where(jnp.isneginf(self), as_dtype(info.min if neginf is None else neginf, self.dtype), x)
    return jnp.where(jnp.isposinf(self), as_dtype(info.max if posinf is None else posinf, self.dtype), x)


# -- comparisons and logic ---------------------------------------------------------------------
def _comparison(compare):
    def lowering(self, other):
        if isinstance(self, NUMBER):
            other, self = _with(other, self)
        else:
            self, other = _with(self, other)
        return compare(self, other)
    return lowering


for _name, _compare in {"eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal,
                        "gt": jnp.greater, "ge": jnp.greater_equal}.items():
    lowers(f"aten::{_name}", promote=True)(_comparison(_compare))


def _logical(combine):
    def lowering(self, other):
        return combine(_as_bool(self), _as_bool(other))
    return lowering


lowers("aten::logical_and")(_logical(jnp.logical_and))
lowers("aten::logical_or")(_logical(jnp.logical_or))
lowers("aten::logical_xor")(_logical(jnp.logical_xor))


@lowers("aten::logical_not")
def logical_not(self):
    return ~_as_bool(self)


def _bitwise(combine):
    def lowering(self, other):
        if isinstance(self, NUMBER):
            self = as_dtype(self, other.dtype)
        return combine(self, as_dtype(other, self.dtype))
    return lowering


lowers("aten::bitwise_and", "aten::__and__", promote=True)(_bitwise(jnp.bitwise_and))
lowers("aten::bitwise_or", "aten::__or__", promote=True)(_bitwise(jnp.bitwise_or))
lowers("aten::bitwise_xor", "aten::__xor__", promote=True)(_bitwise(jnp.bitwise_xor))


@lowers("aten::bitwise_not", promote=True)
def bitwise_not(self):
    return jnp.invert(self)


def _shift(left: bool):
    """ATen's shifts: an amount < 0 or >= the bit width shifts everything out
    (0 for left shifts, the sign for right shifts)."""
    def lowering(self, other):
        if isinstance(self, NUMBER):
            self = as_dtype(self, other.dtype)
        if not is_int(self):
            raise NeedsEager(f"shifts of {self.dtype} are not lowered")
        amount = as_dtype(other, self.dtype)
        bits = jnp.iinfo(self.dtype).bits
        out_of_range = (amount < 0) | (amount >= bits)
        safe = jnp.where(out_of_range, jnp.zeros_like(amount), amount)
        if left:
            return jnp.where(out_of_range, jnp.zeros_like(self), jnp.left_shift(self, safe))
        shifted = jnp.right_shift(self, safe)  # arithmetic for signed types, logical for unsigned
        everything = jnp.where(self < 0, -jnp.ones_like(self), jnp.zeros_like(self))
        return jnp.where(out_of_range, everything, shifted)
    return lowering


lowers("aten::bitwise_left_shift", "aten::__lshift__", promote=True)(_shift(left=True))
lowers("aten::bitwise_right_shift", "aten::__rshift__", promote=True)(_shift(left=False))


def _classify(fn, for_integers: bool):
    def lowering(self):
        if is_float(self) or is_complex(self):
            return fn(self)
        return jnp.full(self.shape, for_integers)
    return lowering


lowers("aten::isnan")(_classify(jnp.isnan, False))
lowers("aten::isinf")(_classify(jnp.isinf, False))
lowers("aten::isfinite")(_classify(jnp.isfinite, True))
lowers("aten::isposinf")(_classify(jnp.isposinf, False))
lowers("aten::isneginf")(_classify(jnp.isneginf, False))


# -- complex --------------------------------------------------------------------------------------
@lowers("aten::angle", promote=True)
def angle(self):
    if is_complex(self):
        return jnp.angle(self)
    pi = jnp.full_like(self, jnp.pi)
    return jnp.where(jnp.isnan(self), self, jnp.where(self < 0, pi, jnp.zeros_like(self)))


@lowers("aten::polar")
def polar(abs, angle):
    abs, angle = jnp.broadcast_arrays(abs, angle)
    return lax.complex(abs * jnp.cos(angle), abs * jnp.sin(angle))


@lowers("aten::complex")
def complex_(real, imag):
    real, imag = jnp.broadcast_arrays(real, imag)
    return lax.complex(real, imag)


def _with_value(combine):
    """addcmul / addcdiv: `value` is a lifted 0-d input (a new learning rate
    must not recompile), in the operands' dtype, float32 for float16 /
    bfloat16 (eager's `value.to<float>()`, unrounded)."""
    def lowering(self, tensor1, tensor2, *, value=1):
        x, t1, t2 = opmath(self, tensor1, tensor2)
        return x + combine(as_dtype(value, x.dtype), t1, t2)
    return lowering


# ATen: self + value * t1 * t2 and self + value * t1 / t2, left to right
lowers("aten::addcmul", promote=True, opmath_scalar="value", lift_scalars=True, checked_scalars=("value",))(
    _with_value(lambda v, a, b: v * a * b))
lowers("aten::addcdiv", promote=True, opmath_scalar="value", lift_scalars=True, checked_scalars=("value",))(
    _with_value(lambda v, a, b: v * a / b))


@lowers("prims::fma", promote=True, lift_scalars=True)
def fma(a, b, c):
    """torch._inductor's a * b + c, rounded once: Dynamo writes `addcmul_`, `addcdiv_` and
    `add_` with a tensor alpha as it (torch 2.13's dynamo decompositions, in AdamW's step).
    Below float64 it is computed in float64 (where the product is exact), then rounded."""
    dtype = a.dtype
    if dtype in (jnp.float16, jnp.bfloat16, jnp.float32):
        a, b, c = (as_dtype(x, jnp.float64) for x in (a, b, c))
        return as_dtype(a * b + c, dtype)
    return a * b + as_dtype(c, dtype)

del _name, _compare

