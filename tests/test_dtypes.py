"""The dtypes XLA has beyond the common ones: float8 and the wide unsigned ints. They were refused
("has no XLA equivalent"); eager CPU casts to them, copies them and runs some ops on them, and so
does the lazy device, value for value."""
import pytest
import torch

from conftest import assert_same

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz]
UNSIGNED = [torch.uint16, torch.uint32, torch.uint64]
VALUES = torch.tensor([[0.5, -1.25, 3.0], [100.0, 0.0, 2.0]])

# each op eager CPU runs on some of these dtypes; an op eager refuses for a dtype is not asked of xlakit
OPS = {
    "cast_back": lambda t: t.to(torch.float32),
    "transpose_copy": lambda t: t.t().contiguous(),
    "reshape": lambda t: t.reshape(3, 2),
    "cat": lambda t: torch.cat([t, t]),
    "index": lambda t: t[1:, ::2],
    "add": lambda t: t + t,
    "mul_scalar": lambda t: t * 3,
    "max": lambda t: t.max(),
    "compare": lambda t: t > t[:1],
    "bitwise_and": lambda t: t & t[:1],
    "shift": lambda t: t >> 1,
}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """float8 as its bytes: torch compares no float8 tensors (torch.equal, assert_close)."""
    return t.view(torch.uint8) if t.dtype in FLOAT8 else t


@pytest.mark.parametrize("dtype", FLOAT8 + UNSIGNED, ids=str)
def test_casts_copies_and_the_ops_eager_runs_match_eager(dev, dtype):
    source = VALUES.abs() if dtype in UNSIGNED else VALUES
    want = source.to(dtype)
    for got in (source.to(dev).to(dtype), want.to(dev)):  # cast on the device; a host tensor moved
        assert got.dtype == dtype and torch.equal(_bits(got.cpu()), _bits(want))
        ran = 0
        for name, op in OPS.items():
            try:
                expected = op(want)
            except (RuntimeError, NotImplementedError):  # eager has no kernel for this dtype
                continue
            ran += 1
            result = op(got).cpu()
            assert result.dtype == expected.dtype, name
            assert_same(_bits(result), _bits(expected), rtol=0, atol=0, msg=name)
        assert ran >= 4  # the casts and copies, at least
