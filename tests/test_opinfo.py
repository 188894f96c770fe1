"""A bounded OpInfo sweep in CI: common ops are correct or a clean CPU fallback, never silently wrong.

The full sweep (`python -m xlakit.opinfo`) writes docs/op_coverage.md.
"""
import pytest

from xlakit import opinfo

pytest.importorskip("expecttest")  # torch.testing's OpInfo database needs it

OPS = ["add", "sub", "mul", "div", "matmul", "mm", "bmm", "addmm", "sum", "mean", "amax", "argmax",
       "softmax", "log_softmax", "exp", "tanh", "sigmoid", "relu", "where", "cat", "stack", "transpose",
       "permute", "index_select", "gather", "scatter", "masked_fill", "clamp", "norm", "linalg.vector_norm",
       "linalg.eigh", "linalg.pinv", "matrix_exp", "nn.functional.conv2d", "nn.functional.layer_norm", "cumsum", "topk",
       "sort", "nonzero", "angle"]


def test_common_ops_are_never_silently_wrong():
    results = opinfo.sweep(names=OPS)
    assert len(results) >= len(OPS)
    bad = {name: r for name, r in results.items() if r[0] in ("mismatch", "error")}
    assert not bad, bad
    assert results["nonzero"][0] == "fallback" and results["angle"][0] == "fallback"
