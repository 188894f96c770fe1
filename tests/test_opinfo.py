"""A bounded OpInfo sweep in CI: common ops are correct or a clean CPU fallback, never silently wrong.

The full sweep (`python -m xlakit.integrations.opinfo`) writes docs/op_coverage.md.
"""
import pytest
import torch

from xlakit.integrations import opinfo

pytest.importorskip("expecttest")  # torch.testing's OpInfo database needs it

OPS = ["add", "sub", "mul", "div", "matmul", "mm", "bmm", "addmm", "sum", "mean", "amax", "argmax",
       "softmax", "log_softmax", "exp", "tanh", "sigmoid", "relu", "where", "cat", "stack", "transpose",
       "permute", "index_select", "gather", "scatter", "masked_fill", "clamp", "norm", "linalg.vector_norm",
       "linalg.eigh", "linalg.pinv", "matrix_exp", "nn.functional.conv2d", "nn.functional.layer_norm", "cumsum", "topk",
       "sort", "nonzero", "angle",
       # fixed after the full sweep: batch norm's eval statistics, SVD signs, storage offsets,
       # allclose, index tensors kept on the host, out= ops below functionalization, lowerings that crashed
       "native_batch_norm", "_native_batch_norm_legit", "svd_lowrank", "pca_lowrank", "as_strided",
       "allclose", "tensor_split", "combinations", "linalg.matrix_power", "linalg.lu", "searchsorted",
       # random: OpInfo's seeding wrapper now steps xlakit
       "nn.functional.dropout", "bernoulli"]


def test_common_ops_are_never_silently_wrong():
    """Near 20 s: every OpInfo sample of the 53 OPS compiled and compared with eager."""
    results = opinfo.sweep(names=OPS)
    assert len(results) >= len(OPS)
    bad = {name: r for name, r in results.items() if r[0] in ("mismatch", "error")}
    assert not bad, bad
    assert results["nonzero"][0] == "fallback" and results["angle"] == ("pass", "")  # angle lowers (pointwise.py)
    assert results["native_batch_norm"] == ("pass", "") and results["allclose"] == ("pass", "")
    assert "singular pair takes eager's sign" in results["svd_lowrank"][1]
    assert results["linalg.lu"] == ("pass", "")  # xlakit's own lowering (torchax's crashed)
    assert "eigenvector takes eager's sign" in results["linalg.eigh"][1]
    assert results["bernoulli"][0] == "fallback"  # random ops run eagerly, seeded by torch
    assert results["nn.functional.dropout"] == ("pass", "")  # eager CPU's mask for the same seed


def test_singular_vectors_compare_up_to_a_sign_per_pair_only():
    torch.manual_seed(0)
    a = torch.randn(5, 3)
    want = torch.linalg.svd(a, full_matrices=False)
    u, s, vh = want
    flip = torch.tensor([1.0, -1.0, -1.0])
    pair_flipped = (u * flip, s, vh * flip[:, None])  # still a valid SVD of a
    torch.testing.assert_close(pair_flipped[0] @ torch.diag(s) @ pair_flipped[2], a, rtol=1e-4, atol=1e-5)
    assert not opinfo._close(pair_flipped, want)
    assert opinfo._close(opinfo._align_singular_vectors(pair_flipped, want, "Vh"), want)
    u_only = (u * flip, s, vh)  # not a decomposition of a: must stay a mismatch
    assert not opinfo._close(opinfo._align_singular_vectors(u_only, want, "Vh"), want)


def test_complex_singular_vectors_compare_up_to_a_phase_per_pair_only():
    torch.manual_seed(0)
    a = torch.randn(4, 3, dtype=torch.complex64)
    want = torch.linalg.svd(a, full_matrices=False)
    u, s, vh = want
    phase = torch.polar(torch.ones(3), torch.tensor([0.5, -1.0, 2.0]))
    pair_turned = (u * phase, s, vh * phase.conj()[:, None])  # still a valid SVD of a
    torch.testing.assert_close(pair_turned[0] @ torch.diag(s).to(a.dtype) @ pair_turned[2], a, rtol=1e-4, atol=1e-5)
    assert not opinfo._close(pair_turned, want)
    assert opinfo._close(opinfo._align_singular_vectors(pair_turned, want, "Vh"), want)
    u_only = (u * phase, s, vh)
    assert not opinfo._close(opinfo._align_singular_vectors(u_only, want, "Vh"), want)


def test_tied_indices_pass_only_where_they_pick_the_same_values():
    x = torch.tensor([3, 1, 3, 2])
    want = torch.sort(x)  # values [1, 2, 3, 3], indices [1, 3, 0, 2] or [1, 3, 2, 0]
    other_tie = torch.return_types.sort((want.values, torch.tensor([1, 3, 2, 0])))
    wrong = torch.return_types.sort((want.values, torch.tensor([1, 3, 0, 0])))  # not a permutation
    assert opinfo._ties_agree("sort", x, (), {}, other_tie, want)
    assert not opinfo._ties_agree("sort", x, (), {}, wrong, want)
    assert not opinfo._ties_agree("sort", x, (), {"stable": True}, other_tie, want)
    assert not opinfo._ties_agree("argsort", x, (), {}, torch.tensor([1, 0, 3, 2]), want.indices)
    k = torch.kthvalue(x, 3)  # 3, at index 0 or 2
    assert opinfo._ties_agree("kthvalue", x, (3,), {}, torch.return_types.kthvalue((k.values, torch.tensor(2))), k)
    assert not opinfo._ties_agree("kthvalue", x, (3,), {}, torch.return_types.kthvalue((k.values, torch.tensor(1))), k)


def test_a_half_result_passes_only_within_twice_eagers_own_spread():
    reference = torch.tensor([0.3, 1.0, 100.0])
    want = torch.tensor([0.2988, 1.0, 100.0]).half()  # eager's half kernel, 5 ulps off
    other_side = torch.tensor([0.3010, 1.0, 100.0]).half()  # as far, on the other side
    far = torch.tensor([0.2950, 1.0, 100.0]).half()
    assert not opinfo._close(other_side, want)
    assert opinfo._within_eager_spread(other_side, want, reference, torch.float16)
    assert not opinfo._within_eager_spread(far, want, reference, torch.float16)
    image = torch.tensor([8.5, 8.75, 3.2])
    assert opinfo._within_eager_spread(torch.tensor([9, 9, 3], dtype=torch.uint8),
                                       torch.tensor([8, 9, 3], dtype=torch.uint8), image, torch.uint8)
    assert not opinfo._within_eager_spread(torch.tensor([0, 9, 3], dtype=torch.uint8),
                                           torch.tensor([9, 9, 3], dtype=torch.uint8), image, torch.uint8)
