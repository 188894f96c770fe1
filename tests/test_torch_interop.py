"""torch APIs users call on lazy tensors, compared with eager torch on CPU:
random streams, `.grad` accumulation, torch.save, parameter moves, gradient clipping."""
import torch
import torch.nn as nn

import xlakit
from conftest import assert_same


# -- .grad keeps its identity across backwards ----------------------------------------
def test_a_held_grad_is_the_parameter_grad_after_more_backwards(dev):
    def run(device):
        torch.manual_seed(0)
        m = nn.Linear(2, 2).to(device)
        x = torch.ones(3, 2, device=device)
        m(x).sum().backward()
        held = m.weight.grad
        m(x).sum().backward()
        m(x).sum().backward()
        return held, m.weight.grad

    want_held, want = run("cpu")
    held, got = run(dev)
    assert want_held is want and held is got
    assert_same(held, want_held)
    assert_same(got, want)


def test_zero_grad_keeping_tensors_with_sgd_momentum_trains_as_eager(dev):
    def train(device):
        torch.manual_seed(0)
        m = nn.Linear(2, 2).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        x = torch.arange(6.).reshape(3, 2).to(device)
        grads = []
        for _ in range(3):
            opt.zero_grad(set_to_none=False)
            m(x).pow(2).sum().backward()
            grads.append(m.weight.grad)
            opt.step()
            if device == dev:
                xlakit.mark_step()
        assert all(g is m.weight.grad for g in grads)
        return [p.detach() for p in m.parameters()]

    for got, want in zip(train(dev), train("cpu")):
        assert_same(got, want, rtol=1e-5, atol=1e-5)
