"""The nn family of the lowering table (xlakit/lowerings/nn.py) against eager
torch: each case calls aten ops directly, so only the op under test is
recorded, and must lower (no fallback to eager CPU); forward and backward
ops, values, dtypes and shapes."""
import math

import pytest
import torch

import xlakit
from conftest import assert_same

aten = torch.ops.aten


def _seeded(shape, dtype=torch.float32, *, nan_at=None):
    torch.manual_seed(sum(shape) + len(shape))
    x = torch.randn(shape, dtype=dtype)
    if nan_at is not None:
        x.view(-1)[list(nan_at)] = float("nan")
    return x


def _layer_norm_backward_case(shape, normalized, affine, mask, transposed_grad=False):
    x = _seeded(shape)
    w, b = (_seeded(tuple(normalized)), _seeded(tuple(normalized)) * 0.5) if affine else (None, None)
    _, mean, rstd = aten.native_layer_norm(x, normalized, w, b, 1e-5)
    grad = _seeded(shape[::-1]).T if transposed_grad else _seeded(shape) * 0.7
    return aten.native_layer_norm_backward.default, (grad, x, normalized, mean, rstd, w, b, mask)


def _group_norm_backward_case(shape, group, affine, mask):
    n, c = shape[:2]
    hxw = math.prod(shape[2:])
    x, w = _seeded(shape) * 2 + 1, _seeded((c,)) if affine else None
    _, mean, rstd = aten.native_group_norm(x, w, None, n, c, hxw, group, 1e-5)
    return aten.native_group_norm_backward.default, (_seeded(shape) * 0.7, x, mean, rstd, w, n, c, hxw, group, mask)


def _batch_norm_backward_case(shape, train, affine, mask):
    c = shape[1]
    x, w = _seeded(shape) * 2 + 1, _seeded((c,)) if affine else None
    running_mean, running_var = _seeded((c,)) * 0.1, _seeded((c,)).abs() + 0.5
    _, save_mean, save_invstd = aten.native_batch_norm(x, w, None, running_mean.clone(), running_var.clone(),
                                                       train, 0.1, 1e-5)
    return aten.native_batch_norm_backward.default, (_seeded(shape) * 0.7, x, w, running_mean, running_var,
                                                     save_mean, save_invstd, train, 1e-5, mask)


def _batch_norm_functional_case(shape, train, affine):
    c = shape[1]
    weight, bias = (_seeded((c,)), _seeded((c + 1,))[1:]) if affine else (None, None)
    return aten._native_batch_norm_legit_functional.default, (
        _seeded(shape) * 2 + 1, weight, bias, _seeded((c,)) * 0.1, _seeded((c,)).abs() + 0.5, train, 0.1, 1e-5)


# name -> (op, eager arguments): the op runs on these and on their lazy copies
def _conv_case(x_shape, w_shape, bias, stride, padding, dilation, transposed, output_padding, groups):
    x, w = _seeded(x_shape), _seeded(w_shape)
    b = _seeded((w_shape[1] * groups if transposed else w_shape[0],)) if bias else None
    return aten.convolution.default, (x, w, b, stride, padding, dilation, transposed, output_padding, groups)


def _conv_backward_case(x_shape, w_shape, bias, stride, padding, dilation, transposed, output_padding, groups):
    _, (x, w, b, *rest) = _conv_case(x_shape, w_shape, bias, stride, padding, dilation, transposed,
                                     output_padding, groups)
    out = aten.convolution(x, w, b, *rest)
    grad = _seeded(tuple(out.shape))
    bias_sizes = list(b.shape) if bias else None
    return aten.convolution_backward.default, (grad, x, w, bias_sizes, *rest, [True, True, bias])


def _with_indices_backward(pool, backward, x, *args, pool_args_in_backward=True):
    out, indices = pool(x, *args)
    return backward, (_seeded(tuple(out.shape)), x, *(args if pool_args_in_backward else ()), indices)


_WINDOWS = _seeded((2, 3, 7, 8), nan_at=(5, 6, 40, 41))

CASES = {
    # convolutions: strided, dilated, grouped, transposed with output_padding, without bias
    "conv2d_grouped_dilated": lambda: _conv_case((2, 4, 9, 9), (6, 2, 3, 3), True, [2, 2], [1, 1], [2, 2],
                                                 False, [0, 0], 2),
    "conv1d_no_bias": lambda: _conv_case((2, 3, 10), (4, 3, 3), False, [3], [2], [1], False, [0], 1),
    "conv3d": lambda: _conv_case((1, 2, 5, 6, 5), (4, 2, 2, 3, 2), True, [1, 2, 1], [1, 0, 1], [1, 1, 2],
                                 False, [0, 0, 0], 1),
    "conv_transpose2d_grouped": lambda: _conv_case((2, 4, 5, 4), (4, 3, 3, 2), True, [3, 2], [2, 1], [2, 1],
                                                   True, [1, 1], 2),
    "conv_transpose1d_padding_over_kernel": lambda: _conv_case((2, 4, 7), (4, 2, 3), False, [2], [3], [1],
                                                               True, [1], 1),
    "conv_transpose3d": lambda: _conv_case((1, 2, 3, 4, 3), (2, 3, 2, 2, 3), True, [2, 1, 2], [0, 1, 1],
                                           [1, 1, 1], True, [1, 0, 1], 1),
    "conv_backward_grouped": lambda: _conv_backward_case((2, 4, 9, 9), (6, 2, 3, 3), True, [2, 2], [1, 1],
                                                         [2, 2], False, [0, 0], 2),
    "conv_backward_transposed_grouped": lambda: _conv_backward_case(
        (2, 4, 5, 4), (4, 3, 3, 2), True, [3, 2], [2, 1], [2, 1], True, [1, 1], 2),
    "conv_backward_transposed_no_bias": lambda: _conv_backward_case(
        (2, 4, 7), (4, 2, 3), False, [2], [3], [1], True, [1], 1),
    # max pooling: values and torch's flat indices (NaN windows, ceil_mode, padding, dilation)
    "max_pool2d_ceil_nan": lambda: (aten.max_pool2d_with_indices.default,
                                    (_WINDOWS, [3, 2], [2, 3], [1, 1], [1, 1], True)),
    "max_pool2d_dilated": lambda: (aten.max_pool2d_with_indices.default,
                                   (_WINDOWS, [2, 3], [1, 2], [1, 0], [2, 2], False)),
    "max_pool2d_ties": lambda: (aten.max_pool2d_with_indices.default,
                                (torch.tensor([[[[1., 3, 3], [3, 0, 3], [-torch.inf, 3, 3]]]]), [2, 2], [1, 1])),
    "max_pool3d_ceil": lambda: (aten.max_pool3d_with_indices.default,
                                (_seeded((1, 2, 5, 6, 7)), [2, 3, 2], [2, 2, 2], [1, 1, 0], [1, 1, 1], True)),
    "max_pool2d_backward": lambda: _with_indices_backward(
        aten.max_pool2d_with_indices.default, aten.max_pool2d_with_indices_backward.default,
        _seeded((2, 3, 9, 9)), [3, 3], [2, 2], [1, 1], [1, 1], True),
    "max_pool3d_backward": lambda: _with_indices_backward(
        aten.max_pool3d_with_indices.default, aten.max_pool3d_with_indices_backward.default,
        _seeded((1, 2, 5, 6, 7)), [2, 3, 2], [2, 2, 1], [1, 1, 0], [1, 1, 1], True),
    "adaptive_max_pool2d": lambda: (aten.adaptive_max_pool2d.default, (_WINDOWS, [3, 5])),
    "adaptive_max_pool2d_backward": lambda: _with_indices_backward(
        aten.adaptive_max_pool2d.default, aten.adaptive_max_pool2d_backward.default, _seeded((2, 3, 7, 8)), [3, 5],
        pool_args_in_backward=False),
    # average pooling: count_include_pad, ceil_mode, divisor_override
    "avg_pool2d_count_include_pad": lambda: (aten.avg_pool2d.default,
                                             (_seeded((2, 3, 9, 8)), [3, 3], [2, 2], [1, 1], True, True)),
    "avg_pool2d_exclude_pad": lambda: (aten.avg_pool2d.default,
                                       (_seeded((2, 3, 9, 8)), [3, 3], [2, 2], [1, 1], True, False)),
    "avg_pool2d_divisor": lambda: (aten.avg_pool2d.default,
                                   (_seeded((2, 3, 9, 8)), [3, 2], [2, 1], [1, 0], False, True, 5)),
    "avg_pool3d_exclude_pad": lambda: (aten.avg_pool3d.default,
                                       (_seeded((1, 2, 5, 6, 7)), [2, 3, 2], [2, 2, 2], [1, 1, 1], True, False)),
    "avg_pool2d_backward": lambda: (aten.avg_pool2d_backward.default,
                                    (_seeded((2, 3, 5, 5)), _seeded((2, 3, 9, 8)), [3, 3], [2, 2], [1, 1], True,
                                     False, None)),
    "adaptive_avg_pool3d": lambda: (aten._adaptive_avg_pool3d.default, (_seeded((2, 3, 5, 7, 6)), [2, 3, 4])),
    "adaptive_avg_pool2d_backward": lambda: (aten._adaptive_avg_pool2d_backward.default,
                                             (_seeded((2, 3, 4, 3)), _seeded((2, 3, 9, 7)))),
    # softmax family and normalization
    "log_softmax": lambda: (aten._log_softmax.default, (_seeded((3, 5, 4)), 1, False)),
    "softmax_backward": lambda: (aten._softmax_backward_data.default,
                                 (_seeded((3, 5)), torch.softmax(_seeded((4, 5)), 0)[:3], 1, torch.float32)),
    "log_softmax_backward": lambda: (aten._log_softmax_backward_data.default,
                                     (_seeded((3, 5)), torch.log_softmax(_seeded((3, 6)), 1)[:, :5], 1,
                                      torch.float32)),
    "safe_softmax_masked_row": lambda: (aten._safe_softmax.default,
                                        (torch.tensor([[0., 1, -torch.inf], [-torch.inf] * 3]), -1)),
    "safe_softmax_inf_nan_rows": lambda: (aten._safe_softmax.default, (torch.tensor(
        [[torch.inf, 0., 1], [torch.nan, 0, 1], [-torch.inf, -torch.inf, 2], [torch.inf, -torch.inf, 0]]), -1)),
    "safe_softmax_masked_column_bf16_to_f32": lambda: (aten._safe_softmax.default, (torch.tensor(
        [[-torch.inf, 0.5, -3], [-torch.inf, -torch.inf, 7]], dtype=torch.bfloat16), 0, torch.float32)),
    "safe_softmax_0d_masked": lambda: (aten._safe_softmax.default, (torch.tensor(-torch.inf), 0)),
    "safe_softmax_0d": lambda: (aten._safe_softmax.default, (torch.tensor(2.5), 0)),
    "native_layer_norm": lambda: (aten.native_layer_norm.default,
                                  (_seeded((2, 3, 4, 5)), [4, 5], _seeded((4, 5)), _seeded((5, 4)).T, 1e-5)),
    "native_group_norm": lambda: (aten.native_group_norm.default,
                                  (_seeded((2, 6, 4, 5)), _seeded((6,)), None, 2, 6, 20, 3, 1e-5)),
    # the norms' backward ops: affine or not, each output asked for or not, a transposed gradient
    "layer_norm_backward": lambda: _layer_norm_backward_case((2, 3, 4, 5), [4, 5], True, [True, True, True]),
    "layer_norm_backward_plain_input_only": lambda: _layer_norm_backward_case((6, 8), [8], False,
                                                                              [True, False, False]),
    "layer_norm_backward_params_only_transposed": lambda: _layer_norm_backward_case(
        (5, 7), [7], True, [False, True, True], transposed_grad=True),
    "layer_norm_backward_whole_tensor": lambda: _layer_norm_backward_case((3, 4), [3, 4], True,
                                                                          [True, True, False]),
    "group_norm_backward": lambda: _group_norm_backward_case((2, 6, 4, 5), 3, True, [True, True, True]),
    # (eager CPU's kernel fails without weight where a parameter's gradient is asked for)
    "group_norm_backward_plain": lambda: _group_norm_backward_case((3, 4, 7), 2, False, [True, False, False]),
    "group_norm_backward_no_weight_grad": lambda: _group_norm_backward_case((2, 4, 3, 3), 4, True,
                                                                            [True, False, True]),
    "batch_norm_backward_train": lambda: _batch_norm_backward_case((4, 3, 5, 2), True, True, [True, True, True]),
    "batch_norm_backward_train_2d_plain": lambda: _batch_norm_backward_case((6, 4), True, False,
                                                                            [True, False, False]),
    "batch_norm_backward_eval": lambda: _batch_norm_backward_case((4, 3, 5), False, True, [True, True, True]),
    # batch norm itself: the batch's statistics and the running ones moved (training), or the running
    # ones read and the saved ones empty, as eager CPU returns them (eval)
    "batch_norm_functional_train": lambda: _batch_norm_functional_case((4, 3, 5, 2), True, True),
    "batch_norm_functional_train_2d_plain": lambda: _batch_norm_functional_case((6, 4), True, False),
    "batch_norm_functional_eval": lambda: _batch_norm_functional_case((4, 3, 5), False, True),
    "batch_norm_without_running_statistics": lambda: (aten._native_batch_norm_legit.no_stats,
                                                      (_seeded((4, 3, 5)), _seeded((3,)), None, True, 0.1, 1e-5)),
    # nll_loss: class weights and ignore_index, every reduction; total_weight too
    **{f"nll_loss_{name}": (lambda reduction: lambda: (
        aten.nll_loss_forward.default,
        (_seeded((6, 4)), torch.tensor([0, 3, 1, 1, 2, 1]), _seeded((4,)).abs(), reduction, 1)))(reduction)
       for name, reduction in (("none", 0), ("mean", 1), ("sum", 2))},
    "nll_loss_backward_mean": lambda: (aten.nll_loss_backward.default,
                                       (torch.tensor(0.7), _seeded((6, 4)), torch.tensor([0, 3, 1, 1, 2, -5]),
                                        _seeded((4,)).abs(), 1, -5, torch.tensor(1.9))),
    "nll_loss_backward_none": lambda: (aten.nll_loss_backward.default,
                                       (_seeded((6,)), _seeded((6, 4)), torch.tensor([0, 3, 1, 1, 2, 1]), None,
                                        0, 1, torch.tensor(0.))),
    "nll_loss2d_weighted": lambda: (aten.nll_loss2d_forward.default,
                                    (_seeded((2, 4, 3, 3)), torch.arange(18).reshape(2, 3, 3) % 4,
                                     _seeded((4,)).abs(), 1, 2)),
    "mse_loss_backward": lambda: (aten.mse_loss_backward.default,
                                  (torch.tensor(1.5), _seeded((3, 4)), _seeded((4, 3)).T, 1)),
    "binary_cross_entropy": lambda: (aten.binary_cross_entropy.default,
                                     (torch.rand(3, 4), torch.rand(3, 4), _seeded((3, 4)), 2)),
    # interpolation and sampling
    "upsample_bilinear2d_align": lambda: (aten.upsample_bilinear2d.vec,
                                          (_seeded((2, 3, 7, 5)), [11, 3], True, None)),
    "upsample_bicubic2d_scale": lambda: (aten.upsample_bicubic2d.vec,
                                         (_seeded((2, 3, 7, 5)), None, False, [1.7, 2.0])),
    "upsample_nearest2d_backward": lambda: (aten.upsample_nearest2d_backward.default,
                                            (_seeded((2, 3, 11, 3)), [11, 3], [2, 3, 7, 5])),
    "grid_sampler_3d_reflection": lambda: (aten.grid_sampler_3d.default,
                                           (_seeded((2, 3, 4, 5, 6)), _seeded((2, 3, 4, 2, 3)) * 0.8, 0, 2, False)),
}


def _lazy(value, dev):
    if isinstance(value, torch.Tensor):
        return value.to(dev)
    return value


@pytest.mark.parametrize("name", sorted(CASES))
def test_nn_op_lowers_and_matches_eager(dev, name):
    op, args = CASES[name]()
    want = op(*args)
    fallbacks = xlakit.metrics()["fallbacks"]
    got = op(*(_lazy(a, dev) for a in args))
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    assert len(gots) == len(wants)
    for g, w in zip(gots, wants):
        if w is None:
            assert g is None
            continue
        assert_same(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)
    xlakit.mark_step()
    assert xlakit.metrics()["fallbacks"] == fallbacks, f"{op} ran eagerly on CPU"


@pytest.mark.parametrize("name", ["layer_norm_backward", "group_norm_backward", "batch_norm_backward_train",
                                  "batch_norm_functional_train"])
def test_a_norm_is_one_node(dev, name):
    """Lowered whole, not PyTorch's decomposition (~20 ops recorded in Python at each call:
    bench/RESULTS.md, fifteenth round)."""
    op, args = CASES[name]()
    outputs = op(*(_lazy(a, dev) for a in args))  # noqa: F841 - live: the marker computes them
    xlakit.mark_step()
    assert [node.op for node in xlakit.last_step().graph.nodes] == [str(op)]


def _as(dtype, args):
    return [a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["layer_norm_backward", "group_norm_backward", "batch_norm_backward_train"])
def test_a_norms_backward_in_half_precision_is_as_close_to_eager_as_eager_is_to_float64(dev, name, dtype):
    """Computed in float32 and rounded, as eager's CPU kernels do: each output no further from
    eager's than twice eager's own distance from the same op in float64 (and its rounding)."""
    op, args = CASES[name]()
    half = _as(dtype, args)
    wants, exact = op(*half), op(*_as(torch.float64, half))
    gots = op(*(_lazy(a, dev) for a in half))
    for got, want, ref in zip(gots, wants, exact):
        if want is None:
            assert got is None
            continue
        assert got.dtype == want.dtype and got.shape == want.shape
        spread = (want.double() - ref).abs().max().item()
        ulp = torch.finfo(dtype).eps * ref.abs().max().item()
        assert (got.cpu().double() - want.double()).abs().max().item() <= 2 * spread + ulp


def test_conv_and_pool_train_step_gradients_match_eager(dev):
    """Autograd through the lowered forward and backward ops of a small CNN."""
    torch.manual_seed(0)
    x, target = torch.randn(2, 3, 9, 9), torch.tensor([1, 3])

    def run(x, w1, b1, w2, target):
        h = aten.convolution(x, w1, b1, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        h, _ = aten.max_pool2d_with_indices(h, [2, 2], [2, 2], [0, 0], [1, 1], True)
        h = aten.convolution(h, w2, None, [2, 2], [1, 1], [1, 1], True, [1, 1], 2)
        h = aten._adaptive_avg_pool2d(h, [1, 1]).flatten(1)
        loss, _ = aten.nll_loss_forward(aten._log_softmax(h, 1, False), target, None, 1, -100)
        return loss

    params = [torch.randn(4, 3, 3, 3), torch.randn(4), torch.randn(4, 2, 3, 3)]
    eager = [p.clone().requires_grad_() for p in params]
    lazy = [p.to(dev).requires_grad_() for p in params]
    loss_e = run(x, *eager, target)
    loss_e.backward()
    loss_l = run(x.to(dev), *lazy, target.to(dev))
    loss_l.backward()
    assert_same(loss_l, loss_e, rtol=1e-5, atol=1e-5)
    for got, want in zip(lazy, eager):
        assert_same(got.grad, want.grad, rtol=1e-4, atol=1e-5)
