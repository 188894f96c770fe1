"""torch.compile(backend="xlakit") against eager when Dynamo passes sizes and ints as graph inputs."""
import pytest
import torch
from conftest import assert_same


@pytest.fixture(autouse=True)
def automatic_dynamic():
    # torch's default (importing torch_xla turns it off): after a recompile for a new
    # size or int, Dynamo passes it as a graph input
    torch._dynamo.reset()
    with torch._dynamo.config.patch(automatic_dynamic_shapes=True):
        yield


def _ints_and_repeat(x, n):
    return x * n, x.repeat(n)


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("dynamic", [None, True])
def test_each_python_int_gets_its_own_values(dev, dynamic, grad):
    compiled = torch.compile(_ints_and_repeat, backend="xlakit", dynamic=dynamic)
    for n in (3, 5, 7, 5):
        x = torch.arange(1.0, 4.0, requires_grad=grad)
        want = torch.arange(1.0, 4.0, requires_grad=grad)
        got_mul, got_repeat = compiled(x, n)
        want_mul, want_repeat = _ints_and_repeat(want, n)
        assert_same(got_mul.detach(), want_mul.detach())
        assert_same(got_repeat.detach(), want_repeat.detach())
        if grad:
            ((got_mul * got_mul).sum() + got_repeat.sin().sum()).backward()
            ((want_mul * want_mul).sum() + want_repeat.sin().sum()).backward()
            assert_same(x.grad, want.grad)


def _loss(x):
    return (x * 2).sin().sum()


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("dynamic", [None, True])
def test_each_input_length_gets_its_own_executable(dev, dynamic, grad):
    compiled = torch.compile(_loss, backend="xlakit", dynamic=dynamic)
    for length in (3, 4, 5, 3):
        x = torch.linspace(-1.0, 1.0, length, requires_grad=grad)
        want = torch.linspace(-1.0, 1.0, length, requires_grad=grad)
        got, expected = compiled(x), _loss(want)
        assert_same(got.detach(), expected.detach())
        if grad:
            got.backward()
            expected.backward()
            assert_same(x.grad, want.grad)
