"""Elementwise lowerings (xlakit/lowerings/pointwise.py) against eager torch on
the cases where a plausible lowering goes wrong: values, dtypes and shapes
agree, the sign of a zero too, and each case runs compiled, not on CPU."""
import jax.scipy.special
import pytest
import torch

import xlakit
from xlakit import lowerings
from xlakit.lowerings import eager

aten = torch.ops.aten
nan, inf = float("nan"), float("inf")


def T(values, dtype=torch.float32):  # noqa: N802
    return torch.tensor(values, dtype=dtype)


INT_DTYPES = (torch.int64, torch.int32, torch.int8)
SIGNED = T([7, -7, 0, 3, -3, 9, -9, 1])
DIVISORS = T([2, 2, 5, -4, -4, -2, -2, 3])
FLOATS = T([7.5, -7.5, 0.0, -0.0, 3.0, -2.5, 0.5, -0.5, nan, inf, -inf, 1e-3])
EDGES = T([0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0, nan, inf, -inf])
GRID = torch.linspace(-4.5, 4.5, 19)  # includes -3, 0, 3 and points between
HALVES = T([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 0.49999997, 1234.5678, -0.0, 1250.0, -1350.0])
UNIT = T([0.0, 1e-4, 0.2, 0.5, 0.9, 1.0, -0.1, 1.1, nan])
POS = T([1e-3, 0.1, 0.5, 1.0, 2.5, 7.0, 30.0, 100.0])

CASES = {}


def case(name, fn, *inputs, **tolerance):
    assert name not in CASES, name
    CASES[name] = (fn, inputs, tolerance)


# -- arithmetic --------------------------------------------------------------------------
case("div_int_true", lambda a, b: a / b, SIGNED.long(), DIVISORS.long())
case("div_int_by_zero_true", lambda a, b: torch.div(a, b), T([1, -1, 0]).long(), T([0, 0, 0]).long())
for _dtype in (*INT_DTYPES, torch.float32, torch.float64):
    for _mode in ("trunc", "floor"):
        case(f"div_{_mode}_{_dtype}", lambda a, b, m=_mode: torch.div(a, b, rounding_mode=m),
             SIGNED.to(_dtype), DIVISORS.to(_dtype))
    case(f"remainder_{_dtype}", torch.remainder, SIGNED.to(_dtype), DIVISORS.to(_dtype))
    case(f"fmod_{_dtype}", torch.fmod, SIGNED.to(_dtype), DIVISORS.to(_dtype))
    case(f"floor_divide_{_dtype}", torch.floor_divide, SIGNED.to(_dtype), DIVISORS.to(_dtype))
case("int_binary_broadcast", lambda a, b: (torch.div(a, b, rounding_mode="trunc"), torch.div(a, b, rounding_mode="floor"),
                                           a // b, a % b, torch.fmod(a, b), a << b.abs(), a >> b.abs(), a ** b.abs()),
     SIGNED.long()[None], T([[2], [-3]], torch.int64))
case("div_float_modes_by_zero", lambda a, b: (torch.div(a, b, rounding_mode="floor"),
                                              torch.div(a, b, rounding_mode="trunc"), a // b),
     T([1.0, -1.0, 0.0, -0.0, 1.0]), T([0.0, 0.0, 0.0, 0.0, -0.0]))
case("div_floor_float_fractions", lambda a, b: torch.div(a, b, rounding_mode="floor"),
     T([0.3, -0.3, 5.0, -5.0, 1e-30, -1e-30, 7.0, -0.0]), T([0.1, 0.1, 0.5, 0.5, 3.0, 3.0, -inf, 2.0]))
case("div_scalar_modes", lambda a: (a / 3, torch.div(a, -3, rounding_mode="floor"),
                                    torch.div(a, 2.5, rounding_mode="trunc")), SIGNED.long())
case("remainder_float_specials", torch.remainder, T([-1.0, 1.0, 5.0, inf, -0.0, 3.0]),
     T([inf, -inf, 0.0, 2.0, 2.0, nan]))
case("fmod_float_specials", torch.fmod, T([-1.0, 1.0, 5.0, inf, -0.0, -3.0]), T([inf, -inf, 0.0, 2.0, 2.0, 3.0]))
case("remainder_scalars", lambda a: (a % 3, a % -2.5, torch.remainder(a, -4)), SIGNED.long())
case("remainder_scalar_tensor", lambda b: torch.remainder(5, b), DIVISORS.long())
case("rmod_float", lambda b: 5.5 % b, DIVISORS.float())

case("pow_int_tensor_negative_exponents", torch.pow, T([2, -3, 0, 1, -1, -1, 3, -2, 0], torch.int64),
     T([-1, -1, -2, -5, -3, -4, 0, 63, 0], torch.int64))
case("pow_int8_wraps", torch.pow, T([3, -2, 2], torch.int8), T([5, 7, 8], torch.int8))
case("pow_float_specials", torch.pow, T([0.0, 0.0, nan, 1.0, 1.0, -8.0, -0.0, -2.0, 2.0]),
     T([0.0, -1.0, 0.0, nan, inf, 1 / 3, -1.0, 3.0, -inf]))
for _exponent in (0, 1, 2, 3, -1, -2, 0.5, -0.5, 2.5, 7, -3):
    case(f"pow_float_scalar_{_exponent}", lambda a, e=_exponent: a ** e, T([0.0, -0.0, 1.5, -2.0, 4.0, nan, inf]))
for _exponent in (0, 1, 2, 3, 5):
    case(f"pow_int_scalar_{_exponent}", lambda a, e=_exponent: a ** e, T([0, 3, -2, 7, -1], torch.int64))
case("pow_int_tensor_float_exponent", lambda a: a ** 0.5, T([0, 4, 9, 2], torch.int64))
case("pow_scalar_base_int", lambda e: 2 ** e, T([-2, -1, 0, 1, 10, 62], torch.int64))
case("pow_scalar_base_int_of_one", lambda e: torch.pow(1, e), T([-2, 5], torch.int64))
case("pow_scalar_base_float", lambda e: 2.5 ** e, T([-2, -1, 0, 1, 10], torch.int64))
case("pow_scalar_base_float_tensor", lambda e: torch.pow(-8.0, e), T([0.0, 1 / 3, 2.0, -1.0, nan]))
case("float_power", lambda a, b: (torch.float_power(a, b), torch.float_power(a, 2)),
     T([2, -3, 4], torch.int64), T([0.5, 2.0, -1.0]))

case("add_alpha_int", lambda a, b: (torch.add(a, b, alpha=3), torch.sub(a, b, alpha=-2), torch.rsub(a, b, alpha=2)),
     SIGNED.long(), DIVISORS.long())
case("add_alpha_float", lambda a, b: (torch.add(a, b, alpha=0.5), torch.sub(a, b, alpha=2.5),
                                      torch.rsub(a, b, alpha=1.5), torch.rsub(a, 2.0)), GRID, GRID.flip(0))
case("add_int8_scalar_wraps", lambda a: (a + 300, a - 200, a * 3), T([50, -100, 127], torch.int8))
case("add_int8_0d_tensor_wraps", lambda a, b: a + b, T([50, -100, 127], torch.int8), torch.tensor(300))
case("int_tensor_float_scalar", lambda a: (a + 2.5, a * 0.1, a - 1.5, 7.5 - a), SIGNED.long())
case("int_tensor_0d_float_tensor", lambda a, b: (a * b, a + b), SIGNED.int(), torch.tensor(0.5, dtype=torch.float64))
case("bool_arithmetic", lambda a, b: (a + b, a * b, a + True, a * 2, a + 1.5, a / b, a & b),
     T([True, False, True, False], torch.bool), T([True, True, False, False], torch.bool))
case("mixed_dtypes", lambda a, b: (a + b, a * b, a / b, a - b), T([1.5, -2.0], torch.float32), T([3, -4], torch.int32))
case("float16_with_float32_0d", lambda a, b: a * b, T([1.5, -2.0, 0.1], torch.float16), torch.tensor(1.1))
case("neg_abs_int8", lambda a: (-a, a.abs(), a.neg().abs()), T([-128, -1, 0, 127], torch.int8))
case("neg_abs_float", lambda a: (-a, a.abs()), FLOATS)
case("sign_sgn_signbit_float", lambda a: (a.sign(), a.sgn(), a.signbit()), FLOATS)
case("sign_signbit_negative_nan", lambda a: (a.sign(), a.signbit()), -T([nan, 0.0]))
case("sign_int_bool", lambda a, b: (a.sign(), a.sgn(), a.signbit(), b.sign(), b.signbit()),
     SIGNED.long(), T([True, False], torch.bool))
case("reciprocal_int", torch.reciprocal, T([2, -4, 0, 1], torch.int64))
case("reciprocal_float", torch.reciprocal, FLOATS)
case("unary_int_to_float", lambda a: (a.sqrt(), a.exp(), a.log(), a.sin(), a.rsqrt(), a.sigmoid(), a.erf(),
                                      a.exp2(), a.log2(), a.tanh()), T([0, 1, 4, -1], torch.int64))
case("unary_float", lambda a: (a.sqrt(), a.rsqrt(), a.exp(), a.exp2(), a.expm1(), a.log(), a.log2(), a.log10(),
                               a.log1p(), a.sin(), a.cos(), a.tan(), a.asin(), a.acos(), a.atan(), a.sinh(),
                               a.cosh(), a.tanh(), a.asinh(), a.acosh(), a.atanh(), a.deg2rad(), a.rad2deg(),
                               a.sinc(), a.square()), EDGES)
case("unary_float64", lambda a: (a.sqrt(), a.exp(), a.log1p(), a.atan(), a.tanh(), a.sinc()),
     EDGES.double(), rtol=1e-12, atol=1e-12)

# -- rounding ------------------------------------------------------------------------------
case("round_half_even", torch.round, HALVES)
case("round_float64", torch.round, HALVES.double())
for _decimals in (0, 2, 3, -1, -2):
    case(f"round_decimals_{_decimals}", lambda a, d=_decimals: torch.round(a, decimals=d), HALVES)
case("floor_ceil_trunc_frac", lambda a: (a.floor(), a.ceil(), a.trunc(), a.frac()), FLOATS)
case("rounding_int", lambda a: (a.floor(), a.ceil(), a.trunc(), a.round()), SIGNED.long())

# -- clamping, maxima ----------------------------------------------------------------------
case("clamp_scalars", lambda a: (a.clamp(-1, 2), a.clamp(min=0.5), a.clamp(max=-0.5), a.clamp(3, 2)), FLOATS)
case("clamp_min_gt_max", lambda a: a.clamp(2.0, -2.0), GRID)
case("clamp_tensor_bounds", lambda a, lo, hi: (a.clamp(lo, hi), torch.clamp_min(a, lo), torch.clamp_max(a, hi)),
     T([1.0, 5.0, nan, -3.0, 0.0]), T([0.0, nan, 0.0, 1.0, 2.0]), T([2.0, 2.0, 2.0, nan, -1.0]))
case("clamp_int", lambda a: (a.clamp(-3, 5), a.clamp(min=2), a.clamp(-1.5, 2.5)), SIGNED.long())
case("clamp_int8_0d_bounds", lambda a, lo: a.clamp(min=lo), T([-100, 5, 100], torch.int8), torch.tensor(10))
# eager: a NaN scalar bound alone is ignored, one of two makes all NaN; clamp_min(x, nan) is all NaN
case("clamp_nan_scalar_bound", lambda a: (a.clamp(min=nan), a.clamp(max=nan), a.clamp(nan, 1.0), a.clamp(-1.0, nan),
                                          torch.clamp_min(a, nan), torch.clamp_max(a, nan)), T([1.0, -1.0, 2.0, nan]))
case("maximum_minimum_nan", lambda a, b: (torch.maximum(a, b), torch.minimum(a, b), torch.max(a, b),
                                          torch.min(a, b)), T([1.0, nan, nan, -0.5, 3.0]), T([nan, 2.0, nan, 0.0, 1.0]))
# (maximum(-0.0, 0.0) is not compared: eager's vectorized and scalar loops disagree)
case("fmax_fmin_nan", lambda a, b: (torch.fmax(a, b), torch.fmin(a, b)),
     T([1.0, nan, nan, 4.0]), T([nan, 2.0, nan, 1.0]))
case("maximum_int_bool", lambda a, b, c, d: (torch.maximum(a, b), torch.minimum(c, d)),
     SIGNED.long(), DIVISORS.long(), T([True, False], torch.bool), T([True, True], torch.bool))
case("lerp_scalar", lambda a, b: (torch.lerp(a, b, 0.25), torch.lerp(a, b, 0.75), torch.lerp(a, b, -1.5)),
     GRID, GRID.flip(0) * 3)
case("lerp_tensor", torch.lerp, GRID, GRID.flip(0) * 3, torch.linspace(-1, 2, 19))

# -- selection and filling -------------------------------------------------------------------
_MASK = T([True, False, True, False, False, True, False, True], torch.bool)
case("where_self", torch.where, _MASK, SIGNED.float(), DIVISORS.float())
case("where_mixed_dtypes", torch.where, _MASK, SIGNED.int(), DIVISORS.double())
case("where_0d_other", torch.where, _MASK, SIGNED.float(), torch.tensor(2.5, dtype=torch.float64))
case("where_scalars", lambda c, x: (torch.where(c, x, 2.5), torch.where(c, 3, x), torch.where(c, x, 7),
                                    torch.where(c, 1.0, 0.0), torch.where(c, 1, 0)), _MASK, SIGNED.long())
case("masked_fill", lambda x, m, v: (x.masked_fill(m, 2.5), x.masked_fill(m, -1), x.long().masked_fill(m, 2.7),
                                     x.masked_fill(m, v), x.half().masked_fill(m, 1e-3), x.masked_fill(m, nan)),
     SIGNED.float(), _MASK, torch.tensor(-4.0, dtype=torch.float64))
case("masked_fill_bool", lambda x, m: x.masked_fill(m, True), _MASK.flip(0), _MASK)
case("fill", lambda x: (x.clone().fill_(2.5), x.long().fill_(3.9), x.clone().fill_(torch.tensor(-1))), SIGNED.float())
case("heaviside", torch.heaviside, T([-1.0, 0.0, -0.0, 2.0, nan, inf]), T([5.0]))
case("nan_to_num", lambda a: (a.nan_to_num(), a.nan_to_num(1.0, 2.0, -3.0), a.half().nan_to_num(),
                              a.double().nan_to_num(posinf=1e300)), FLOATS)
case("nan_to_num_int", torch.nan_to_num, SIGNED.long())

# -- comparisons and logic ---------------------------------------------------------------------
for _name, _op in {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
                   "gt": torch.gt, "ge": torch.ge}.items():
    # 0.1 is float32(0.1) in the tensor: eager compares in the tensor's dtype
    case(f"{_name}_float_scalar", lambda a, o=_op: (o(a, 0.1), o(a, 0.5), o(a, nan)), T([0.1, 0.2, 0.0, nan, 0.5]))
    case(f"{_name}_int_float_scalar", lambda a, o=_op: (o(a, 2.5), o(a, 3)), SIGNED.long())
    case(f"{_name}_int8_wrapping_scalar", lambda a, o=_op: o(a, 300), T([50, 44, -100], torch.int8))
    case(f"{_name}_tensor_broadcast", _op, T([[1.0, nan, 3.0]]), T([[1.0], [nan], [2.0]]))
    case(f"{_name}_0d_float64", _op, T([0.1, 0.2, 0.3]), torch.tensor(0.1, dtype=torch.float64))
    case(f"{_name}_float16_scalar", lambda a, o=_op: o(a, 0.1), T([0.1, 0.0999, 0.1001], torch.float16))
case("logical", lambda a, b: (torch.logical_and(a, b), torch.logical_or(a, b), torch.logical_xor(a, b),
                              torch.logical_not(a), torch.logical_not(b)),
     T([0.0, nan, -0.0, 2.0, 0.0]), T([3, 0, 1, 0, -1], torch.int64))
case("bitwise", lambda a, b: (a & b, a | b, a ^ b, ~a, a & 6, a | -8, a ^ 5, torch.bitwise_and(12, b)),
     SIGNED.long(), DIVISORS.long())
case("bitwise_bool", lambda a, b: (a & b, a | b, a ^ b, ~a), _MASK, _MASK.flip(0))
for _dtype in (torch.int64, torch.int32, torch.int8, torch.uint8):
    _max = 250 if _dtype == torch.uint8 else 7
    case(f"shifts_{_dtype}", lambda a, s: (a << s, a >> s), T([-7, 7, -7, 7, -7, 1, -128, 5], torch.int64).to(_dtype),
         T([1, 70, 70, 0, 63, _max, 7, 3], torch.int64).to(_dtype))
case("shifts_negative_amount", lambda a, s: (a << s, a >> s), T([-7, 7], torch.int8), T([-1, -1], torch.int8))
case("shifts_scalar", lambda a: (a << 2, a >> 1, a >> 64, 3 << a.abs().clamp(max=60)), SIGNED.long())
case("classify_float", lambda a: (a.isnan(), a.isinf(), a.isfinite(), a.isposinf(), a.isneginf()), FLOATS)
case("classify_int", lambda a: (a.isnan(), a.isinf(), a.isfinite(), a.isposinf(), a.isneginf()), SIGNED.long())
case("isclose", lambda a, b: (torch.isclose(a, b), torch.isclose(a, b, equal_nan=True)),
     T([1.0, nan, inf, 1e-9, 2.0]), T([1.0 + 1e-6, nan, inf, 0.0, 2.1]))

# -- special functions -----------------------------------------------------------------------
_SPECIAL_TOL = dict(rtol=1e-4, atol=1e-5)
case("erf_family", lambda a: (a.erf(), a.erfc(), torch.special.ndtr(a), torch.special.log_ndtr(a)),
     GRID, **_SPECIAL_TOL)
if hasattr(jax.scipy.special, "erfcx"):  # jax before 0.8 (Colab TPU's 0.7.2) has none: eager computes it
    case("erfcx", lambda a: (torch.special.erfcx(a),), GRID, **_SPECIAL_TOL)
case("erfinv_ndtri", lambda a: (a.erfinv(), torch.special.ndtri((a + 1) / 2)),
     T([-1.0, -0.999, -0.5, 0.0, 0.3, 0.99, 1.0, 1.5, nan]), **_SPECIAL_TOL)
case("lgamma_digamma", lambda a: (a.lgamma(), a.digamma()),
     T([0.0, -0.0, -1.0, -2.0, -2.5, 0.5, 1.0, 3.7, 30.0, inf]), **_SPECIAL_TOL)
for _n in (1, 2, 3):
    case(f"polygamma_{_n}", lambda a, n=_n: torch.polygamma(n, a), T([0.5, 1.0, 3.7, 10.0, -1.5]), **_SPECIAL_TOL)
case("bessel_i", lambda a: (a.i0(), torch.special.i0e(a), torch.special.i1(a), torch.special.i1e(a),
                            torch.special.modified_bessel_i0(a), torch.special.modified_bessel_i1(a)),
     GRID, **_SPECIAL_TOL)
_BESSEL_X = T([0.0, -0.0, 1e-6, 0.5, 1.9, 2.0, 2.5, 4.9, 5.0, 5.1, 8.0, 30.0, -3.0, -7.5, inf, nan])
case("bessel_jy", lambda a: (torch.special.bessel_j0(a), torch.special.bessel_j1(a), torch.special.bessel_y0(a),
                             torch.special.bessel_y1(a)), _BESSEL_X, **_SPECIAL_TOL)
case("bessel_k", lambda a: (torch.special.modified_bessel_k0(a), torch.special.modified_bessel_k1(a),
                            torch.special.scaled_modified_bessel_k0(a), torch.special.scaled_modified_bessel_k1(a)),
     _BESSEL_X, **_SPECIAL_TOL)
case("bessel_float64", lambda a: (torch.special.bessel_j0(a), torch.special.bessel_y1(a),
                                  torch.special.modified_bessel_k1(a)), _BESSEL_X.double(), rtol=1e-12, atol=1e-14)
# Airy Ai: asymptotic forms beyond +-2.09, a power series summed to convergence between
case("airy_ai", torch.special.airy_ai, T([-10.0, -2.1, -2.09, -1.0, 0.0, 0.5, 2.08, 2.09, 5.0, 8.4, 50.0, 104.0, inf,
                                         -inf, nan]), **_SPECIAL_TOL)
_DEGREES = T([-1.0, 0.0, 1.0, 2.0, 3.0, 6.0, 7.0, 9.0, 12.0, 2.7, inf])
_POLY_X = T([-1.0, -0.6, -0.1, 0.0, 0.3, 0.5, 1.0, 1.7, -2.5])[:, None]
for _poly in ("chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
              "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
              "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
              "laguerre_polynomial_l", "legendre_polynomial_p"):
    # degree n per element (a float, truncated; inf counts as negative, as on x86), the ends of
    # the interval, the closed form for high degrees inside it
    case(_poly, lambda x, n, f=getattr(torch.special, _poly): (f(x, n), f(x, 3), f(0.25, n)), _POLY_X, _DEGREES,
         rtol=1e-4, atol=1e-4)
case("spherical_bessel_j0", torch.special.spherical_bessel_j0, T([0.0, 1e-5, 0.3, -0.49, 0.7, 5.0, 100.0, inf]),
     **_SPECIAL_TOL)
# a negative q: Cephes sums the terms up to q > 0 one by one (jss.zeta alone is far off)
case("zeta", torch.special.zeta, T([2.0, 3.0, 1.0, 0.5, 4.5, 3.0, 3.0, 2.5, 5.0, 2.0]),
     T([1.0, 2.5, 1.0, 1.0, 0.5, -8.3157, -2.0, -1.5, -100.5, 0.0]), **_SPECIAL_TOL)
case("polygamma_negative", lambda a: (torch.polygamma(1, a), torch.polygamma(2, a), torch.polygamma(3, a)),
     T([-8.3157, -1.5, -0.3, -1.0, 0.0, -1e-7]).double(), rtol=1e-9, atol=1e-9)
case("igamma", lambda a, x: (torch.igamma(a, x), torch.igammac(a, x)), T([0.5, 1.0, 2.0, 5.0, 3.0]),
     T([0.0, 1.0, 0.5, 7.0, inf]), **_SPECIAL_TOL)
case("xlogy", lambda x, y: (torch.xlogy(x, y), torch.special.xlog1py(x, y), torch.xlogy(x, 2.0),
                            torch.xlogy(2, y)), T([0.0, 0.0, 1.0, nan, 2.0, 0.0]), T([0.0, nan, 0.0, 0.0, 3.0, -1.0]))
case("entr", torch.special.entr, T([0.0, 0.5, 1.0, -1.0, nan, inf]))
case("logit", lambda a: (torch.logit(a), torch.logit(a, eps=0.1), torch.logit(a, eps=-1.0)), UNIT)
case("logit_backward", lambda g, a: (aten.logit_backward(g, a), aten.logit_backward(g, a, 0.1)), UNIT * 0 + 1.5,
     UNIT)
case("mvlgamma", lambda a: (torch.mvlgamma(a, 1), torch.mvlgamma(a, 3)), POS + 1.0, **_SPECIAL_TOL)
case("logaddexp", lambda a, b: (torch.logaddexp(a, b), torch.logaddexp2(a, b)),
     T([0.0, inf, -inf, inf, 1.0, nan, -100.0]), T([0.0, inf, -inf, -inf, 30.0, 1.0, -100.5]))

# -- other binary math -------------------------------------------------------------------------
case("atan2_hypot", lambda a, b: (torch.atan2(a, b), torch.hypot(a, b)), EDGES, EDGES.flip(0))
case("copysign", lambda a, b: (torch.copysign(a, b), torch.copysign(a, -0.0), torch.copysign(a.long(), b)),
     T([1.0, 2.0, -3.0, 0.0, nan]), T([-0.0, 1.0, -1.0, -2.0, -1.0]))
case("nextafter", torch.nextafter, T([0.0, 1.0, 1.0, -0.0, nan]), T([1.0, 0.0, 2.0, -1.0, 1.0]))
case("ldexp", torch.ldexp, T([1.0, -1.5, 0.75]), T([3, -2, 10], torch.int64))
case("frexp", torch.frexp, T([8.0, -0.3, 0.0, -0.0, 1e-40, inf, nan, 6e-8]))
case("gcd_lcm", lambda a, b: (torch.gcd(a, b), torch.lcm(a, b)), T([12, -18, 0, 7, 0], torch.int64),
     T([8, 12, 5, 0, 0], torch.int64))

# -- activations -------------------------------------------------------------------------------
_ACT = torch.cat([GRID, T([nan, 25.0, -25.0])])
_GRAD = torch.linspace(0.5, 2.0, _ACT.numel())
case("relu_family", lambda a: (torch.relu(a), torch.nn.functional.relu6(a), torch.nn.functional.hardtanh(a),
                               torch.nn.functional.hardtanh(a, -2.0, 0.5)), _ACT)
case("relu_int", torch.relu, SIGNED.long())
# gelu's zeros unsigned: eager's own sign of gelu(-25) is its kernel path's, -0.0 from its scalar loop and 0.0
# from its AVX2 one (a tensor of 64: measured on torch 2.9), and XLA's is its erf's (exactly -1 on some CPUs)
case("gelu", lambda a: (torch.nn.functional.gelu(a), torch.nn.functional.gelu(a, approximate="tanh")), _ACT,
     signed_zeros=False)
case("gelu_backward", lambda g, a: (aten.gelu_backward(g, a), aten.gelu_backward(g, a, approximate="tanh")),
     _GRAD, _ACT)
case("silu_sigmoid_tanh", lambda a: (torch.nn.functional.silu(a), torch.sigmoid(a), torch.tanh(a),
                                     torch.nn.functional.mish(a)), _ACT)
case("activation_backward", lambda g, a: (aten.silu_backward(g, a), aten.sigmoid_backward(g, torch.sigmoid(a)),
                                          aten.tanh_backward(g, torch.tanh(a)), aten.mish_backward(g, a)), _GRAD, _ACT)
case("threshold", lambda g, a: (torch.nn.functional.threshold(a, 0.5, -2.0), aten.threshold_backward(g, a, 0.5)),
     _GRAD, _ACT)
case("elu", lambda a: (torch.nn.functional.elu(a), torch.nn.functional.elu(a, alpha=0.5), torch.nn.functional.celu(a, 2.0),
                       torch.nn.functional.selu(a), aten.elu(a, 1.5, 2.0, 0.5)), _ACT)
case("elu_backward", lambda g, a: (aten.elu_backward(g, 1.5, 2.0, 0.5, False, a),
                                   aten.elu_backward(g, 1.5, 2.0, 0.5, True, aten.elu(a, 1.5, 2.0, 0.5))), _GRAD, _ACT)
case("leaky_relu", lambda g, a: (torch.nn.functional.leaky_relu(a), torch.nn.functional.leaky_relu(a, 0.2),
                                 aten.leaky_relu_backward(g, a, 0.2, False)), _GRAD, _ACT)
case("hardtanh_backward", lambda g, a: aten.hardtanh_backward(g, a, -1.0, 2.0), _GRAD, _ACT)
case("hard_sigmoid_swish", lambda g, a: (torch.nn.functional.hardsigmoid(a), torch.nn.functional.hardswish(a),
                                         aten.hardsigmoid_backward(g, a), aten.hardswish_backward(g, a)), _GRAD, _ACT)
case("shrink", lambda g, a: (torch.nn.functional.hardshrink(a), torch.nn.functional.softshrink(a, 1.0),
                             aten.hardshrink_backward(g, a, 0.5), aten.softshrink_backward(g, a, 1.0)), _GRAD, _ACT)
case("softplus", lambda g, a: (torch.nn.functional.softplus(a), torch.nn.functional.softplus(a, 2.0, 3.0),
                               aten.softplus_backward(g, a, 2.0, 3.0)), _GRAD, _ACT)
case("log_sigmoid", lambda g, a: (torch.nn.functional.logsigmoid(a), *aten.log_sigmoid_forward(a),
                                  aten.log_sigmoid_backward(g, a, aten.log_sigmoid_forward(a)[1])), _GRAD, _ACT)
# (glu, prelu and dropout's backward are nn.py's, tested with it)

# -- complex -------------------------------------------------------------------------------------
_Z = torch.complex(T([1.0, -2.0, 0.0, -0.0, 3.0]), T([0.5, 0.0, 0.0, -1.0, -4.0]))
case("angle", lambda a, z, i: (a.angle(), z.angle(), i.angle()), FLOATS, _Z, SIGNED.long())
case("complex_ops", lambda z: (z.abs(), z.sgn(), torch.conj_physical(z), z * z, z + 1, z.exp()), _Z)
case("polar_complex", lambda a, b: (torch.polar(a, b), torch.complex(a, b)), T([1.0, 2.0, 0.5]), T([[0.5], [-3.0]]))

# -- half precision: eager computes multi-step formulas in float32 -----------------------------------
case("half_formulas", lambda a: (torch.nn.functional.gelu(a), a.sigmoid(), torch.nn.functional.silu(a),
                                 torch.lerp(a, a * 2, 0.3), torch.nn.functional.softplus(a), a * 2.5 + 1),
     GRID.half())
case("bfloat16_formulas", lambda a: (torch.nn.functional.gelu(a), torch.nn.functional.hardswish(a), a.exp()),
     GRID.bfloat16())


# -- the test ------------------------------------------------------------------------------------
def _leaves(value):
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _assert_same(got, want, name, index, tolerance):
    where = f"{name} output {index}"
    assert got.dtype == want.dtype, f"{where}: dtype {got.dtype}, eager {want.dtype}"
    assert got.shape == want.shape, f"{where}: shape {tuple(got.shape)}, eager {tuple(want.shape)}"
    if want.dtype.is_floating_point or want.dtype.is_complex:
        default = {torch.float16: 1e-3, torch.bfloat16: 8e-3}.get(want.dtype, 1.3e-6)
        torch.testing.assert_close(got, want, equal_nan=True, rtol=tolerance.get("rtol", default),
                                   atol=tolerance.get("atol", 1e-5), msg=lambda m: f"{where}: {m}")
        if want.dtype.is_floating_point and tolerance.get("signed_zeros", True):  # -0.0 is not 0.0
            zeros = (want == 0) & (got == 0)
            assert torch.equal(got[zeros].signbit(), want[zeros].signbit()), \
                f"{where}: signs of zeros {got[zeros].tolist()}, eager {want[zeros].tolist()}"
    else:
        assert torch.equal(got, want), f"{where}: {got.tolist()}, eager {want.tolist()}"


_ELEMENTWISE_PRIMS = {name for name in dir(torch.ops.prims) if not name.startswith("_")} - {
    "broadcast_in_dim", "split_dim", "squeeze", "collapse_view", "collapse", "view_of", "reshape", "transpose",
    "slice", "slice_in_dim", "expand_dims", "rev", "cat", "convert_element_type", "device_put", "sum", "amax",
    "amin", "prod", "var", "xor_sum", "as_strided", "as_strided_scatter", "clone", "copy_to", "copy_strided",
    "empty_strided", "empty_permuted", "full", "full_like", "iota", "scalar_tensor", "resize", "view_element_type"}


@pytest.fixture
def ran_eagerly(monkeypatch):
    """The ops that ran on CPU (no lowering, or a lowering that failed)."""
    ops = []
    run, run_node = eager.run, eager.run_node
    monkeypatch.setattr(eager, "run", lambda op, *a, **k: ops.append(op) or run(op, *a, **k))
    monkeypatch.setattr(eager, "run_node", lambda node, *a, **k: ops.append(node.op) or run_node(node, *a, **k))
    return ops


def _elementwise(op) -> bool:
    """An op this family must lower: in pointwise.py's table, or tagged pointwise
    by torch, or a prim (what an unlowered aten op's decomposition leaves)."""
    found = lowerings.find(op)
    return (found is not None and found.fn.__module__.endswith("pointwise")) or torch.Tag.pointwise in op.tags \
        or op.namespace == "prims" and op._schema.name.split("::")[-1] in _ELEMENTWISE_PRIMS


@pytest.mark.parametrize("name", list(CASES))
def test_elementwise_op_matches_eager(dev, ran_eagerly, name):
    fn, inputs, tolerance = CASES[name]
    want = _leaves(fn(*inputs))
    got = _leaves(fn(*(t.to(dev) for t in inputs)))
    xlakit.sync(got)
    got = [g.cpu() for g in got]
    # other families' ops (casts, views) may still run eagerly; this one's may not
    assert not [op for op in ran_eagerly if _elementwise(op)], f"{name}: ran on CPU: {ran_eagerly}"
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want)):
        _assert_same(g, w, name, index, tolerance)


def test_an_unlowered_dtype_falls_back_for_that_call_only(dev, ran_eagerly):
    """Complex logaddexp has no lowering: that call runs on CPU (eager's value),
    and a float logaddexp after it still lowers."""
    z = torch.complex(T([1.0, -2.0]), T([0.5, 3.0]))
    got = torch.logaddexp(z.to(dev), z.to(dev)).cpu()
    torch.testing.assert_close(got, torch.logaddexp(z, z))
    assert any(op._schema.name == "aten::logaddexp" for op in ran_eagerly)
    ran_eagerly.clear()
    a = T([0.0, 1.0, -3.0])
    torch.testing.assert_close(torch.logaddexp(a.to(dev), a.to(dev) * 2).cpu(), torch.logaddexp(a, a * 2))
    assert not [op for op in ran_eagerly if _elementwise(op)]
