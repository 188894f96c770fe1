"""xlakit/lowerings/linalg.py against eager torch: values, dtypes and shapes,
each case computed by the lowering itself (no op of the case may fall back to
eager CPU, which would pass whatever the lowering does)."""
import pytest
import torch

import xlakit
from conftest import assert_same

NAN = float("nan")


def _spd(*shape, dtype=torch.float64):
    a = torch.randn(*shape, dtype=dtype)
    return a @ a.mH + shape[-1] * torch.eye(shape[-1], dtype=dtype)


def _run(dev, fn, *args, **tol):
    """fn eagerly and on xlakit; every output equal, nothing run eagerly."""
    want = fn(*args)
    got = fn(*(a.to(dev) for a in args))
    got = [g.cpu() for g in (got if isinstance(got, (tuple, list)) else (got,))]
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert xlakit.metrics()["fallbacks"] == 0
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_same(g, w, equal_nan=True, **tol)
    return got, want


def _nonpd():
    return torch.cat([_spd(2, 4, 4), torch.tensor([[[4., 2, 1, 0], [2, 5, 0, 0], [1, 0, -3, 0], [0, 0, 0, 1]]],
                                                 dtype=torch.float64)])


# name: (function of the inputs, the inputs). The functions call only the ops
# under test: slicing and the like happen on the host, in the inputs.
CASES = {
    # beta=0: self is never read, so its NaNs do not propagate (BLAS's rule, and torch's)
    "addmm_beta0_nan": (lambda s, s1, c, a, b: (torch.addmm(s, a, b, beta=0, alpha=2), torch.addmm(s1, a, b, beta=0),
                                                torch.addmm(c, a, b, beta=0.5, alpha=-1)),
                        lambda: (torch.full((3, 5), NAN), torch.full((5,), NAN), torch.randn(5), torch.randn(3, 4),
                                 torch.randn(4, 5))),
    "baddbmm_addmv_addr_beta0": (
        lambda s3, s2, s1, a, b, m, v4, v5: (torch.baddbmm(s3, a, b, beta=0), torch.addmv(s1, m, v5, beta=0),
                                             torch.addr(s2, v4, v5, beta=0, alpha=3), torch.addbmm(s2, a, b, beta=0)),
        lambda: (torch.full((2, 4, 5), NAN), torch.full((4, 5), NAN), torch.full((4,), NAN),
                 torch.randn(2, 4, 3), torch.randn(2, 3, 5), torch.randn(4, 5), torch.randn(4), torch.randn(5))),
    "matmul_dtypes": (lambda a, b, a64, b64, ai, bi, ac, bc, u, v, uc, vc: (
        torch.mm(a, b), torch.mm(a64, b64), torch.mm(ai, bi), torch.bmm(ac, bc), torch.mv(a, u),
        torch.dot(u, v), torch.vdot(uc, vc), torch.dot(uc, vc)),
        lambda: (torch.randn(3, 4), torch.randn(4, 5), torch.randn(3, 4, dtype=torch.float64),
                 torch.randn(4, 5, dtype=torch.float64), torch.randint(-99, 99, (3, 4)), torch.randint(-99, 99, (4, 5)),
                 torch.randn(2, 3, 4, dtype=torch.cfloat), torch.randn(2, 4, 5, dtype=torch.cfloat),
                 torch.randn(4), torch.randn(4), torch.randn(6, dtype=torch.cdouble),
                 torch.randn(6, dtype=torch.cdouble))),
    # batched solves: matrix and vector right-hand sides, broadcast batches, left=False; info 0
    "solve_ex": (lambda a, b, v, bt: (*torch.linalg.solve_ex(a, b), *torch.linalg.solve_ex(a, v),
                                      *torch.linalg.solve_ex(a, bt, left=False)),
                 lambda: (torch.randn(2, 4, 4, dtype=torch.float64), torch.randn(3, 1, 4, 2, dtype=torch.float64),
                          torch.randn(4, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64))),
    # a singular member (exactly: a zero row, so no rounding can hide it): info as
    # LAPACK's getrf gives it (the first zero pivot, 1-based)
    "inv_ex": (lambda a, ok: (*torch.linalg.inv_ex(ok), torch.linalg.inv_ex(a).info, *torch.linalg.lu_factor_ex(a)),
               lambda: (torch.cat([torch.randn(2, 3, 3), torch.tensor([[[1., 2, 3], [0, 0, 0], [1, 0, 1]]])]),
                        torch.randn(2, 3, 3))),
    # only the lower (upper) triangle is read; a non-positive-definite member gives
    # LAPACK's info and its partial factor
    "cholesky_ex": (lambda a, junk_above: (*torch.linalg.cholesky_ex(a), *torch.linalg.cholesky_ex(a, upper=True),
                                           *torch.linalg.cholesky_ex(junk_above)),
                    lambda: (_nonpd(), _nonpd() + torch.triu(torch.full((4, 4), 9.0, dtype=torch.float64), 1))),
    "cholesky_solve_det": (lambda a, factor, b: (torch.cholesky_solve(b, factor), *torch.linalg.slogdet(a),
                                                 torch.linalg.det(a), torch.linalg.solve_triangular(a, b, upper=True)),
                           lambda: (lambda a: (a, torch.linalg.cholesky(a), torch.randn(2, 3, 2, dtype=torch.float64)))(
                               _spd(2, 3, 3))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_lowering_matches_eager(dev, name):
    torch.manual_seed(0)
    fn, make = CASES[name]
    _run(dev, fn, *make(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("uplo", ["L", "U"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_eigh_reads_only_its_triangle(dev, uplo, dtype):
    """A non-symmetric input: only the UPLO triangle counts. Eigenvectors are
    unique up to sign (phase): compared once each takes eager's."""
    torch.manual_seed(0)
    a = torch.randn(2, 4, 4, dtype=dtype)
    values, vectors = torch.linalg.eigh(a.to(dev), UPLO=uplo)
    assert xlakit.metrics()["fallbacks"] == 0
    want_values, want_vectors = torch.linalg.eigh(a, UPLO=uplo)
    assert_same(values, want_values, rtol=1e-5, atol=1e-5)
    vectors = vectors.cpu()
    phase = (vectors.conj() * want_vectors).sum(-2)
    phase = phase / phase.abs()
    assert_same(vectors * phase.unsqueeze(-2), want_vectors, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("norm", [None, "forward", "backward", "ortho"])
def test_fft_norms(dev, norm):
    torch.manual_seed(0)
    real, cplx = torch.randn(3, 6, 5), torch.randn(3, 6, 5, dtype=torch.complex64)
    _run(dev, lambda r, c, r64: (torch.fft.fft(c, norm=norm), torch.fft.ifft(c, norm=norm),
                                 torch.fft.fftn(c, dim=(0, 2), norm=norm), torch.fft.ifftn(c, norm=norm),
                                 torch.fft.rfft(r, norm=norm), torch.fft.rfftn(r, norm=norm),
                                 torch.fft.irfft(c, norm=norm), torch.fft.irfftn(c, s=(6, 8), norm=norm),
                                 torch.fft.rfft(r64, dim=0, norm=norm)),
         real, cplx, real.double(), rtol=1e-4, atol=1e-4)


def test_errors_are_eagers(dev):
    """The checks eager makes on info still raise (through _linalg_check_errors)."""
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.inv(torch.zeros(2, 3, 3).to(dev)).cpu()
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky((-torch.eye(3)).to(dev)).cpu()
    xlakit.mark_step()
