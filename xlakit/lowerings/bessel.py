"""Bessel and Airy functions eager CPU computes with ATen's Cephes ports
(aten/src/ATen/native/Math.h) and jax.scipy.special lacks: j0, j1, y0, y1,
k0, k1 (and their exp-scaled forms), Airy Ai. The same coefficients and
branches, in the input's dtype as ATen computes them (part of the pointwise
family; pointwise.py imports this module)."""
from __future__ import annotations

import math

import jax.numpy as jnp
import jax.scipy.special as jss
from jax import lax

from .pointwise import opmath
from .registry import lowers

# Cephes' coefficients, as Math.h lists them (y0 and y1 share j0's and j1's
# asymptotic ones; the scaled k0 and k1 share k0's and k1's).
_AIRY_AN = (0.346538101525629, 12.007595273964581, 76.27960536152345, 168.08922493463058, 159.75639135016442,
            70.53609068404442, 14.026469116338967, 1.0)
_AIRY_AD = (0.5675945326387702, 14.75625625848472, 84.51389701414746, 177.31808814540045, 164.2346928715297,
            71.47784008255756, 14.095913560783403, 1.0)
_AIRY_AFN = (-0.1316963234183318, -0.6264565444319123, -0.6931580360369335, -0.2797799815451191,
             -0.04919001326095003, -0.004062659235948854, -0.0001592764962392621, -2.776491081552329e-06,
             -1.6778769848911465e-08)
_AIRY_AFD = (13.356042070655324, 32.682503279522464, 26.736704094149957, 9.187074029072596, 1.4752914677166642,
             0.11568717379518804, 0.004402916416152112, 7.547203482874142e-05, 4.5185009297058035e-07)
_AIRY_AGN = (0.01973399320916857, 0.39110302961568827, 1.0657989759959559, 0.9391692298166502,
             0.35146565610554764, 0.06338889196289255, 0.005858041130483885, 0.000282851600836737,
             6.98793669997261e-06, 8.117892395543892e-08, 3.415517847659236e-10)
_AIRY_AGD = (9.30892908077442, 19.835292871831214, 15.564662893286462, 5.476860694229755, 0.9542936116189619,
             0.08645808263523921, 0.004126565238242226, 0.00010125908511650914, 1.1716673321441352e-06,
             4.9183457006293e-09)
_J0_PP = (0.0007969367292973471, 0.08283523921074408, 1.239533716464143, 5.447250030587687, 8.74716500199817,
          5.303240382353949, 1.0)
_J0_PQ = (0.0009244088105588637, 0.08562884743544745, 1.2535274390105895, 5.470977403304171, 8.761908832370695,
          5.306052882353947, 1.0)
_J0_QP = (-0.011366383889846916, -1.2825271867050931, -19.553954425773597, -93.20601521237683,
          -177.68116798048806, -147.07750515495118, -51.41053267665993, -6.050143506007285)
_J0_QQ = (64.3178256118178, 856.4300259769806, 3882.4018360540163, 7240.467741956525, 5930.727011873169,
          2062.0933166032783, 242.0057402402914)
_J0_RP = (-4794432209.782018, 1956174919465.5657, -249248344360967.72, 9708622510473064.0)
_J0_RQ = (499.563147152651, 173785.4016763747, 48440965.83399621, 11185553704.535683, 2112775201154.892,
          310518229857422.56, 3.1812195594320496e+16, 1.7108629408104315e+18)
_J1_PP = (0.0007621256162081731, 0.07313970569409176, 1.1271960812968493, 5.112079511468076, 8.424045901417724,
          5.214515986823615, 1.0)
_J1_PQ = (0.0005713231280725487, 0.06884559087544954, 1.105142326340617, 5.073863861286015, 8.399855543276042,
          5.209828486823619, 1.0)
_J1_QP = (0.05108625947501766, 4.982138729512334, 75.82382841325453, 366.7796093601508, 710.8563049989261,
          597.4896124006136, 211.68875710057213, 25.207020585802372)
_J1_QQ = (74.23732770356752, 1056.4488603826283, 4986.410583376536, 9562.318924047562, 7997.041604473507,
          2826.1927851763908, 336.0936078106983)
_J1_RP = (-899971225.7055594, 452228297998.19403, -72749424522181.83, 3682957328638529.0)
_J1_RQ = (620.8364781180543, 256987.25675774884, 83514679.14319493, 22151159547.97925, 4749141220799.914,
          784369607876235.9, 8.952223361846274e+16, 5.322786203326801e+18)
_Y0_YP = (15592.436785523574, -14663929.59039716, 5435264770.518765, -982136065717.9115, 87590639439536.7,
          -3466283033847297.0, 4.4273326857256984e+16, -1.8495080043698668e+16)
_Y0_YQ = (1041.2835366425984, 626107.330137135, 268919633.39381415, 86400248710.3935, 20297961275010.555,
          3171577528429750.5, 2.5059625617265306e+17)
_Y1_YP = (1263204747.9017804, -647355876379.1603, 114509511541823.73, -8127702555013251.0, 2.024394757135949e+17,
          -7.788771962659501e+17)
_Y1_YQ = (594.3015923461282, 235564.09294306856, 73481194.44597217, 18760131610.870617, 3882312774962.3857,
          620557727146953.8, 6.871410873553005e+16, 3.9727060811656064e+18)
_K0_A = (1.374465435613523e-16, 4.25981614279661e-14, 1.0349695257633842e-11, 1.904516377220209e-09,
         2.5347910790261494e-07, 2.286212103119452e-05, 0.001264615411446926, 0.0359799365153615,
         0.3442898999246285, -0.5353273932339028)
_K0_B = (5.300433772686263e-18, -1.6475804301524212e-17, 5.2103915050390274e-17, -1.678231096805412e-16,
         5.512055978524319e-16, -1.848593377343779e-15, 6.3400764774050706e-15, -2.2275133269916698e-14,
         8.032890775363575e-14, -2.9800969231727303e-13, 1.140340588208475e-12, -4.514597883373944e-12,
         1.8559491149547177e-11, -7.957489244477107e-11, 3.577397281400301e-10, -1.69753450938906e-09,
         8.574034017414225e-09, -4.660489897687948e-08, 2.766813639445015e-07, -1.8317555227191195e-06,
         1.39498137188765e-05, -0.00012849549581627802, 0.0015698838857300533, -0.0314481013119645,
         2.4403030820659555)
_K1_A = (-7.023863479386288e-18, -2.427449850519366e-15, -6.666901694199329e-13, -1.4114883926335278e-10,
         -2.213387630734726e-08, -2.4334061415659684e-06, -0.0001730288957513052, -0.006975723859639864,
         -0.12261118082265715, -0.3531559607765449, 1.5253002273389478)
_K1_B = (-5.756744483665017e-18, 1.7940508731475592e-17, -5.689462558442859e-17, 1.838093544366639e-16,
         -6.057047248373319e-16, 2.038703165624334e-15, -7.019837090418314e-15, 2.4771544244813043e-14,
         -8.976705182324994e-14, 3.3484196660784293e-13, -1.2891739609510289e-12, 5.13963967348173e-12,
         -2.1299678384275683e-11, 9.218315187605006e-11, -4.1903547593418965e-10, 2.015049755197033e-09,
         -1.0345762465678097e-08, 5.7410841254500495e-08, -3.5019606030878126e-07, 2.406484947837217e-06,
         -1.936197974166083e-05, 0.00019521551847135162, -0.002857816859622779, 0.10392373657681724,
         2.7206261904844427)

_SQRT_2_PI = 0.797884560802865355879892119868763737  # sqrt(2 / pi)
_2_PI = 0.636619772367581343075535053490057448  # 2 / pi
_PI_4, _3PI_4 = 0.785398163397448309615660845819875721, 2.356194490192344928846982537459627163


def _horner(coefficients, z):
    acc = jnp.zeros_like(z)
    for c in coefficients:
        acc = acc * z + c
    return acc


def _chbevl(coefficients, y):
    """Clenshaw's recurrence for a Chebyshev series (Cephes' chbevl)."""
    a, q, p = jnp.full_like(y, coefficients[0]), jnp.zeros_like(y), jnp.zeros_like(y)
    for c in coefficients[1:]:
        p, q = q, a
        a = y * q - p + c
    return 0.5 * (a - p)


def _asymptotic(x, w, pp, pq, qp, qq, phase, trig):
    """The large-argument form shared by j0, j1, y0, y1: P and Q rational in w."""
    p = _horner(pp, w) / _horner(pq, w)
    q = 5.0 / x * (_horner(qp, w) / _horner(qq, w))
    first, second = (jnp.cos, jnp.sin) if trig == "j" else (jnp.sin, jnp.cos)
    sign = -1 if trig == "j" else 1
    return (p * first(x - phase) + sign * q * second(x - phase)) * _SQRT_2_PI / jnp.sqrt(x)


def _j0(x):
    x = jnp.abs(x)
    z = x * x
    small = (z - 5.78318596294678452118) * (z - 30.4712623436620863991) * _horner(_J0_RP, z) / _horner(_J0_RQ, z)
    small = jnp.where(x < 0.00001, 1.0 - z / 4.0, small)
    large = _asymptotic(x, 25.0 / z, _J0_PP, _J0_PQ, _J0_QP, _J0_QQ, _PI_4, "j")
    return jnp.where(x <= 5.0, small, large)


def _j1(x):
    negative = x < 0
    x = jnp.where(negative, -x, x)  # j1(-x) = -j1(x); -0.0 stays -0.0
    z = x * x
    small = _horner(_J1_RP, z) / _horner(_J1_RQ, z) * x * (z - 14.6819706421238932572) * (z - 49.2184563216946036703)
    large = _asymptotic(x, 5.0 / x * (5.0 / x), _J1_PP, _J1_PQ, _J1_QP, _J1_QQ, _3PI_4, "j")
    out = jnp.where(x <= 5.0, small, large)
    return jnp.where(negative, -out, out)


def _y0(x):
    z = x * x
    small = _horner(_Y0_YP, z) / _horner(_Y0_YQ, z) + _2_PI * jnp.log(x) * _j0(x)
    small = jnp.where(x < 0, jnp.nan, jnp.where(x == 0, -jnp.inf, small))
    large = _asymptotic(x, 25.0 / z, _J0_PP, _J0_PQ, _J0_QP, _J0_QQ, _PI_4, "y")
    return jnp.where(x <= 5.0, small, large)


def _y1(x):
    z = x * x
    small = x * (_horner(_Y1_YP, z) / _horner(_Y1_YQ, z)) + _2_PI * (_j1(x) * jnp.log(x) - 1.0 / x)
    small = jnp.where(x < 0, jnp.nan, jnp.where(x == 0, -jnp.inf, small))
    large = _asymptotic(x, 5.0 / x * (5.0 / x), _J1_PP, _J1_PQ, _J1_QP, _J1_QQ, _3PI_4, "y")
    return jnp.where(x <= 5.0, small, large)


def _k(x, order: int, scaled: bool):
    """k0 / k1 (times exp(x) where scaled): a Chebyshev series in x*x - 2 up to
    2 (with the log term of i0 / i1), in 8 / x - 2 above."""
    a, b = (_K0_A, _K0_B) if order == 0 else (_K1_A, _K1_B)
    i = jss.i0(x) if order == 0 else jss.i1(x)
    series = _chbevl(a, x * x - 2.0)
    small = (series - jnp.log(0.5 * x) * i) if order == 0 else (jnp.log(0.5 * x) * i + series / x)
    large = _chbevl(b, 8.0 / x - 2.0)
    if scaled:
        small, large = small * jnp.exp(x), large / jnp.sqrt(x)
    else:
        large = jnp.exp(-x) * large / jnp.sqrt(x)
    out = jnp.where(x <= 2.0, small, large)
    return jnp.where(x < 0, jnp.nan, jnp.where(x == 0, jnp.inf, out))


def _airy_ai(x):
    """Cephes' airy: asymptotic forms below -2.09 and from 2.09 up, the power
    series (summed until its terms fall under machine epsilon) between."""
    root = jnp.sqrt(jnp.abs(x))
    # below -2.09
    zeta = -2.0 * x * root / 3.0
    z = 1.0 / zeta
    zz = z * z
    t = zeta + 0.25 * math.pi
    negative = 5.64189583547756286948e-01 / jnp.sqrt(root) * (
        jnp.sin(t) * (1.0 + zz * _horner(_AIRY_AFN, zz) / _horner(_AIRY_AFD, zz))
        - jnp.cos(t) * (z * _horner(_AIRY_AGN, zz) / _horner(_AIRY_AGD, zz)))
    # from 2.09 up
    zeta = 2.0 * x * root / 3.0
    positive = 5.64189583547756286948e-01 * (_horner(_AIRY_AN, 1.0 / zeta) / _horner(_AIRY_AD, 1.0 / zeta)) / (
        2.0 * jnp.sqrt(root) * jnp.exp(zeta))
    # between: each element's series runs until its own term is negligible
    middle = (x >= -2.09) & (x < 2.09)
    s = jnp.where(middle, x, jnp.zeros_like(x))
    eps = jnp.finfo(x.dtype).eps
    one, cube = jnp.ones_like(s), s * s * s

    def more(state):
        return jnp.any(state[-1] > eps)

    def step(state):
        f, g, k, m, n, t = state
        active = t > eps
        m2 = m * cube / (k + 1)
        n2 = n * cube / (k + 2)
        m2 = m2 / (k + 2)
        f2 = f + m2
        n2 = n2 / (k + 3)
        g2 = g + n2
        t2 = jnp.abs(m2 / f2)
        keep = lambda new, old: jnp.where(active, new, old)  # noqa: E731
        return keep(f2, f), keep(g2, g), keep(k + 3, k), keep(m2, m), keep(n2, n), keep(t2, t)

    f, g, *_ = lax.while_loop(more, step, (one, s, one, one, s, one))
    series = 0.355028053887817239260 * f - 0.258819403792806798405 * g
    out = jnp.where(x < -2.09, negative, jnp.where(x >= 2.09, positive, series))
    out = jnp.where(x > 103.892, jnp.zeros_like(x), out)
    return jnp.where(jnp.isinf(x) | jnp.isnan(x), jnp.nan, out)


for _name, _fn in {"bessel_j0": _j0, "bessel_j1": _j1, "bessel_y0": _y0, "bessel_y1": _y1,
                   "modified_bessel_k0": lambda x: _k(x, 0, False), "modified_bessel_k1": lambda x: _k(x, 1, False),
                   "scaled_modified_bessel_k0": lambda x: _k(x, 0, True),
                   "scaled_modified_bessel_k1": lambda x: _k(x, 1, True), "airy_ai": _airy_ai}.items():
    lowers(f"aten::special_{_name}", promote=True)(lambda self, _fn=_fn: _fn(opmath(self)))
del _name, _fn
