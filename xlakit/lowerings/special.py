"""Special functions: error and gamma functions and their kin, Bessel functions,
zeta, xlogy (part of the pointwise family; pointwise.py imports this module).
jax.scipy.special where it agrees with eager CPU (ATen's Cephes ports), ATen's
own formulas where it does not: edge cases (poles, negative arguments) and the
double precision ATen sums float32 in."""
from __future__ import annotations

import math

import jax.numpy as jnp
import jax.scipy.special as jss
from jax import lax

from .pointwise import as_dtype, common, opmath, register_unary
from .registry import lowers
from .verdicts import NeedsEager


def _erfcx(x):
    if not hasattr(jss, "erfcx"):  # jax before 0.8 (Colab TPU's 0.7.2) has none: eager computes it
        raise NeedsEager("this jax has no erfcx")
    return jss.erfcx(x)


register_unary({
    "aten::erf": lax.erf, "aten::erfc": lax.erfc, "aten::erfinv": lax.erf_inv, "aten::lgamma": lax.lgamma,
    "aten::special_ndtr": jss.ndtr, "aten::special_ndtri": jss.ndtri, "aten::special_log_ndtr": jss.log_ndtr,
    "aten::special_erfcx": _erfcx, "aten::i0": jss.i0, "aten::special_i0e": jss.i0e,
    "aten::special_i1": jss.i1, "aten::special_i1e": jss.i1e, "aten::special_modified_bessel_i0": jss.i0,
    "aten::special_modified_bessel_i1": jss.i1,
})


@lowers("aten::digamma", "aten::special_digamma", promote=True)
def digamma(self):
    """ATen: digamma(+-0) is -+inf, digamma of a negative integer is NaN."""
    x = opmath(self)
    out = jss.digamma(x)
    out = jnp.where((x < 0) & (x == jnp.floor(x)), jnp.full_like(x, jnp.nan), out)
    return jnp.where(x == 0, jnp.copysign(jnp.full_like(x, jnp.inf), -x), out)


def _trigamma(x):
    """ATen's calc_trigamma: reflection below 0.5, six recurrence steps, then the
    asymptotic series (finite, not inf, next to the poles, as eager)."""
    reflect = x < 0.5
    sin_pi_x = jnp.sin(as_dtype(math.pi, x.dtype) * x)
    result = jnp.where(reflect, -(math.pi * math.pi) / (sin_pi_x * sin_pi_x), jnp.zeros_like(x))
    x = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / x
    return jnp.where(reflect, -result, result)


def _zeta(x, q):
    """Hurwitz zeta with Cephes' (ATen's) edge cases, in its order: x == 1 gives
    inf, x < 1 NaN, q a non-positive integer inf, else q < 0 with x not an
    integer NaN; x = inf ends its sum at 1 for q == 1, inf for q < 1, NaN for
    q > 1. A negative q starts with the terms up to q + ceil(-q) summed one by
    one, as Cephes does: jss.zeta's fixed nine terms are too few there."""
    if x.dtype == jnp.float32:  # ATen sums in double on the CPU (acc_type)
        return _zeta(x.astype(jnp.float64), q.astype(jnp.float64)).astype(jnp.float32)
    integer_q = (q <= 0) & (q == jnp.floor(q))
    # only where Cephes sums: a huge or infinite negative q is an integer, and is not summed
    summed = (x > 1) & (q < 0) & ~integer_q & (x == jnp.floor(x))
    steps = jnp.where(summed, jnp.ceil(-q), jnp.zeros_like(q))

    def more(state):
        return jnp.any(state[0] < steps)

    def term(state):
        k, head = state
        return k + 1, head + jnp.where(k < steps, (q + k) ** -x, jnp.zeros_like(head))

    _, head = lax.while_loop(more, term, (jnp.zeros((), q.dtype), jnp.zeros_like(q * x)))
    out = head + jss.zeta(x, q + steps)
    full = lambda value: jnp.full_like(out, value)  # noqa: E731
    out = jnp.where(x == jnp.inf, jnp.where(q == 1, full(1), jnp.where(q < 1, full(jnp.inf), full(jnp.nan))), out)
    out = jnp.where((q < 0) & (x != jnp.floor(x)), full(jnp.nan), out)
    out = jnp.where(integer_q, full(jnp.inf), out)
    out = jnp.where(x < 1, full(jnp.nan), out)
    return jnp.where(x == 1, full(jnp.inf), out)


@lowers("aten::polygamma", promote=True)
def polygamma(n, self):
    """ATen: digamma, trigamma, then (-1)**(n+1) n! zeta(n + 1, x)."""
    if n == 0:
        return digamma(self)
    x = opmath(self)
    if n == 1:
        return _trigamma(x)
    factor = (1.0 if n % 2 else -1.0) * math.exp(math.lgamma(n + 1.0))
    return factor * _zeta(jnp.full_like(x, n + 1), x)


@lowers("aten::mvlgamma", promote=True)
def mvlgamma(self, p):
    x = opmath(self)
    offsets = jnp.arange(-p / 2 + 0.5, 0.5, 0.5, dtype=x.dtype)[:p]
    return jnp.sum(lax.lgamma(x[..., None] + offsets), axis=-1) + p * (p - 1) / 4 * math.log(math.pi)


def _binary_special(fn):
    def lowering(self, other):
        self, other = common(self, other)
        return fn(*opmath(self, other))
    return lowering


lowers("aten::igamma", "aten::special_gammainc", promote=True)(_binary_special(jss.gammainc))
lowers("aten::igammac", "aten::special_gammaincc", promote=True)(_binary_special(jss.gammaincc))
lowers("aten::special_zeta", promote=True)(_binary_special(_zeta))


def _xlog(log):
    def formula(x, y):
        out = jnp.where(x == 0, jnp.zeros_like(x), x * log(y))
        return jnp.where(jnp.isnan(y), jnp.full_like(y, jnp.nan), out)
    return formula


lowers("aten::xlogy", "aten::special_xlogy", promote=True)(_binary_special(_xlog(jnp.log)))
lowers("aten::special_xlog1py", promote=True)(_binary_special(_xlog(jnp.log1p)))


@lowers("aten::special_entr", promote=True)
def special_entr(self):
    x = opmath(self)
    out = jnp.where(x > 0, -x * jnp.log(x), jnp.where(x == 0, jnp.zeros_like(x), jnp.full_like(x, -jnp.inf)))
    return jnp.where(jnp.isnan(x), x, out)


@lowers("aten::logit", "aten::special_logit", promote=True)
def logit(self, eps=None):
    x = opmath(self)
    if eps is not None and eps >= 0:
        lo, hi = as_dtype(eps, x.dtype), as_dtype(1 - eps, x.dtype)
        x = jnp.where(x < lo, lo, jnp.where(x > hi, hi, x))
    return jnp.log(x / (1 - x))


@lowers("aten::logit_backward", promote=True)
def logit_backward(grad_output, self, eps=None):
    g, x = opmath(grad_output, self)
    grad = g / (x * (1 - x))
    if eps is None or eps < 0:
        return jnp.where((x >= 0) & (x <= 1), grad, jnp.full_like(x, jnp.nan))
    return jnp.where((x < eps) | (x > 1 - eps), jnp.zeros_like(x), grad)  # NaN stays NaN


@lowers("aten::special_spherical_bessel_j0", promote=True)
def special_spherical_bessel_j0(self):
    """ATen: a Taylor series below |x| 0.5, sin(x) / x above."""
    x = opmath(self)
    x2 = x * x
    series = 1 + x2 * (-1 / 6 + x2 * (1 / 120 + x2 * (-1 / 5040 + x2 * (1 / 362880 + x2 * (
        -1 / 39916800 + x2 * (1 / 6227020800))))))
    safe = jnp.where(jnp.abs(x) < 0.5, jnp.ones_like(x), x)
    out = jnp.where(jnp.abs(x) < 0.5, series, jnp.sin(safe) / safe)
    return jnp.where(jnp.isinf(x), jnp.zeros_like(x), out)


# -- orthogonal polynomials ---------------------------------------------------------------------
# ATen's (Math.h): the degree n is cast to int64; special values at the ends of
# the interval; a closed form inside it for high degrees; otherwise the
# three-term recurrence, run per element as many times as its own degree asks.
def _degree(n):
    """static_cast<int64_t>(n): x86 gives INT64_MIN (a negative degree, so 0)
    for NaN and infinities, where XLA's convert would saturate and loop forever."""
    if not jnp.issubdtype(n.dtype, jnp.floating):
        return n.astype(jnp.int64)
    return jnp.where(jnp.isfinite(n), n, -1).astype(jnp.int64)


def _recurrence(loops, p, q, step, k0, dk=1):
    """q after `loops` steps (per element) of r = step(k, p, q); p, q = q, r, k = k0, k0 + dk, ..."""
    total = jnp.max(loops, initial=0)

    def more(state):
        return state[0] < total

    def body(state):
        i, p, q = state
        active = i < loops
        r = step((k0 + dk * i).astype(q.dtype), p, q)
        return i + 1, jnp.where(active, q, p), jnp.where(active, r, q)

    return lax.while_loop(more, body, (jnp.zeros((), jnp.int64), p, q))[2]


def _polynomial(evaluate):
    def lowering(x, n):
        x, n = common(x, n)
        x, n = jnp.broadcast_arrays(*opmath(x, n))
        return evaluate(x, _degree(n))
    return lowering


def _chebyshev(kind, shifted):
    """T, U, V, W, and their shifted forms (of 2x - 1 on [0, 1])."""
    def evaluate(x, n):
        y = x + x - 1.0 if shifted else x
        nf = n.astype(x.dtype)
        even = n % 2 == 0
        one = jnp.ones_like(x)
        odd_sign = jnp.where(even, one, -one)
        theta = jnp.arccos(y)
        first = {"t": y, "u": y + y, "v": y + y - 1.0, "w": y + y + 1.0}[kind]
        if kind == "t":
            closed = jnp.cos(nf * theta)
        elif kind == "u":
            closed = jnp.where(jnp.sin(theta) != 0, jnp.sin((nf + 1) * theta) / jnp.sin(theta),
                               (nf + 1) * jnp.cos((nf + 1) * theta) / y)
        elif kind == "v":
            closed = jnp.where(jnp.sin(theta / 2.0) != 1, jnp.cos((nf + 0.5) * theta) / jnp.cos(theta / 2.0),
                               odd_sign * (nf + nf + 1))
        else:
            fallback = odd_sign if shifted else jnp.where(x > 0, nf + nf + 1, odd_sign)
            closed = jnp.where(jnp.cos(theta / 2.0) != 1, jnp.sin((nf + 0.5) * theta) / jnp.sin(theta / 2.0), fallback)
        # the ends: x = +-1 (x = 1 and 0 when shifted)
        top = {"t": one, "u": nf + 1, "v": one, "w": nf + nf + 1}[kind]
        bottom = {"t": odd_sign, "u": odd_sign * (nf + 1), "v": odd_sign * (nf + nf + 1), "w": odd_sign}[kind]
        if shifted:
            at_top, at_bottom = x == 1, x == 0
        else:
            at_top, at_bottom = (jnp.abs(x) == 1) & (x > 0), (jnp.abs(x) == 1) & (x < 0)
            if kind in ("t", "u"):  # (x > 0 || n even) picks the top value
                bottom = jnp.where(even, top, bottom)
        ends = at_top | at_bottom
        high = {"t": 6, "u": 8, "v": 8, "w": 8}[kind] if not shifted else (4 if kind == "w" else 6)
        use_closed = ~ends & (n > high) & (jnp.abs(y) < 1)
        loops = jnp.where(~ends & ~use_closed & (n >= 2), n - 1, 0)
        out = _recurrence(loops, one, first, lambda k, p, q: (y + y) * q - p, 2)
        out = jnp.where(n == 1, first, jnp.where(n == 0, one, out))
        out = jnp.where(use_closed, closed, out)
        out = jnp.where(at_bottom, bottom, jnp.where(at_top, top, out))
        return jnp.where(n < 0, jnp.zeros_like(x), out)
    return evaluate


def _hermite(physicists: bool):
    def evaluate(x, n):
        one = jnp.ones_like(x)
        first = x + x if physicists else x
        limit = {jnp.dtype(jnp.float32): 128, jnp.dtype(jnp.float64): 512}.get(x.dtype, 1024)
        loops = jnp.where((n >= 2) & (n <= limit), n - 1, 0)
        if physicists:
            out = _recurrence(loops, one, first, lambda k, p, q: (x + x) * q - k * p, 2, 2)
        else:
            out = _recurrence(loops, one, first, lambda k, p, q: x * q - k * p, 1)
        out = jnp.where(n > limit, jnp.full_like(x, jnp.nan), out)
        out = jnp.where(n == 1, first, jnp.where(n == 0, one, out))
        return jnp.where(n < 0, jnp.zeros_like(x), out)
    return evaluate


def _laguerre_l(x, n):
    one = jnp.ones_like(x)
    loops = jnp.where((x != 0) & (n >= 2), n - 1, 0)
    out = _recurrence(loops, one, 1.0 - x, lambda k, p, q: (((k + k) + (1.0 - x)) * q - k * p) / (k + 1), 1)
    out = jnp.where(n == 1, 1.0 - x, jnp.where(n == 0, one, out))
    out = jnp.where(x == 0, one, out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


def _legendre_p(x, n):
    one = jnp.ones_like(x)
    ends = jnp.abs(x) == 1
    loops = jnp.where(~ends & (n >= 2), n - 1, 0)
    out = _recurrence(loops, one, x, lambda k, p, q: ((k + k + 1) * x * q - k * p) / (k + 1), 1)
    out = jnp.where(n == 1, x, jnp.where(n == 0, one, out))
    out = jnp.where(ends, jnp.where((x > 0) | (n % 2 == 0), one, -one), out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


_POLYNOMIALS = {"hermite_polynomial_h": _hermite(True), "hermite_polynomial_he": _hermite(False),
                "laguerre_polynomial_l": _laguerre_l, "legendre_polynomial_p": _legendre_p}
for _kind in "tuvw":
    _POLYNOMIALS[f"chebyshev_polynomial_{_kind}"] = _chebyshev(_kind, shifted=False)
    _POLYNOMIALS[f"shifted_chebyshev_polynomial_{_kind}"] = _chebyshev(_kind, shifted=True)
for _name, _evaluate in _POLYNOMIALS.items():
    lowers(f"aten::special_{_name}", promote=True)(_polynomial(_evaluate))
del _kind, _name, _evaluate
