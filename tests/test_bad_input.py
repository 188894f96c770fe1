"""Bad input: clear errors naming the op and the user's line; nothing lost afterwards."""
import warnings

import pytest
import torch

import xlakit
from conftest import assert_same
from xlakit.engine import StepFailedError


def test_shape_error_names_op_and_line_and_engine_keeps_working(dev):
    a = torch.ones(2, 3, device=dev)
    with pytest.raises(RuntimeError, match=r"aten.mm.*test_bad_input.py:\d+"):
        a @ a
    assert (a.sum() * 2).item() == 12.0


def test_mixing_lazy_and_cpu_tensors_is_an_error(dev):
    a = torch.ones(3, device=dev)
    with pytest.raises(RuntimeError, match=r"same device.*lazy:0 and cpu.*test_bad_input.py"):
        a + torch.ones(3)
    assert_ok = (a + torch.tensor(2.0)).cpu()  # a 0-d CPU tensor mixes, as in eager torch
    assert assert_ok.tolist() == [3.0, 3.0, 3.0]


@pytest.fixture
def broken_sinh(monkeypatch):
    """sinh's lowering raises (fault injection into xlakit's lowering table)."""
    from xlakit import eager, lowerings, ops
    monkeypatch.setattr(eager, "WARNED", set())  # each op warns once per process
    monkeypatch.setattr(ops, "FAILED", set())  # the op is remembered as failed in this test only

    def broken(*args, **kwargs):
        raise ValueError("injected lowering fault")

    # an overload's key wins over its packet's
    monkeypatch.setitem(lowerings.TABLE, "aten::sinh.default", lowerings.Lowering(broken))


def test_failed_lowering_computes_the_node_eagerly_and_the_step_goes_on(dev, broken_sinh):
    x = torch.linspace(-1, 1, 4).to(dev)
    xlakit.mark_step()
    bad = (x * 2).sinh() + 1   # a pending operand before the failing node, a dependent after it
    good = x * 3
    with pytest.warns(UserWarning, match=r"sinh.*runs eagerly on CPU \(its XLA lowering failed: injected.*test_bad_input"):
        xlakit.mark_step()
    host = torch.linspace(-1, 1, 4)
    assert_same(bad, (host * 2).sinh() + 1)
    assert_same(good, host * 3)
    assert xlakit.metrics()["fallbacks"] == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = x.sinh()
    # a failed lowering is not retried: the op runs eagerly at once, at record
    # time, and is not announced again (each op warns once per process)
    assert xlakit.metrics()["fallbacks"] == 2
    assert not [w for w in caught if "sinh" in str(w.message)]
    xlakit.mark_step()
    assert_same(y, host.sinh())


def test_strict_lowering_failure_poisons_only_its_dependents(dev, broken_sinh, monkeypatch):
    monkeypatch.setattr(xlakit.config, "strict_lowering", True)
    x = torch.ones(4, device=dev)
    bad = x.sinh()
    good = x * 3
    with pytest.raises(RuntimeError, match=r"could not lower aten.sinh.*test_bad_input.py"):
        xlakit.mark_step()
    assert good.cpu().tolist() == [3.0] * 4
    with pytest.raises(StepFailedError, match="injected lowering fault"):
        bad.cpu()
    assert x.cpu().tolist() == [1.0] * 4
    with pytest.raises(NotImplementedError, match="sinh.*strict_lowering"):  # nor retried
        x.sinh()


def test_dtype_without_xla_equivalent_is_a_clear_error_for_that_call_only(dev):
    x = torch.ones(3, device=dev)
    half = x.to(torch.complex32)   # XLA has no complex32
    with pytest.raises(RuntimeError, match=r"_to_copy.*test_bad_input.py.*complex32 has no XLA equivalent"):
        half.cpu()
    fallbacks = xlakit.metrics()["fallbacks"]
    assert_same(x.to(torch.float64), torch.ones(3, dtype=torch.float64))  # the cast itself still lowers
    assert xlakit.metrics()["fallbacks"] == fallbacks


def test_as_strided_past_the_tensor_raises_as_eager_does(dev):
    # XLA would clamp (as_strided) or drop (as_strided_scatter) such accesses
    host = torch.arange(10.0)
    x = host.to(dev)
    with pytest.raises(RuntimeError, match="out of bounds for storage of size 40"):
        host.as_strided((2, 2), (1, 2), 7)
    with pytest.raises(RuntimeError, match="as_strided_copy.*test_bad_input.py.*out of bounds for storage of size 40"):
        x.as_strided((2, 2), (1, 2), 7).cpu()
    with pytest.raises(RuntimeError, match="out of bounds for storage of size 40"):
        torch.as_strided_scatter(host, torch.ones(2, 2), (2, 2), (1, 2), 7)
    with pytest.raises(RuntimeError, match="as_strided_scatter.*out of bounds for storage of size 40"):
        torch.as_strided_scatter(x, torch.ones(2, 2, device=dev), (2, 2), (1, 2), 7).cpu()
    fallbacks = xlakit.metrics()["fallbacks"]
    assert_same(x.as_strided((2, 2), (1, 2), 6), host.as_strided((2, 2), (1, 2), 6))  # the last element
    assert_same(torch.as_strided_scatter(x, torch.ones(2, 2, device=dev), (2, 2), (1, 2), 6),
                torch.as_strided_scatter(host, torch.ones(2, 2), (2, 2), (1, 2), 6))
    assert xlakit.metrics()["fallbacks"] == fallbacks  # in bounds: lowered


def test_strict_lowering_turns_fallback_into_an_error(dev, monkeypatch):
    from xlakit import eager
    monkeypatch.setattr(eager, "WARNED", set())  # each op warns once per process
    monkeypatch.setattr(xlakit.config, "strict_lowering", True)
    x = torch.tensor([1.0, 0.0, 2.0], device=dev)
    with pytest.raises(NotImplementedError, match=r"nonzero.*test_bad_input.py"):
        torch.nonzero(x)
    monkeypatch.setattr(xlakit.config, "strict_lowering", False)
    with pytest.warns(UserWarning, match=r"nonzero.*runs eagerly on CPU \(output shape depends on the data\)"):
        idx = torch.nonzero(x)
    assert idx.cpu().tolist() == [[0], [2]]
