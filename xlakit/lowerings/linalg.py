"""Matrix products, linear algebra and FFTs.

Products go through jnp.matmul / lax.dot_general with precision=None for
float32, so the precision to_jax.py sets from torch's float32 matmul setting
applies; float64 and complex128 products ask for HIGHEST (eager computes them
in full precision whatever that setting says); float16 / bfloat16 accumulate
in float32 as eager CPU does.

Factorizations use jax.lax.linalg (LAPACK's routines on CPU). Errors: eager
raises for singular / non-positive-definite input through
`_linalg_check_errors(info)`, which has no lowering on purpose: it runs
eagerly, reads `info` (a sync) and raises torch's own error. So every `_ex`
op here returns `info` as LAPACK computes it (0 when fine), and raises
NeedsEager for `check_errors=True`, where the op itself would raise. Ops
whose kernels raise without an `info` output have no lowering, so eager
computes them and raises where it should: cholesky, cholesky_inverse (a zero
diagonal). Nor do linalg_lstsq and linalg_ldl_factor_ex / ldl_solve (LAPACK's
gelsy / sytrf, which XLA lacks; a hand-written Bunch-Kaufman would not give
eager's pivots) or geqrf (no meta kernel: it never reaches a graph).

Where eager's answer is one of several, XLA's LAPACK may pick another: signs
(phases) of singular vectors and eigenvectors (svd, eigh). On an exactly
singular matrix whose zero pivot comes from rounding (not a zero row or
column), MKL's fused multiply-adds may leave a tiny pivot where XLA's LAPACK
leaves 0 or the reverse, so info (and whether linalg.inv raises) can differ,
as any rounding does.

One divergence, on non-finite input only: eager's svd, eigh and eig raise
("failed to converge", "should not contain infs or NaNs"); the lowerings here
return NaNs instead, since a check would cost a sync on every call.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .registry import Handling, handled_as, lowers
from .verdicts import NeedsEager

handled_as(Handling.EAGER, "aten::_linalg_check_errors",
           reason="reads LAPACK's info and raises torch's own error (linalg.inv, cholesky, solve): a read of the "
                  "value, as in eager")

_LAPACK_DTYPES = frozenset(jnp.dtype(d) for d in (jnp.float32, jnp.float64, jnp.complex64, jnp.complex128))
_HALF = frozenset(jnp.dtype(d) for d in (jnp.float16, jnp.bfloat16))
_WIDE = frozenset(jnp.dtype(d) for d in (jnp.float64, jnp.complex128))


# -- helpers ----------------------------------------------------------------------------
def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _matmul(a, b):
    """a @ b (batched, broadcast) as eager computes it: see the module docstring."""
    dtype = jnp.result_type(a, b)
    if dtype in _HALF:
        return jnp.matmul(a, b, preferred_element_type=jnp.float32)
    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST if dtype in _WIDE else None)


def _lapack(*arrays):
    """Eager's LAPACK kernels take float32/64 and complex64/128 only (and raise otherwise)."""
    for a in arrays:
        if jnp.dtype(a.dtype) not in _LAPACK_DTYPES:
            raise NeedsEager(f"eager's linear algebra rejects {a.dtype}")


def _no_error_check(check_errors):
    if check_errors:
        raise NeedsEager("check_errors=True: the op raises on the values of info")


def _broadcast_batch(a, b):
    """a and b with their batch dimensions (all but the last two) broadcast together."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _empty(dtype):
    """An output the op was asked not to compute: torch returns an empty tensor."""
    return jnp.zeros((0,), dtype)


def _hermitian(a, lower: bool):
    """The Hermitian matrix LAPACK sees when told to read only one triangle
    (imaginary parts of the diagonal are ignored, as zheevd / zpotrf do)."""
    tri = jnp.tril(a, -1) if lower else jnp.triu(a, 1)
    diag = jnp.real(jnp.diagonal(a, axis1=-2, axis2=-1)).astype(a.dtype)
    return tri + _mH(tri) + diag[..., None] * jnp.eye(a.shape[-1], dtype=a.dtype)


def _scaled(alpha, product, beta, self):
    """beta * self + alpha * product, with BLAS's rule that beta == 0 never reads
    self (NaN in self does not propagate). alpha == 0 is left to eager: whether
    eager then reads the product (NaN propagates) depends on the size, the op
    and the dtype."""
    if alpha == 0 and jnp.issubdtype(product.dtype, jnp.inexact):
        raise NeedsEager("alpha=0: eager's gemm reads the product or not, by size and dtype")
    dtype = jnp.result_type(product, self)
    out = product if alpha == 1 else product * jnp.asarray(alpha).astype(dtype)
    if beta == 0:
        return jnp.broadcast_to(out, jnp.broadcast_shapes(out.shape, self.shape))
    self = self.astype(dtype)
    return out + (self if beta == 1 else self * jnp.asarray(beta).astype(dtype))


# -- products -------------------------------------------------------------------------
@lowers("aten::mm.default", "aten::bmm.default")
def mm(self, mat2):
    return _matmul(self, mat2)


@lowers("aten::mv")
def mv(self, vec):
    return _matmul(self, vec)


@lowers("aten::dot")
def dot(self, tensor):
    return _matmul(self, tensor)


@lowers("aten::vdot")
def vdot(self, other):
    return _matmul(jnp.conj(self), other)


@lowers("aten::outer")
def outer(self, vec2):
    return self[:, None] * vec2[None, :]


@lowers("aten::addmm.default")
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    return _scaled(alpha, _matmul(mat1, mat2), beta, self)


@lowers("aten::addmv")
def addmv(self, mat, vec, *, beta=1, alpha=1):
    return _scaled(alpha, _matmul(mat, vec), beta, self)


@lowers("aten::baddbmm.default")
def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    return _scaled(alpha, _matmul(batch1, batch2), beta, self)


@lowers("aten::addbmm")
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    dtype = jnp.result_type(batch1, batch2)
    if dtype in _HALF:
        product = jnp.einsum("bij,bjk->ik", batch1, batch2, preferred_element_type=jnp.float32)
    else:
        product = jnp.einsum("bij,bjk->ik", batch1, batch2,
                             precision=lax.Precision.HIGHEST if dtype in _WIDE else None)
    return _scaled(alpha, product, beta, self)


@lowers("aten::addr")
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    """Elementwise in eager (not a gemm): alpha == 0 still propagates NaN; bool
    tensors take beta and alpha as logical flags."""
    outer_ = vec1[:, None] * vec2[None, :] if vec1.dtype != jnp.bool_ else vec1[:, None] & vec2[None, :]
    shape = jnp.broadcast_shapes(self.shape, outer_.shape)
    if outer_.dtype == jnp.bool_ and self.dtype == jnp.bool_:
        out = outer_ & bool(alpha)
        return jnp.broadcast_to(out | (self & bool(beta)) if beta else out, shape)
    out = jnp.asarray(alpha).astype(outer_.dtype) * vec1[:, None] * vec2[None, :]
    if beta == 0:
        return jnp.broadcast_to(out, shape)
    return jnp.asarray(beta).astype(self.dtype) * self + out


# -- Cholesky -------------------------------------------------------------------------
def _potf2(h):
    """LAPACK's unblocked Cholesky (xPOTF2, lower) on the lower triangle of h:
    (factor, info). Run only when a factorization failed: it gives the order
    of the first leading minor that is not positive-definite, as LAPACK's
    info, and the partial factor LAPACK leaves (the failed pivot stored
    unrooted, later columns untouched)."""
    n = h.shape[-1]
    rows = jnp.arange(n)

    def step(j, carry):
        m, info = carry
        active = info == 0
        row_j = jnp.where(rows < j, m[..., j, :], 0)            # L[j, :j]
        ajj = jnp.real(m[..., j, j]) - jnp.sum(jnp.abs(row_j) ** 2, -1)
        fails = (ajj <= 0) | jnp.isnan(ajj)
        root = jnp.sqrt(jnp.where(fails, 1, ajj))
        # below the diagonal: (A[i, j] - sum_k<j L[i, k] conj(L[j, k])) / L[j, j]
        # (masked with where: a NaN in a later column must not leak in as NaN * 0)
        products = jnp.where(rows < j, m * jnp.conj(row_j)[..., None, :], 0)
        col = (m[..., :, j] - jnp.sum(products, -1)) / root[..., None]
        pivot = jnp.where(fails, ajj, root)[..., None]
        new = jnp.where(rows == j, pivot, jnp.where((rows > j) & ~fails[..., None], col, m[..., :, j]))
        m = m.at[..., :, j].set(jnp.where(active[..., None], new, m[..., :, j]).astype(m.dtype))
        return m, jnp.where(active & fails, j + 1, info)

    info0 = jnp.zeros(h.shape[:-2], jnp.int32)
    return lax.fori_loop(0, n, step, (jnp.tril(h), info0))


def _cholesky_lower(h):
    """(L, info) of the Hermitian h (both triangles set), LAPACK's info."""
    factor = lax.linalg.cholesky(h, symmetrize_input=False)
    ok = jnp.all(jnp.isfinite(factor), axis=(-2, -1))
    info0 = jnp.zeros(h.shape[:-2], jnp.int32)
    partial, info = lax.cond(jnp.all(ok), lambda: (factor, info0), lambda: _potf2(h))
    return jnp.where(ok[..., None, None], factor, partial), jnp.where(ok, 0, info)


@lowers("aten::linalg_cholesky_ex.default")
def linalg_cholesky_ex(self, *, upper=False, check_errors=False):
    _lapack(self)
    _no_error_check(check_errors)
    if self.shape[-1] == 0:
        return self, jnp.zeros(self.shape[:-2], jnp.int32)
    factor, info = _cholesky_lower(_hermitian(self, lower=not upper))
    return (_mH(factor) if upper else factor), info


# aten::cholesky and aten::cholesky_inverse raise inside the op (non-positive-
# definite input; a zero diagonal), with no info output to route through
# _linalg_check_errors: no lowering, so eager raises as it should.


@lowers("aten::cholesky_solve")
def cholesky_solve(self, input2, upper=False):
    """A = L L^H (or U^H U), reading only that triangle of input2; never raises in eager."""
    _lapack(self, input2)
    factor, b = _broadcast_batch(input2, self)
    lower = not upper
    # solve op1(T) y = b, then op2(T) x = y, with A = op1(T) op2(T)
    y = lax.linalg.triangular_solve(factor, b, left_side=True, lower=lower,
                                    transpose_a=upper, conjugate_a=upper)
    return lax.linalg.triangular_solve(factor, y, left_side=True, lower=lower,
                                       transpose_a=lower, conjugate_a=lower)


# -- triangular solves ------------------------------------------------------------------
@lowers("aten::linalg_solve_triangular")
def linalg_solve_triangular(self, B, *, upper, left=True, unitriangular=False):
    _lapack(self, B)
    a, b = _broadcast_batch(self, B)
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=not upper, unit_diagonal=unitriangular)


@lowers("aten::triangular_solve.default")
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    """Solves op(A) X = self, op(A) = A^T (not conjugated) when transpose; returns (X, A broadcast)."""
    _lapack(self, A)
    a, b = _broadcast_batch(A, self)
    x = lax.linalg.triangular_solve(a, b, left_side=True, lower=not upper, transpose_a=transpose,
                                    unit_diagonal=unitriangular)
    return x, a


# -- LU -------------------------------------------------------------------------------
def _lu(a):
    """(LU, LAPACK's 1-based int32 pivots, the permutation with a[perm] = L U, info)."""
    m, n = a.shape[-2:]
    if min(m, n) == 0:  # nothing to factor (XLA's LU rejects empty matrices)
        perm = jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), a.shape[:-2] + (m,))
        return (a, jnp.zeros(a.shape[:-2] + (0,), jnp.int32), perm,
                jnp.zeros(a.shape[:-2], jnp.int32))
    lu, pivots, perm = lax.linalg.lu(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    zero = diag == 0  # xGETRF's info: the first exactly zero pivot (NaN is not zero)
    info = jnp.where(jnp.any(zero, -1), jnp.argmax(zero, -1) + 1, 0).astype(jnp.int32)
    return lu, (pivots + 1).astype(jnp.int32), perm, info


def _permute_rows(b, perm):
    """b[..., perm[i], :] in row i (perm broadcast over b's batch)."""
    perm = jnp.broadcast_to(perm, b.shape[:-2] + perm.shape[-1:])
    return jnp.take_along_axis(b, perm[..., :, None], axis=-2)


def _lu_solve(lu, perm, b, mode="N"):
    """Solves op(A) X = b for A with A[perm] = L U: op is A ('N'), A^T ('T') or A^H ('H')."""
    lu, b = _broadcast_batch(lu, b)
    perm = jnp.broadcast_to(perm, lu.shape[:-2] + perm.shape[-1:])
    if mode == "N":
        y = lax.linalg.triangular_solve(lu, _permute_rows(b, perm), left_side=True, lower=True,
                                        unit_diagonal=True)
        return lax.linalg.triangular_solve(lu, y, left_side=True, lower=False)
    conj = mode == "H"
    # A = P^T L U  =>  A^T = U^T L^T P: U^T z = b, L^T w = z, x[perm] = w
    z = lax.linalg.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=conj)
    w = lax.linalg.triangular_solve(lu, z, left_side=True, lower=True, transpose_a=True, conjugate_a=conj,
                                    unit_diagonal=True)
    return _permute_rows(w, jnp.argsort(perm, axis=-1))


@lowers("aten::linalg_lu_factor_ex")
def linalg_lu_factor_ex(A, *, pivot=True, check_errors=False):
    _lapack(A)
    _no_error_check(check_errors)
    if not pivot:
        raise NeedsEager("pivot=False: eager CPU raises (LU without pivoting is not implemented)")
    lu, pivots, _, info = _lu(A)
    return lu, pivots, info


def _perm_from_pivots(pivots, m):
    """The permutation (a[perm] = L U) that LAPACK's 1-based row swaps make."""
    return lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


@lowers("aten::linalg_lu_solve")
def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    _lapack(LU, B)
    perm = _perm_from_pivots(pivots, LU.shape[-2])
    if left:
        return _lu_solve(LU, perm, B, "H" if adjoint else "N")
    # X A = B  <=>  A^T X^T = B^T;  X A^H = B  <=>  A X^H = B^H
    if adjoint:
        return _mH(_lu_solve(LU, perm, _mH(B), "N"))
    return _mT(_lu_solve(LU, perm, _mT(B), "T"))


def _permutation_matrix(perm, dtype):
    """P with A = P L U, for a[perm] = L U."""
    return _mT(jax.nn.one_hot(perm, perm.shape[-1], dtype=dtype))


def _unpack(lu):
    m, n = lu.shape[-2:]
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    return lower, jnp.triu(lu[..., :k, :])


@lowers("aten::linalg_lu")
def linalg_lu(A, *, pivot=True):
    _lapack(A)
    if not pivot:
        raise NeedsEager("pivot=False: eager CPU raises (LU without pivoting is not implemented)")
    lu, _, perm, _ = _lu(A)
    lower, upper = _unpack(lu)
    return _permutation_matrix(perm, A.dtype), lower, upper


@lowers("aten::lu_unpack")
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    lower, upper = _unpack(LU_data) if unpack_data else (_empty(LU_data.dtype), _empty(LU_data.dtype))
    if not unpack_pivots:
        return _empty(LU_data.dtype), lower, upper
    m = LU_data.shape[-2]
    perm = _perm_from_pivots(LU_pivots, m)
    return _permutation_matrix(perm, LU_data.dtype), lower, upper


def _lu_as_eager(A):
    """_lu of what eager factors to solve with or take the determinant of: A^T
    for real A where eager factors that when A is contiguous (as a lazy tensor
    is): its LU, pivots and info are then those of A^T (autograd's formulas
    expect that)."""
    transposed = not jnp.iscomplexobj(A) and _eager_factors_the_transpose()
    return (*_lu(_mT(A) if transposed else A), transposed)


@functools.cache
def _eager_factors_the_transpose() -> bool:
    """torch 2.9's solve factors A^T of a contiguous real A, torch 2.13's A itself:
    asked of eager once, on a matrix whose two factorizations fail at different pivots."""
    singular = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
    return int(torch.linalg.solve_ex(singular, torch.eye(3)).info) == 2


@lowers("aten::_linalg_solve_ex.default")
def linalg_solve_ex(A, B, *, left=True, check_errors=False):
    _lapack(A, B)
    _no_error_check(check_errors)
    lu, pivots, perm, info, transposed = _lu_as_eager(A)
    # torch's linalg_solve_is_vector_rhs; then a column either way, as torch
    # (so left=False takes a vector only where n is 1)
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])
    b = B[..., None] if vector else B
    if left:
        x = _lu_solve(lu, perm, b, "T" if transposed else "N")
    else:  # X A = B  <=>  A^T X^T = B^T
        x = _mT(_lu_solve(lu, perm, _mT(b), "N" if transposed else "T"))
    return (x[..., 0] if vector else x), lu, pivots, info


@lowers("aten::linalg_inv_ex.default")
def linalg_inv_ex(A, *, check_errors=False):
    """Eager solves A X = I as _linalg_solve_ex does (getrf + getrs)."""
    _lapack(A)
    _no_error_check(check_errors)
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    x, _, _, info = linalg_solve_ex(A, eye)
    return x, info


def _parity(pivots):
    """(-1) ** (number of row swaps) of LAPACK's 1-based pivots."""
    swaps = jnp.sum(pivots != jnp.arange(1, pivots.shape[-1] + 1, dtype=pivots.dtype), -1)
    return 1 - 2 * (swaps % 2)


@lowers("aten::_linalg_det.default")
def linalg_det(A):
    _lapack(A)
    lu, pivots, _, _, _ = _lu_as_eager(A)  # det(A^T) = det(A)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return _parity(pivots).astype(A.dtype) * jnp.prod(diag, -1), lu, pivots


@lowers("aten::_linalg_slogdet.default")
def linalg_slogdet(A):
    _lapack(A)
    lu, pivots, _, _, _ = _lu_as_eager(A)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    sign = _parity(pivots).astype(A.dtype) * jnp.prod(jnp.sign(diag), -1)
    return sign, jnp.sum(jnp.log(jnp.abs(diag)), -1), lu, pivots


# -- QR, SVD, eigenvalues -----------------------------------------------------------------
@lowers("aten::linalg_qr.default")
def linalg_qr(A, mode="reduced"):
    _lapack(A)
    if mode == "r":
        return _empty(A.dtype), jnp.linalg.qr(A, mode="r")
    q, r = jnp.linalg.qr(A, mode=mode)
    return q, r


@lowers("aten::linalg_householder_product")
def linalg_householder_product(input, tau):
    _lapack(input, tau)
    return lax.linalg.householder_product(input, tau)


@lowers("aten::_linalg_svd.default")
def linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None):
    _lapack(A)
    if driver is not None:
        raise NeedsEager("driver= is for CUDA: eager CPU raises")
    m, n = A.shape[-2:]
    if min(m, n) == 0:  # no singular values; eager's full U / Vh are identities
        batch = A.shape[:-2]
        s = jnp.zeros(batch + (0,), jnp.finfo(A.dtype).dtype)
        if not compute_uv:
            return _empty(A.dtype), s, _empty(A.dtype)
        if not full_matrices:
            return jnp.zeros(batch + (m, 0), A.dtype), s, jnp.zeros(batch + (0, n), A.dtype)
        return (jnp.broadcast_to(jnp.eye(m, dtype=A.dtype), batch + (m, m)), s,
                jnp.broadcast_to(jnp.eye(n, dtype=A.dtype), batch + (n, n)))
    if not compute_uv:
        return _empty(A.dtype), jnp.linalg.svd(A, compute_uv=False), _empty(A.dtype)
    u, s, vh = jnp.linalg.svd(A, full_matrices=full_matrices)
    return u, s, vh


def _eigh(A, UPLO):
    """eigh reading only the UPLO triangle, as LAPACK's xSYEVD / xHEEVD."""
    if UPLO not in ("L", "U"):
        raise NeedsEager(f"UPLO={UPLO!r}: eager raises")
    return lax.linalg.eigh(_hermitian(A, lower=UPLO == "L"), lower=True, symmetrize_input=False)


@lowers("aten::_linalg_eigh.default")
def linalg_eigh(A, UPLO="L", compute_v=True):
    _lapack(A)
    vectors, values = _eigh(A, UPLO)
    return values, (vectors if compute_v else _empty(A.dtype))


@lowers("aten::linalg_eig")
def linalg_eig(self):
    """LAPACK's xGEEV, which XLA calls on CPU only; elsewhere eager computes it."""
    _lapack(self)
    if jax.default_backend() != "cpu":
        raise NeedsEager("XLA's eig runs on CPU only")
    values, vectors = lax.linalg.eig(self, compute_left_eigenvectors=False)
    return values, vectors


@lowers("aten::linalg_pinv.atol_rtol_tensor")
def linalg_pinv(self, *, atol=None, rtol=None, hermitian=False):
    """Eager's formula (BatchLinearAlgebra's linalg_pinv): singular values (or
    |eigenvalues| of the triangle eigh reads) above max(atol, rtol * largest)
    are inverted, in double precision for the comparison as eager's double
    tolerances promote it; rtol defaults to eps * max(m, n), or 0 where atol is given."""
    _lapack(self)
    m, n = self.shape[-2:]
    if math.prod(self.shape) == 0:
        return jnp.zeros(self.shape[:-2] + (n, m), self.dtype)
    real = jnp.finfo(self.dtype).dtype
    default_rtol = jnp.asarray(jnp.finfo(real).eps * max(m, n), jnp.float64)
    atol_ = jnp.zeros((), jnp.float64) if atol is None else atol.astype(jnp.float64)
    if rtol is not None:
        rtol_ = rtol.astype(jnp.float64)
    elif atol is not None:
        rtol_ = jnp.where(atol_ > 0, 0.0, default_rtol)
    else:
        rtol_ = default_rtol
    if hermitian:
        vectors, values = _eigh(self, "L")
        magnitude = jnp.abs(values)
        largest = magnitude.max(-1, keepdims=True)
    else:
        u, values, vh = jnp.linalg.svd(self, full_matrices=False)
        magnitude = values
        largest = values[..., :1]
    tol = jnp.maximum(atol_[..., None], rtol_[..., None] * largest.astype(jnp.float64))
    inverse = jnp.where(magnitude.astype(jnp.float64) > tol, 1 / values, 0).astype(self.dtype)
    if hermitian:
        return _matmul(vectors * inverse[..., None, :], _mH(vectors))
    return _matmul(_mH(vh) * inverse[..., None, :], _mH(u))


@lowers("aten::linalg_matrix_exp")
def linalg_matrix_exp(self):
    """jax.scipy.linalg.expm (Pade 13 with scaling and squaring), in double
    precision. In single precision eager's own float32 rounding (its Taylor
    algorithm, MKL's products) decides entries much smaller than the largest:
    on OpInfo's 5x5 samples (1-norm ~27) eager is off the exact value by 2.8e-6
    normwise and expm by 6e-7, yet an entry differs from eager's by 2e-3
    relative. Neither expm nor a port of eager's algorithm (tried) gives eager's
    values there, so float32 / complex64 run eagerly."""
    _lapack(self)
    if jnp.dtype(self.dtype) not in _WIDE:
        raise NeedsEager("float32 matrix_exp: only eager's own rounding gives eager's values")
    if self.shape[-1] == 0:
        return self
    return jax.scipy.linalg.expm(self)


@lowers("aten::ormqr")
def ormqr(self, input2, input3, left=True, transpose=False):
    """Q (from geqrf's reflectors self, tau input2) applied to input3; transpose = Q^H."""
    _lapack(self, input2, input3)
    return lax.linalg.ormqr(self, input2, input3, left=left, transpose=transpose)


@lowers("aten::linalg_cross")
def linalg_cross(self, other, *, dim=-1):
    shape = jnp.broadcast_shapes(self.shape, other.shape)
    a, b = jnp.broadcast_to(self, shape), jnp.broadcast_to(other, shape)
    axis = dim % len(shape)
    a0, a1, a2 = (lax.index_in_dim(a, i, axis) for i in range(3))
    b0, b1, b2 = (lax.index_in_dim(b, i, axis) for i in range(3))
    return jnp.concatenate([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis)


# -- FFT ------------------------------------------------------------------------------
# aten's fft_norm_mode: 0 none, 1 by 1/sqrt(n), 2 by 1/n (n: the signal's size over `dim`).
def _normalize(x, normalization, n):
    if normalization == 0:
        return x
    scale = 1 / math.sqrt(n) if normalization == 1 else 1 / n
    return x * jnp.asarray(scale, x.real.dtype)


def _fft_args(x, dim, *sizes):
    """dim wrapped; empty tensors are left to eager."""
    _lapack(x)  # eager CPU's FFTs take the same four dtypes (half precision raises)
    dims = [d % x.ndim for d in dim]
    if x.size == 0 or 0 in sizes:
        raise NeedsEager("an empty FFT: eager raises for some, returns empty for others")
    if sizes and not dims:
        raise NeedsEager("a real FFT over no dimension")
    return dims


def _c2c(x, dims, forward):
    """Unnormalized complex FFT over dims, at most three at a time (XLA's limit)."""
    dims = list(dims)
    for start in range(0, len(dims), 3):
        axes = dims[start:start + 3]
        x = (jnp.fft.fftn(x, axes=axes, norm="backward") if forward
             else jnp.fft.ifftn(x, axes=axes, norm="forward"))
    return x


@lowers("aten::_fft_r2c")
def fft_r2c(self, dim, normalization, onesided):
    dims = _fft_args(self, dim, *([1] if onesided else []))
    n = math.prod(self.shape[d] for d in dims)
    if not onesided:
        out = _c2c(self.astype(jnp.result_type(self.dtype, jnp.complex64)), dims, True)
    else:
        out = _c2c(jnp.fft.rfft(self, axis=dims[-1], norm="backward"), dims[:-1], True)
    return _normalize(out, normalization, n)


@lowers("aten::_fft_c2r")
def fft_c2r(self, dim, normalization, last_dim_size):
    dims = _fft_args(self, dim, last_dim_size)
    x = _c2c(self, dims[:-1], False)
    out = jnp.fft.irfft(x, n=last_dim_size, axis=dims[-1], norm="forward")
    n = math.prod(out.shape[d] for d in dims)
    return _normalize(out, normalization, n)


@lowers("aten::_fft_c2c")
def fft_c2c(self, dim, normalization, forward):
    dims = _fft_args(self, dim)
    n = math.prod(self.shape[d] for d in dims)
    return _normalize(_c2c(self, dims, forward), normalization, n)
