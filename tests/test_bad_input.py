"""Bad input: clear errors naming the op and the user's line; nothing lost afterwards."""
import pytest
import torch
import torchax

import xlakit
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


def test_failed_lowering_poisons_only_its_dependents(dev, monkeypatch):
    from xlakit import frontend, lowering
    monkeypatch.setattr(frontend, "_WARNED", set())
    monkeypatch.setattr(lowering, "FAILED", set())  # the op is remembered as failed in this test only
    env = torchax.default_env()
    sinh = torch.ops.aten.sinh.default
    saved = env._ops.get(sinh)

    def broken(*args, **kwargs):  # fault injection through torchax's own override API
        raise ValueError("injected lowering fault")

    env.override_op_definition(torch.ops.aten.sinh.default, broken)
    try:
        x = torch.ones(4, device=dev)
        bad = x.sinh()
        good = x * 3
        with pytest.raises(RuntimeError, match=r"could not lower aten.sinh.*test_bad_input.py"):
            xlakit.mark_step()
        assert good.cpu().tolist() == [3.0] * 4
        with pytest.raises(StepFailedError, match="injected lowering fault"):
            bad.cpu()
        assert x.cpu().tolist() == [1.0] * 4
    finally:
        if saved is None:
            env._ops.pop(sinh)
        else:
            env._ops[sinh] = saved
    del bad
    with pytest.warns(UserWarning, match="sinh.*runs eagerly"):  # a failed lowering is not retried
        y = torch.ones(2, device=dev).sinh()
    xlakit.mark_step()
    torch.testing.assert_close(y.cpu(), torch.ones(2).sinh())


def test_strict_lowering_turns_fallback_into_an_error(dev, monkeypatch):
    from xlakit import frontend
    monkeypatch.setattr(frontend, "_WARNED", set())  # each op warns once per process
    monkeypatch.setattr(xlakit.config, "strict_lowering", True)
    x = torch.tensor([1.0, 0.0, 2.0], device=dev)
    with pytest.raises(NotImplementedError, match=r"nonzero.*test_bad_input.py"):
        torch.nonzero(x)
    monkeypatch.setattr(xlakit.config, "strict_lowering", False)
    with pytest.warns(UserWarning, match=r"nonzero.*runs eagerly on CPU \(output shape depends on the data\)"):
        idx = torch.nonzero(x)
    assert idx.cpu().tolist() == [[0], [2]]
