"""Numerics where xlakit must give eager CPU torch's values (issue #24): Python
scalars met by float16 / bfloat16 tensors, Scalars that do not fit the tensor,
reductions' signed zeros, special functions' edge values, the default dtype,
and the bound on the shape memo."""
import pytest
import torch
from conftest import assert_same

HALF = [torch.float16, torch.bfloat16]
SCALARS = [65536.0, 1e-8, 1e5, 3.0, -1e-6]

# Each takes (x, y, z, s): three tensors of one half dtype (inputs; a chain of
# half ops: test_a_chain_of_half_ops_rounds_after_every_op_as_eager) and a scalar s.
SCALAR_OPS = {
    "add": lambda x, y, z, s: x + s,
    "sub": lambda x, y, z, s: x - s,
    "rsub": lambda x, y, z, s: s - x,
    "mul": lambda x, y, z, s: x * s,
    "mul_": lambda x, y, z, s: x.clone().mul_(s),
    "div": lambda x, y, z, s: x / s,
    "div_trunc": lambda x, y, z, s: torch.div(x, s, rounding_mode="trunc"),
    "div_floor": lambda x, y, z, s: torch.div(x, s, rounding_mode="floor"),
    "floor_divide": lambda x, y, z, s: x // s,
    "addcmul": lambda x, y, z, s: torch.addcmul(x, y, z, value=s),
    "addcdiv": lambda x, y, z, s: torch.addcdiv(x, y, z, value=s),
    "lerp": lambda x, y, z, s: torch.lerp(x, y, s),
    "clamp": lambda x, y, z, s: x.clamp(min=-s, max=s),
    "pow": lambda x, y, z, s: z ** s,
    "where": lambda x, y, z, s: torch.where(x > 0.1, x, s),
}


def _result(fn):
    try:
        return fn()
    except RuntimeError as e:
        return e


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("op", SCALAR_OPS)
def test_half_tensor_with_scalar_outside_its_range(dev, op, dtype):
    """Eager's mul / div / addcmul / addcdiv / lerp kernels read a scalar in
    float32 (at::opmath_type), where add / sub / clamp / pow round it to the
    tensor's dtype first (or refuse it); a 0-d float32 tensor behaves as the scalar."""
    fn = SCALAR_OPS[op]
    x = torch.tensor([1e-3, 0.5, 0.0, -2.5, 300.0, 7.0, -300.0, 1.1], dtype=dtype)
    y = torch.tensor([2.0, -0.25, 3.0, 1e-3, 301.0, -7.5, 1.0, 0.1], dtype=dtype)
    z = torch.tensor([3.0, 0.5, 1.5, 1.0, 302.0, 2.0, 4.0, 1.25], dtype=dtype)
    lazy = [t.to(dev) for t in (x, y, z)]
    for scalar in SCALARS:
        for s in (scalar, torch.tensor(scalar)):
            eager = _result(lambda: fn(x, y, z, s))
            got = _result(lambda: fn(*lazy, s).cpu())
            case = f"{op} {dtype} {s!r}"
            if isinstance(eager, RuntimeError):
                assert isinstance(got, RuntimeError) and str(eager) in str(got), (case, eager, got)
            else:
                assert not isinstance(got, RuntimeError), (case, got)
                assert_same(got, eager, rtol=0, atol=0, equal_nan=True, msg=case)


@pytest.mark.parametrize("dtype", HALF)
def test_a_chain_of_half_ops_rounds_after_every_op_as_eager(dev, dtype):
    """Each op of a chain of half ops, fused in one executable, rounds its result to the half
    dtype as eager's does. XLA's default drops a rounding between two ops (a bf16 `x + 1e5` read as
    float32 kept float32's digits: 20 distinct values where eager's rounding gives one)."""
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))

    def chain(t):
        h = t.to(dtype)
        return [((h + s) * 3 - s / 7).to(torch.float32) for s in SCALARS]  # ops IEEE rounds exactly
    for got, want, s in zip(chain(x.to(dev)), chain(x), SCALARS):
        assert_same(got, want, rtol=0, atol=0, equal_nan=True, msg=f"{dtype} {s}")


def test_a_division_by_a_scalar_or_a_broadcast_divisor_gives_eagers_quotient(dev):
    """XLA makes x / c a product with 1 / c, an ulp off for about a third of all x; a float16
    tie then rounds the other way (fuzz: 1.5 / 3e-5 in float16 gave 50016, eager 49984)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4096, generator=gen) * 100
    rows, divisors = torch.randn(64, 32, generator=gen), torch.randn(1, 32, generator=gen) + 3
    for c in (3.0, 7.0, 0.1, 3e-5, torch.tensor(3.0)):
        assert_same(x.to(dev) / c, x / c, rtol=0, atol=0, msg=f"x / {c!r}")
    assert_same(rows.to(dev) / divisors.to(dev), rows / divisors, rtol=0, atol=0)
    half = torch.tensor([1.5, -1.5, 0.75], dtype=torch.float16)
    assert_same(half.to(dev) / 3e-5, half / 3e-5, rtol=0, atol=0)


def test_half_times_large_scalar_is_finite(dev):
    x = torch.tensor([1e-3, 0.5, 0.0], dtype=torch.float16)
    assert_same((x.to(dev) * 65536.0), x * 65536.0)
    assert_same((x.to(dev) / 1e-8), x / 1e-8)
    assert_same((x.to(dev) * torch.tensor(65536.0)), x * torch.tensor(65536.0))
    assert_same((x.to(dev) * 100000), x * 100000)  # a Python int is read in float32 too


# -- Scalars that do not fit the tensor: eager's RuntimeError at record time -----------------
def _set_item(index, value):
    def run(t):
        t = t.clone()
        t[index] = value
        return t
    return run


OVERFLOWING = {
    "masked_fill": (torch.int32, lambda t: t.masked_fill(t > 1, 2**40)),
    "clamp": (torch.int32, lambda t: t.clamp(max=2**40)),
    "clamp_min": (torch.int32, lambda t: t.clamp_min(2**40)),
    "where": (torch.int32, lambda t: torch.where(t > 1, t, 2**40)),
    "fill_": (torch.int32, lambda t: t.clone().fill_(2**40)),
    "setitem": (torch.int32, _set_item(0, 2**40)),
    "setitem_slice": (torch.int32, _set_item(slice(0, 2), 2**40)),
    "setitem_mask": (torch.int32, lambda t: _set_item(t > 1, 2**40)(t)),
    "add_alpha": (torch.int32, lambda t: torch.add(t, t, alpha=2**40)),
    "int_fill_nan": (torch.int32, lambda t: t.clone().fill_(float("nan"))),
    "uint8_fill_256": (torch.uint8, lambda t: t.clone().fill_(256)),
    "full_like": (torch.int32, lambda t: torch.full_like(t, 2**40)),
    "half_clamp": (torch.float16, lambda t: t.clamp(max=1e6)),
    "half_masked_fill": (torch.float16, lambda t: t.masked_fill(t > 1, 1e6)),
    "half_fill_": (torch.float16, lambda t: t.clone().fill_(1e6)),
    "half_pow": (torch.float16, lambda t: t ** 1e6),
    "bfloat16_fill_": (torch.bfloat16, lambda t: t.clone().fill_(1e39)),
    "float_fill_complex": (torch.float32, lambda t: t.clone().fill_(1 + 1j)),
}


@pytest.mark.parametrize("case", OVERFLOWING)
def test_scalar_that_does_not_fit_raises_as_eager(dev, case):
    dtype, fn = OVERFLOWING[case]
    t = torch.tensor([1, 2, 3], dtype=dtype)
    with pytest.raises(RuntimeError) as eager:
        fn(t)
    lazy = t.to(dev)
    with pytest.raises(RuntimeError, match="without overflow") as got:
        fn(lazy).cpu()
    assert str(eager.value) in str(got.value)
    assert "test_eager_numerics.py" in str(got.value)  # the source line
    assert_same(lazy + 1, t + 1)  # the session goes on


FITTING = {
    "uint8_fill_negative": (torch.uint8, lambda t: t.clone().fill_(-200)),  # wraps, as eager
    "int_fill_fraction": (torch.int32, lambda t: t.clone().fill_(2.5)),
    "half_where": (torch.float16, lambda t: torch.where(t > 1, t, 1e6)),  # a 0-d fill: unchecked
    "half_setitem": (torch.float16, _set_item(0, 1e6)),
    "half_fill_inf": (torch.float16, lambda t: t.clone().fill_(float("inf"))),
    "half_lerp": (torch.float16, lambda t: torch.lerp(t, t, 1e6)),  # read in float32
    "half_addcmul": (torch.float16, lambda t: torch.addcmul(t, t, t, value=1e6)),
    "int_clamp_float": (torch.int32, lambda t: t.clamp(max=1e10)),  # the result is float
    "float_pow": (torch.float32, lambda t: t ** 1e39),  # read in double
    "bool_fill": (torch.bool, lambda t: t.clone().fill_(2**40)),
}


@pytest.mark.parametrize("case", FITTING)
def test_scalar_that_eager_takes_is_taken(dev, case):
    dtype, fn = FITTING[case]
    t = torch.tensor([1, 2, 3], dtype=dtype)
    assert_same(fn(t.to(dev)), fn(t), equal_nan=True)


# -- the shape memo ---------------------------------------------------------------------------------
DEFAULT_DTYPE_OPS = {
    "int / 4": lambda i, device: i.to(device) / 4,
    "int * 0.1": lambda i, device: i.to(device) * 0.1,
    "sigmoid(int)": lambda i, device: torch.sigmoid(i.to(device)),
    "arange(0., 3.)": lambda i, device: torch.arange(0.0, 3.0, device=device),
    "eye(2)": lambda i, device: torch.eye(2, device=device),
    "int + 1j": lambda i, device: i.to(device) + 1j,
}


@pytest.mark.parametrize("op", DEFAULT_DTYPE_OPS)
def test_ops_follow_a_changed_default_dtype(dev, op):
    fn = DEFAULT_DTYPE_OPS[op]
    i = torch.tensor([1, 2, 3])
    assert_same(fn(i, dev), fn(i, "cpu"))  # seen first under float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert_same(fn(i, dev), fn(i, "cpu"))
    finally:
        torch.set_default_dtype(previous)
    assert_same(fn(i, dev), fn(i, "cpu"))


def test_shape_memo_stays_bounded_under_ever_new_slices(dev):
    from xlakit.front import op_shapes

    x = torch.arange(op_shapes._SHAPES_LIMIT + 600, dtype=torch.float32, device=dev)
    for start in range(op_shapes._SHAPES_LIMIT + 500):
        x[start:start + 2]
    assert len(op_shapes._SHAPES) <= op_shapes._SHAPES_LIMIT
    assert_same(x[5:7] * 2, torch.tensor([10.0, 12.0]))


# -- special functions' edge values -------------------------------------------------------------------
INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zeta_edge_values_equal_eager(dev, dtype):
    """Cephes' order of early returns: zeta(inf, 1) is 1, zeta(nan, -1) inf, zeta(2.5, -1) inf."""
    xs = [INF, -INF, NAN, 1.0, 0.5, 2.0, 2.5, 3.0, 50.0]
    qs = [1.0, 2.0, 0.5, 0.0, -1.0, -0.5, -1.5, -7.25, INF, NAN, 1e-30, 1e30, 1.1]
    x = torch.tensor([a for a in xs for _ in qs], dtype=dtype)
    q = torch.tensor([b for _ in xs for b in qs], dtype=dtype)
    assert_same(torch.special.zeta(x.to(dev), q.to(dev)), torch.special.zeta(x, q), equal_nan=True)


def test_zeta_of_a_huge_negative_q_ends(dev):
    """A negative integer q (any huge float is one) is inf at once: no term-by-term sum."""
    x = torch.tensor([2.0, 3.0, 2.5], dtype=torch.float64)
    q = torch.tensor([-INF, -1e30, -1e300], dtype=torch.float64)
    assert_same(torch.special.zeta(x.to(dev), q.to(dev)), torch.special.zeta(x, q))


# -- reductions ---------------------------------------------------------------------------------------
SUMS = {
    "sum(1)": lambda x: x.sum(1),
    "sum()": lambda x: x.sum(),
    "sum(0)": lambda x: x.sum(0),
    "sum keepdim": lambda x: x.sum(1, keepdim=True),
    "mean(1)": lambda x: x.mean(1),
    "nansum(1)": lambda x: x.nansum(1),
    "cumsum(1)": lambda x: x.cumsum(1),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.complex64])
@pytest.mark.parametrize("op", SUMS)
def test_sum_of_negative_zero_is_positive_zero(dev, op, dtype):
    """Eager's sums start from +0.0; XLA folds a one-element sum to the element."""
    fn = SUMS[op]
    if dtype.is_complex and op == "nansum(1)":
        pytest.skip("eager refuses complex nansum")
    x = torch.tensor([[-0.0], [-0.0]], dtype=dtype)
    if dtype.is_complex:
        x = torch.complex(x.real, x.real)
    got, eager = fn(x.to(dev)).cpu(), fn(x)
    assert_same(got, eager)
    parts = (got.real, got.imag, eager.real, eager.imag) if dtype.is_complex else (got, eager)
    assert not any(p.signbit().any() for p in parts), (got, eager)
