"""Reductions, scans and sorts (xlakit/lowerings/reductions.py), differentially:
each case runs in eager torch on CPU and on the lazy device with
strict_lowering set (an op that would fall back raises), and the values,
dtypes and shapes, and the indices, must equal eager's. The inputs hold the
cases where a lowering goes wrong quietly: equal values (which index wins),
NaN (propagated, ordered above +inf), -0.0, empty tensors and zero-size
dimensions, 0-d tensors with dim 0 / -1, negative dims, `dtype=` arguments,
and integer, bool, float64 and bfloat16 inputs.

Where torch leaves open which of several equal values' indices is returned
(topk, kthvalue, median and nanmedian along a dim: "not guaranteed to be
stable"), the indices are checked to point at the values returned."""
import pytest
import torch

import xlakit
from xlakit import config
from xlakit.lowerings import verdicts

nan, inf = float("nan"), float("inf")
aten = torch.ops.aten


def _on_device(fn, inputs, strict=True):
    dev = xlakit.device()
    strict_before = config.strict_lowering
    config.strict_lowering = strict
    try:
        out = fn(*[x.to(dev) for x in inputs])
        out = tuple(o.cpu() for o in out) if isinstance(out, tuple) else out.cpu()
    finally:
        config.strict_lowering = strict_before
        xlakit.mark_step()
    return out


def _same(got, want, exact):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    tol = {"rtol": 0, "atol": 0} if exact else \
        {"rtol": 2e-2, "atol": 1e-2} if want.dtype in (torch.bfloat16, torch.float16) else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(got, want, equal_nan=True, **tol)


def check(fn, *inputs, exact=False, strict=True, index_of=None):
    """fn on eager CPU and on xlakit agree; `index_of=(input, dim)`: the
    second output is an index tensor whose choice among equal values is open,
    checked to gather the first output from `input`."""
    want = fn(*inputs)
    got = _on_device(fn, inputs, strict=strict)
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        _same(got[0], want[0], exact)
        if index_of is None:
            for g, w in zip(got[1:], want[1:]):  # indices, or a mean
                _same(g, w, exact=exact or not (w.is_floating_point() or w.is_complex()))
        else:
            x, dim = index_of
            values, indices = got
            assert indices.dtype == want[1].dtype and indices.shape == want[1].shape
            keep = indices if indices.dim() == x.dim() else indices.unsqueeze(dim)
            gathered = x.gather(dim, keep).reshape(values.shape) if x.dim() else x
            torch.testing.assert_close(gathered, values, equal_nan=True, rtol=0, atol=0)
    else:
        _same(got, want, exact)
    return got


def _cases(**cases):
    names = "fn, inputs, dim" if len(next(iter(cases.values()))) == 3 else "fn, inputs"
    return pytest.mark.parametrize(names, list(cases.values()), ids=list(cases))


_RNG = torch.Generator().manual_seed(0)  # the module's own: collection leaves torch's seed alone
X = torch.randn(3, 4, 5, generator=_RNG)
TIES = torch.tensor([[1., 3., 3., 2., 3., -0., 0.], [2., 2., 1., 1., 2., 0., -0.]])
NANS = torch.tensor([[1., nan, 3., nan, 3.], [nan, 1., 1., 5., 5.], [2., 2., -inf, inf, 1.]])
INTS = torch.tensor([[3, -1, 7, 7, 0], [-128, 5, 5, 2, 127]], dtype=torch.int64)
INT8 = torch.tensor([[100, 100, 100, -128], [127, 127, 1, -1]], dtype=torch.int8)
BOOLS = torch.tensor([[True, False, True], [False, False, True]])
EMPTY = torch.empty(0, 3)
SCALAR = torch.tensor(2.5)
SORTABLE = torch.cat([TIES, NANS[:2, :2]], 1)
_LINE = torch.linspace(0.1, 0.7, 997)
EDGES = torch.cat([_LINE, torch.nextafter(_LINE, torch.tensor(inf)), torch.nextafter(_LINE, torch.tensor(-inf))])
BF16 = torch.randn(4, 33, generator=_RNG).to(torch.bfloat16)
F64 = torch.randn(4, 6, dtype=torch.float64, generator=_RNG)


@_cases(
    sum=(lambda x: x.sum(), [X]),
    sum_dims_negative_keepdim=(lambda x: x.sum([0, -1], keepdim=True), [X]),
    sum_dtype_float64=(lambda x: x.sum(1, dtype=torch.float64), [X]),
    sum_bool_to_int64=(lambda x: x.sum(), [BOOLS]),
    sum_int8_to_int64=(lambda x: x.sum(0), [INT8]),
    sum_int8_dtype_int8_wraps=(lambda x: x.sum(0, dtype=torch.int8), [INT8]),
    sum_empty=(lambda x: x.sum(), [EMPTY]),
    sum_empty_dim=(lambda x: x.sum(0), [EMPTY]),
    sum_0d_dim0=(lambda x: x.sum(0), [SCALAR]),
    sum_0d_dim_minus1_keepdim=(lambda x: x.sum(-1, keepdim=True), [SCALAR]),
    sum_bfloat16=(lambda x: x.sum(1), [BF16]),
    sum_float64=(lambda x: x.sum(-1), [F64]),
    sum_dim_empty_list=(lambda x: aten.sum.dim_IntList(x, []), [X]),
    nansum=(lambda x: x.nansum(1), [NANS]),
    nansum_int=(lambda x: x.nansum(), [INTS]),
    mean=(lambda x: x.mean(), [X]),
    mean_dims=(lambda x: x.mean([-1, 0], keepdim=True), [X]),
    mean_dtype=(lambda x: x.mean(1, dtype=torch.float64), [X]),
    mean_int_dtype=(lambda x: x.mean(dtype=torch.float32), [INTS]),
    mean_empty_nan=(lambda x: x.mean(), [EMPTY]),
    mean_bfloat16=(lambda x: x.mean(-1), [BF16]),
    prod=(lambda x: x.prod(), [X[0, :2]]),
    prod_dim=(lambda x: x.prod(1, keepdim=True), [X]),
    prod_int=(lambda x: x.prod(1), [INTS]),
    prod_bool=(lambda x: x.prod(0), [BOOLS]),
    prod_empty=(lambda x: x.prod(0), [EMPTY]),
    prod_dtype=(lambda x: x.prod(1, dtype=torch.float64), [INTS]),
    trace=(lambda x: x.trace(), [X[0]]),
    trace_int=(lambda x: x.trace(), [INTS]),
    count_nonzero=(lambda x: torch.count_nonzero(x), [TIES]),
    count_nonzero_dims=(lambda x: torch.count_nonzero(x, (0, -1)), [X.round()]),
    count_nonzero_dim=(lambda x: torch.count_nonzero(x, 1), [NANS]),
    any=(lambda x: x.any(), [TIES]),
    any_dim=(lambda x: x.any(1, keepdim=True), [BOOLS]),
    any_nan_is_true=(lambda x: x.any(0), [NANS * 0]),
    any_dims=(lambda x: x.any((0, -1)), [X > 1]),
    any_no_dims=(lambda x: aten.any.dims(x, []), [INTS]),
    all=(lambda x: x.all(), [BOOLS]),
    all_dim=(lambda x: x.all(-1), [INTS]),
    all_uint8_stays_uint8=(lambda x: x.all(1), [INT8.to(torch.uint8)]),
    all_empty=(lambda x: x.all(), [EMPTY]),
    all_dims=(lambda x: aten.all.dims(x, [0, 1]), [TIES]),
)
def test_sums_means_products(fn, inputs):
    check(fn, *inputs)


@_cases(
    amax_nan=(lambda x: x.amax(1), [NANS]),
    amin_nan=(lambda x: x.amin(0), [NANS]),
    amax_dims_keepdim=(lambda x: x.amax((0, -1), keepdim=True), [X]),
    amax_all=(lambda x: x.amax(), [INTS]),
    amin_bool=(lambda x: x.amin(1), [BOOLS]),
    amax_0d=(lambda x: x.amax(0), [SCALAR]),
    amax_empty_other_dim=(lambda x: x.amax(1), [EMPTY]),
    aminmax=(lambda x: torch.aminmax(x), [NANS]),
    aminmax_dim=(lambda x: torch.aminmax(x, dim=-1, keepdim=True), [INTS]),
    aminmax_keepdim_all=(lambda x: torch.aminmax(x, keepdim=True), [X]),
    max=(lambda x: x.max(), [X]),
    max_nan=(lambda x: x.max(), [NANS]),
    min_int=(lambda x: x.min(), [INTS]),
    max_dim_first_of_ties=(lambda x: x.max(1), [TIES]),
    min_dim_first_of_ties=(lambda x: x.min(1, keepdim=True), [TIES]),
    max_dim_first_nan=(lambda x: x.max(1), [NANS]),
    min_dim_first_nan=(lambda x: x.min(0), [NANS]),
    max_dim_int=(lambda x: x.max(-1), [INT8]),
    max_dim_bool=(lambda x: x.max(0), [BOOLS]),
    max_dim_0d=(lambda x: x.max(-1), [SCALAR]),
    max_dim_empty_other_dim=(lambda x: x.max(1), [EMPTY]),
    argmax_ties=(lambda x: x.argmax(1), [TIES]),
    argmin_ties=(lambda x: x.argmin(1, keepdim=True), [TIES]),
    argmax_nan=(lambda x: x.argmax(1), [NANS]),
    argmin_nan=(lambda x: x.argmin(1), [NANS]),
    argmax_flat=(lambda x: x.argmax(), [NANS]),
    argmax_flat_keepdim=(lambda x: torch.argmax(x, keepdim=True), [TIES]),
    argmin_int=(lambda x: x.argmin(0), [INTS]),
    argmax_0d=(lambda x: x.argmax(0), [SCALAR]),
)
def test_max_min(fn, inputs):
    check(fn, *inputs, exact=True)


@_cases(
    var=(lambda x: x.var(), [X]),
    var_dims=(lambda x: x.var((0, -1), keepdim=True), [X]),
    var_correction0=(lambda x: torch.var(x, 1, correction=0), [X]),
    var_correction2=(lambda x: torch.var(x, 1, correction=2), [F64]),
    var_n_equals_correction_nan=(lambda x: torch.var(x, 1), [X[0, :, :1]]),
    var_n_below_correction_inf=(lambda x: torch.var(x, 1, correction=6), [F64]),
    var_empty_nan=(lambda x: x.var(0), [EMPTY]),
    var_complex=(lambda x: x.var(0), [torch.randn(4, 3, dtype=torch.complex64, generator=_RNG)]),
    var_bfloat16=(lambda x: x.var(1), [BF16]),
    var_0d=(lambda x: x.var(0, correction=0), [SCALAR]),
    std=(lambda x: x.std(1), [X]),
    std_unbiased_false=(lambda x: x.std(-1, unbiased=False, keepdim=True), [X]),
    var_mean=(lambda x: torch.var_mean(x, 1), [X]),
    var_mean_keepdim=(lambda x: torch.var_mean(x, (0, 2), keepdim=True, correction=0), [X]),
    std_mean=(lambda x: torch.std_mean(x), [F64]),
    std_mean_complex=(lambda x: torch.std_mean(x, 1), [torch.randn(4, 3, dtype=torch.complex64, generator=_RNG)]),
    logsumexp=(lambda x: torch.logsumexp(x, 1), [X]),
    logsumexp_dims_keepdim=(lambda x: torch.logsumexp(x, (0, -1), keepdim=True), [X]),
    logsumexp_infinities=(lambda x: torch.logsumexp(x, 1), [torch.tensor([[inf, 1.], [-inf, -inf], [inf, -inf], [nan, 1.]])]),
    logsumexp_int=(lambda x: torch.logsumexp(x, 1), [INTS[:, :3]]),
    logsumexp_empty=(lambda x: torch.logsumexp(x, 0), [EMPTY]),
    logsumexp_large=(lambda x: torch.logsumexp(x, 1), [X * 1e4]),
    vector_norm=(lambda x: torch.linalg.vector_norm(x), [X]),
    vector_norm_1=(lambda x: torch.linalg.vector_norm(x, 1, dim=(0, -1)), [X]),
    vector_norm_3=(lambda x: torch.linalg.vector_norm(x, 3, dim=-1), [X]),
    vector_norm_minus_1=(lambda x: torch.linalg.vector_norm(x, -1), [TIES]),
    vector_norm_half=(lambda x: torch.linalg.vector_norm(x, 0.5, dim=(1, 2)), [X]),
    vector_norm_inf=(lambda x: torch.linalg.vector_norm(x, -inf, dim=1, keepdim=True), [X]),
    vector_norm_zero=(lambda x: torch.linalg.vector_norm(x, 0, dim=1), [TIES]),
    vector_norm_bfloat16=(lambda x: torch.linalg.vector_norm(x, dim=1), [BF16]),
    vector_norm_dtype=(lambda x: torch.linalg.vector_norm(x, dtype=torch.float64), [X]),
)
def test_statistics(fn, inputs):
    check(fn, *inputs)


@_cases(
    cumsum=(lambda x: x.cumsum(1), [X]),
    cumsum_int_to_int64=(lambda x: x.cumsum(-1), [INT8]),
    cumsum_bool=(lambda x: x.cumsum(0), [BOOLS]),
    cumsum_dtype=(lambda x: x.cumsum(1, dtype=torch.float64), [INTS]),
    cumsum_0d=(lambda x: x.cumsum(0), [SCALAR]),
    cumsum_empty=(lambda x: x.cumsum(0), [EMPTY]),
    cumsum_bfloat16=(lambda x: x.cumsum(1), [BF16]),
    cumprod=(lambda x: x.cumprod(-1), [X]),
    cumprod_int=(lambda x: x.cumprod(1), [INTS]),
    cumprod_dtype=(lambda x: x.cumprod(0, dtype=torch.float64), [X]),
    logcumsumexp=(lambda x: torch.logcumsumexp(x, 1), [X]),
    logcumsumexp_infinities=(lambda x: torch.logcumsumexp(x, 1), [torch.tensor([[-inf, -inf, 0., inf, 1., nan, 2.]])]),
    logcumsumexp_0d=(lambda x: torch.logcumsumexp(x, -1), [SCALAR]),
)
def test_cumulative(fn, inputs):
    check(fn, *inputs)


@_cases(
    cummax_last_of_ties=(lambda x: torch.cummax(x, 1), [TIES]),
    cummin_last_of_ties=(lambda x: torch.cummin(x, 1), [TIES]),
    cummax_nan=(lambda x: torch.cummax(x, 1), [torch.tensor([[1., 3., 3., 2., 3., nan, 1., nan, 5.]])]),
    cummin_nan=(lambda x: torch.cummin(x, -1), [torch.tensor([[3., 1., 1., 2., 1., nan, 1., nan, 0.]])]),
    cummax_int=(lambda x: torch.cummax(x, 1), [INTS]),
    cummin_int_dim0=(lambda x: torch.cummin(x, 0), [INT8]),
    cummax_bool=(lambda x: torch.cummax(x, 1), [BOOLS]),
    cummax_0d=(lambda x: torch.cummax(x, 0), [SCALAR]),
    cummin_empty=(lambda x: torch.cummin(x, 0), [EMPTY]),
    cummax_long=(lambda x: torch.cummax(x, 0), [torch.randint(0, 4, (40, 3), generator=_RNG).float()]),
    sort=(lambda x: x.sort(), [X]),
    sort_ties_nan_zeros=(lambda x: x.sort(1), [SORTABLE]),
    sort_descending=(lambda x: x.sort(1, descending=True), [SORTABLE]),
    sort_stable=(lambda x: x.sort(stable=True, dim=0), [torch.randint(0, 3, (30, 2), generator=_RNG).float()]),
    sort_stable_descending=(lambda x: x.sort(stable=True, dim=0, descending=True),
                            [torch.randint(0, 3, (30, 2), generator=_RNG).float()]),
    sort_nan_descending=(lambda x: x.sort(1, descending=True), [NANS]),
    sort_int8_extremes=(lambda x: x.sort(1, descending=True), [INT8]),
    sort_int=(lambda x: x.sort(0), [INTS]),
    sort_bool=(lambda x: x.sort(1), [BOOLS]),
    sort_0d=(lambda x: x.sort(0), [SCALAR]),
    sort_empty=(lambda x: x.sort(0), [EMPTY]),
    sort_bfloat16=(lambda x: x.sort(1), [BF16]),
    argsort=(lambda x: x.argsort(1), [TIES]),
    argsort_stable_descending=(lambda x: torch.argsort(x, dim=1, descending=True, stable=True), [NANS]),
    msort=(lambda x: torch.msort(x), [NANS]),
)
def test_scans_and_sorts(fn, inputs):
    check(fn, *inputs, exact=True)


@_cases(
    topk=(lambda x: x.topk(3), [X], 2),
    topk_smallest=(lambda x: x.topk(2, 1, largest=False), [X], 1),
    topk_nan_is_largest=(lambda x: x.topk(3, 1), [NANS], 1),
    topk_nan_smallest=(lambda x: x.topk(4, 1, largest=False), [NANS], 1),
    topk_ties=(lambda x: x.topk(4, 1), [TIES], 1),
    topk_int=(lambda x: x.topk(2, 0), [INTS], 0),
    topk_0d=(lambda x: x.topk(1, 0), [SCALAR], 0),
    topk_k0=(lambda x: x.topk(0, 0), [EMPTY], 0),
    kthvalue=(lambda x: x.kthvalue(2, 1), [X], 1),
    kthvalue_ties=(lambda x: x.kthvalue(3, 1, keepdim=True), [TIES], 1),
    kthvalue_nan=(lambda x: x.kthvalue(4, 1), [NANS], 1),
    kthvalue_0d=(lambda x: x.kthvalue(1, 0), [SCALAR], 0),
    median_dim=(lambda x: x.median(1), [X[0]], 1),
    median_dim_even_ties=(lambda x: x.median(1, keepdim=True), [TIES[:, :6]], 1),
    median_dim_int=(lambda x: x.median(1), [INTS], 1),
    nanmedian_dim=(lambda x: x.nanmedian(1), [torch.cat([NANS, torch.full((1, 5), nan)])], 1),
    nanmedian_dim_ties=(lambda x: x.nanmedian(0), [TIES], 0),
)
def test_selection(fn, inputs, dim):
    check(fn, *inputs, exact=True, index_of=(inputs[0], dim))


@_cases(
    median=(lambda x: x.median(), [X]),
    median_even=(lambda x: x.median(), [TIES]),
    median_nan=(lambda x: x.median(), [NANS]),
    median_int=(lambda x: x.median(), [INTS]),
    median_empty=(lambda x: x.median(), [EMPTY]),
    median_dim_nan_first_index=(lambda x: x.median(1), [NANS]),
    nanmedian=(lambda x: x.nanmedian(), [NANS]),
    nanmedian_all_nan=(lambda x: x.nanmedian(), [torch.full((3,), nan)]),
    nanmedian_dim_all_nan=(lambda x: x.nanmedian(1), [torch.full((2, 3), nan)]),
    median_dim_0d=(lambda x: x.median(0), [SCALAR]),
    mode=(lambda x: x.mode(1), [TIES]),
    mode_nan=(lambda x: x.mode(1), [torch.tensor([[1., nan, 1.], [nan, nan, 1.], [nan, 2., 1.]])]),
    mode_int=(lambda x: x.mode(0, keepdim=True), [torch.randint(0, 3, (16, 5), generator=_RNG)]),
    mode_random=(lambda x: x.mode(1), [torch.tensor([0., 1., 2., nan, -1.])[torch.randint(0, 5, (200, 16), generator=_RNG)]]),
    mode_bool=(lambda x: x.mode(1), [BOOLS]),
    mode_0d=(lambda x: x.mode(0), [SCALAR]),
    histc=(lambda x: torch.histc(x, bins=7), [X]),
    histc_range=(lambda x: torch.histc(x, bins=4, min=-1, max=1), [torch.tensor([-2., -1., -0.5, 0., 0.5, 1., 2., nan])]),
    histc_constant=(lambda x: torch.histc(x, bins=5), [torch.full((4,), 3.)]),
    histc_equal_min_max=(lambda x: torch.histc(x, bins=3, min=2, max=2), [torch.tensor([1., 2., 3., 4.])]),
    histc_float64=(lambda x: torch.histc(x, bins=10, min=-2, max=2), [F64]),
    histc_empty=(lambda x: torch.histc(x, bins=3), [EMPTY]),
    # (x - min) * bins / (max - min) rounds as eager's: elements next to an edge stay in their bin
    histc_bin_edges=(lambda x: torch.histc(x, bins=3, min=0.1, max=0.7), [EDGES]),
    histc_bin_edges_data_range=(lambda x: torch.histc(x, bins=3), [EDGES]),
)
def test_medians_modes_histograms(fn, inputs):
    check(fn, *inputs, exact=True)


@pytest.mark.parametrize("dtype, bins, low, high", [
    (dtype, *bounds) for dtype in (torch.int32, torch.int64, torch.uint8)
    for bounds in ((4, 0, 3), (4, 0, 4), (3, 2, 2), (5, 0, 0), (3, -2, 7))
    if dtype is not torch.uint8 or bounds[1] >= 0])  # eager: a negative uint8 bound overflows
def test_integer_histc_counts_as_cuda(dtype, bins, low, high):
    """Eager CPU has no integer histc; CUDA's, which transformers' MoE layers call on an
    accelerator, bins in integer arithmetic, as a float histc of the same small values does."""
    x = torch.tensor([0, 1, 2, 2, 3, 3, 3, 4, 7, 9] + ([] if dtype is torch.uint8 else [-3, -2]), dtype=dtype)
    with pytest.raises(RuntimeError, match="not implemented for"):
        torch.histc(x, bins=bins, min=low, max=high)
    want = torch.histc(x.double(), bins=bins, min=low, max=high).to(dtype)
    _same(_on_device(lambda t: torch.histc(t, bins=bins, min=low, max=high), [x]), want, exact=True)


@_cases(
    max_of_empty=(lambda x: x.max(), [EMPTY]),
    max_dim_of_zero_size=(lambda x: x.max(0), [EMPTY]),
    min_dim_of_zero_size=(lambda x: x.min(0), [EMPTY]),
    median_dim_of_zero_size=(lambda x: x.median(0), [EMPTY]),
    mode_dim_of_zero_size=(lambda x: x.mode(0), [EMPTY]),
    amax_complex=(lambda x: x.amax(0), [X[0].to(torch.complex64)]),
    max_dim_complex=(lambda x: x.max(0), [X[0].to(torch.complex64)]),
    sort_complex=(lambda x: x.sort(), [X[0].to(torch.complex64)]),
    argmax_bool=(lambda x: x.argmax(1), [BOOLS]),
    topk_bool=(lambda x: x.topk(1), [BOOLS]),
    median_bool=(lambda x: x.median(), [BOOLS]),
    var_int=(lambda x: aten.var.correction(x, [1]), [INTS]),
    trace_bool=(lambda x: x.trace(), [BOOLS]),
    nansum_complex=(lambda x: x.nansum(), [X[0].to(torch.complex64)]),
    logcumsumexp_int=(lambda x: torch.logcumsumexp(x, 0), [INTS]),
    logsumexp_no_dims=(lambda x: torch.logsumexp(x, []), [X]),
)
def test_eager_raises(fn, inputs):
    """The meta kernel accepts these (an empty dimension, a dtype), eager
    refuses them: the lowering sends the call to eager, which raises its own
    error, and the op stays lowered for the calls it takes."""
    with pytest.raises((RuntimeError, IndexError)) as eager:
        fn(*inputs)
    failed = set(verdicts.FAILED)
    with pytest.raises(RuntimeError) as lazy:
        _on_device(fn, inputs, strict=False)
    assert str(eager.value).splitlines()[0] in str(lazy.value)
    assert verdicts.FAILED == failed  # NeedsEager: this call only


@pytest.mark.parametrize("op", [lambda x: x.amax(), lambda x: x.argmax(0), lambda x: torch.aminmax(x)])
def test_meta_kernel_raises_on_empty_reductions(op):
    with pytest.raises((RuntimeError, IndexError)):
        op(EMPTY)
    with pytest.raises((RuntimeError, IndexError)):
        _on_device(op, [EMPTY], strict=True)


def test_mode_beyond_insertion_sort_runs_eagerly():
    """Past 16 values eager's std::sort is an introsort: its order of equal
    values, and so the index mode returns, is eager's alone."""
    x = torch.randint(0, 3, (4, 40), generator=_RNG).float()
    before = xlakit.metrics()["fallbacks"]
    check(lambda t: t.mode(1), x, exact=True, strict=False)
    assert xlakit.metrics()["fallbacks"] > before


def test_quantile_and_nanmedian_compose():
    """Composite ops over these lowerings (quantile sorts; nanmean sums)."""
    x = torch.randn(5, 7, generator=_RNG)
    x[1, 2] = nan
    check(lambda t: torch.quantile(t[0], 0.3), x, strict=False)
    check(lambda t: torch.nanquantile(t, 0.75, dim=1), x, strict=False)
    check(lambda t: torch.nanmean(t, 1), x, strict=False)


def test_a_wrong_lowering_fails_this_file(monkeypatch):
    """The checks catch a lowering that is off: a cummax that takes the first
    of equal values (as max.dim does) where eager takes the last."""
    import jax.numpy as jnp
    from jax import lax

    from xlakit import lowerings
    from xlakit.lowerings import to_jax

    def first_of_ties(self, dim):
        index = lax.broadcasted_iota(jnp.int64, self.shape, dim)

        def combine(a, b):
            later_wins = b[0] > a[0]
            return jnp.where(later_wins, b[0], a[0]), jnp.where(later_wins, b[1], a[1])
        return lax.associative_scan(combine, (self, index), axis=dim)

    monkeypatch.setitem(lowerings.TABLE, "aten::cummax", lowerings.Entry(lowering=lowerings.Lowering(first_of_ties)))
    # executables are cached by graph: a key of their own for the broken lowering's
    monkeypatch.setattr(to_jax, "LOWERING_VERSION", "broken cummax")
    x = TIES
    with pytest.raises(AssertionError):
        check(lambda t: torch.cummax(t, 1), x, exact=True)
    monkeypatch.undo()
    check(lambda t: torch.cummax(t, 1), x, exact=True)
