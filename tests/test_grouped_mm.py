"""`torch._grouped_mm` (mixture-of-experts layers' grouped products, lowerings/grouped_mm.py)
against eager: eager CPU's own kernel and a per-group loop of `a[start:end] @ b[g]`, in
float32, bfloat16 and float16, forward and backward, random group sizes with empty groups,
every layout of `offs`; a new routing reuses the executable; bad offsets raise."""
import pytest
import torch

import xlakit
from conftest import assert_same
from xlakit.analysis import flops

GROUPS, M, K, N = 4, 24, 16, 8   # K and N multiples of 8: eager's kernel wants 16-byte strides
# float16 / bfloat16: both accumulate in float32 and round once, but in another order: 1 ulp apart
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5),
       **{d: dict(rtol=torch.finfo(d).eps, atol=torch.finfo(d).eps) for d in (torch.bfloat16, torch.float16)}}


def _offsets(total: int, seed: int) -> torch.Tensor:
    """Cumulative group ends over `total` rows: random sizes, one group always empty."""
    torch.manual_seed(seed)
    cuts = torch.randint(0, total + 1, (GROUPS - 1,)).sort().values
    ends = torch.cat([cuts, torch.tensor([total])])
    empty = seed % (GROUPS - 1)  # not the last group: its end is `total`
    ends[empty] = ends[empty - 1] if empty else 0
    return ends.to(torch.int32)


def _per_group(a, b, offs):
    """The ground truth, one plain product per group (zeros where eager leaves rows unwritten)."""
    starts = [0, *offs[:-1].tolist()]
    ends = offs.tolist()
    if a.dim() == 2 and b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2], dtype=a.dtype)
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[s:e] = a[s:e] @ b[g]
        return out
    if a.dim() == 2:  # 2-D x 2-D: the contracted dimension is grouped
        return torch.stack([a[:, s:e] @ b[s:e] for s, e in zip(starts, ends)])
    out = torch.zeros(a.shape[1], b.shape[1], dtype=a.dtype)  # 3-D x 2-D: columns of b grouped
    for g, (s, e) in enumerate(zip(starts, ends)):
        out[:, s:e] = a[g] @ b[:, s:e]
    return out


# layout -> (shape of a, shape of b, length of the grouped dimension); None: 3-D x 3-D, no offs
LAYOUTS = {"2d_3d": ((M, K), (GROUPS, K, N), M), "2d_2d": ((N, M), (M, K), M),
           "3d_2d": ((GROUPS, N, K), (K, M), M), "3d_3d": ((GROUPS, N, K), (GROUPS, K, N), None)}


def _case(layout, dtype, seed):
    a_shape, b_shape, grouped = LAYOUTS[layout]
    torch.manual_seed(seed)
    a, b = torch.randn(a_shape, dtype=dtype), torch.randn(b_shape, dtype=dtype)
    return a, b, None if grouped is None else _offsets(grouped, seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_forward_and_backward_equal_eager(dev, layout, dtype):
    a, b, offs = _case(layout, dtype, seed=3)
    eager_a, eager_b = a.clone().requires_grad_(), b.clone().requires_grad_()
    want = torch._grouped_mm(eager_a, eager_b, offs=offs)
    grad = torch.randn(want.shape, dtype=dtype)
    want.backward(grad)
    lazy_a, lazy_b = a.to(dev).requires_grad_(), b.to(dev).requires_grad_()
    got = torch._grouped_mm(lazy_a, lazy_b, offs=None if offs is None else offs.to(dev))
    got.backward(grad.to(dev))
    assert_same(got, want.detach(), **TOL[dtype])
    assert_same(lazy_a.grad, eager_a.grad, **TOL[dtype])
    assert_same(lazy_b.grad, eager_b.grad, **TOL[dtype])
    if offs is not None:  # eager's kernel is the per-group products
        assert_same(got, _per_group(a, b, offs), **TOL[dtype])
    assert xlakit.metrics()["fallbacks"] == 0


def test_transformers_layout_a_transposed_weight_and_grouped_mm(dev):
    # transformers passes weight.transpose(-2, -1) of (experts, out, in) weights; torch 2.10+
    # calls the same op through torch.nn.functional.grouped_mm
    a, _, offs = _case("2d_3d", torch.float32, seed=5)
    weight = torch.randn(GROUPS, N, K)
    grouped_mm = getattr(torch.nn.functional, "grouped_mm", torch._grouped_mm)
    got = grouped_mm(a.to(dev), weight.to(dev).transpose(-2, -1), offs=offs.to(dev))
    assert_same(got, _per_group(a, weight.transpose(-2, -1), offs), **TOL[torch.float32])


def test_a_new_routing_reuses_the_executable(dev):
    a, b, _ = _case("2d_3d", torch.float32, seed=1)
    lazy_a, lazy_b = a.to(dev), b.to(dev)
    with xlakit.capture() as steps:
        for seed in (1, 2, 4):
            offs = _offsets(M, seed)
            got = torch._grouped_mm(lazy_a, lazy_b, offs=offs.to(dev))
            xlakit.mark_step()
            assert_same(got, _per_group(a, b, offs), **TOL[torch.float32])
    assert [r.cache for r in steps if r.trigger == "mark_step"][1:] == ["hit", "hit"]


def test_rows_past_the_last_offset_are_zero(dev):
    a, b, _ = _case("2d_3d", torch.float32, seed=1)
    offs = torch.tensor([3, 3, 10, 20], dtype=torch.int32)
    got = torch._grouped_mm(a.to(dev), b.to(dev), offs=offs.to(dev)).cpu()
    assert_same(got[:20], torch._grouped_mm(a, b, offs=offs)[:20], **TOL[torch.float32])
    assert not got[20:].any()  # eager leaves them unwritten


@pytest.mark.parametrize("offs, bad", [([4, 2, 20, 24], 2), ([4, 8, 20, 25], 25), ([-1, 8, 20, 24], -1)])
def test_bad_offsets_raise_with_the_line(dev, offs, bad):
    # eager's kernel reads out of bounds; here the step's executable checks them
    a, b, _ = _case("2d_3d", torch.float32, seed=1)
    out = torch._grouped_mm(a.to(dev), b.to(dev), offs=torch.tensor(offs, dtype=torch.int32).to(dev))
    with pytest.raises(RuntimeError, match=rf"non-decreasing group ends within the grouped dimension of size {M}; "
                                           rf"got {bad}.*test_grouped_mm.py:\d+.*_grouped_mm"):
        xlakit.mark_step()
    with pytest.raises(RuntimeError, match="could not be computed"):
        out.cpu()


@pytest.mark.parametrize("change, message", [
    (dict(offs=lambda o: o.long()), "Offsets have to be int32"),
    (dict(b=lambda b: b.bfloat16()), "expected m1 and m2 to have the same dtype"),
    (dict(b=lambda b: b.double()), "Expected mat_b to be Float32, BFloat16 or Float16 matrix"),
    (dict(a=lambda a: a.int(), b=lambda b: b.int()), "Expected mat_a to be Float32, BFloat16 or Float16 matrix"),
    (dict(a=lambda a: a[:, :8]), "contraction dimension of mat_a and mat_b must match"),
    (dict(offs=lambda o: o[:2]), "matrix batch sizes have to match"),
])
def test_bad_arguments_raise_eagers_error_at_the_line(dev, change, message):
    a, b, offs = _case("2d_3d", torch.float32, seed=1)
    a, b, offs = (change.get(name, lambda x: x)(x) for name, x in (("a", a), ("b", b), ("offs", offs)))
    with pytest.raises(RuntimeError, match=message):
        torch._grouped_mm(a, b, offs=offs)
    with pytest.raises(RuntimeError, match=rf"_grouped_mm.*{message}.*test_grouped_mm.py:\d+"):
        torch._grouped_mm(a.to(dev), b.to(dev), offs=offs.to(dev))


def test_flops_are_the_groups_products_whatever_their_sizes(dev):
    # forward (2-D x 3-D) and both gradients (2-D x 3-D, 2-D x 2-D): 2·M·K·N each
    a, b, offs = _case("2d_3d", torch.float32, seed=2)
    lazy_a, lazy_b = a.to(dev).requires_grad_(), b.to(dev).requires_grad_()
    torch._grouped_mm(lazy_a, lazy_b, offs=offs.to(dev)).square().sum().backward()
    xlakit.mark_step()
    graph = xlakit.last_step().graph
    counted = [flops.node_flops(graph, n) for n in graph.nodes if "_grouped_mm" in n.op]
    assert counted == [2 * M * K * N] * 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transformers_grouped_mm_ops_equal_their_own_kernels(dev, dtype):
    # what transformers' MoE layers call under torch.compile for weights not in bfloat16 (and
    # its backward): lowered, not run eagerly; rows past the last group's end and an empty
    # group's gradient are zero, as the ops' own loops leave them
    moe = pytest.importorskip("transformers.integrations.moe")  # noqa: F841 - defines the ops
    ops = torch.ops.transformers
    a, b, offs = _case("2d_3d", dtype, seed=5)
    offs[-1] = M - 3
    grad = torch.randn(M, N, dtype=dtype)
    with xlakit.capture() as steps:
        got = ops.grouped_mm_fallback(a.to(dev), b.to(dev), offs.to(dev))
        grads = ops.grouped_mm_fallback_backward(a.to(dev), b.to(dev), offs.to(dev), grad.to(dev))
        assert_same(got, ops.grouped_mm_fallback(a, b, offs), **TOL[dtype])
        for mine, eagers in zip(grads, ops.grouped_mm_fallback_backward(a, b, offs, grad)):
            assert_same(mine, eagers, **TOL[dtype])
    assert steps and all(str(r.trigger) == "cpu" for r in steps)  # the reads; no eager fallback
