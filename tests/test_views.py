"""Views and in-place ops: every mutation on a base or a view, then read both, as eager does."""
import copy

import pytest
import torch

import xlakit
from conftest import assert_same

# (name, make view from base, mutate) — the mutation runs on the view or on the base.
VIEWS = {
    "slice": lambda b: b[1:3],
    "select": lambda b: b[2],
    "view": lambda b: b.view(2, 12)[1],
    "reshape": lambda b: b.reshape(24)[5:9],
    "transpose": lambda b: b.transpose(0, 1),
    "permute": lambda b: b.permute(1, 0)[::2],
    "unsqueeze": lambda b: b.unsqueeze(0)[0, :2],
    "narrow": lambda b: b.narrow(1, 1, 3),
    "diagonal": lambda b: b.diagonal(),
    "as_strided": lambda b: b.as_strided((2, 2), (6, 1), 1),
}
MUTATIONS = {
    "add_": lambda t: t.add_(1.5),
    "mul_": lambda t: t.mul_(-2),
    "copy_": lambda t: t.copy_(torch.full_like(t, 3.0)),
    "zero_": lambda t: t.zero_(),
    "fill_": lambda t: t.fill_(7.0),
    "masked_fill_": lambda t: t.masked_fill_(t > 0, -1.0),
    "index_put_": lambda t: t.index_put_((torch.tensor([0]),), torch.tensor(9.0)),
    "clamp_": lambda t: t.clamp_(-0.5, 0.5),
    "setitem": lambda t: t.__setitem__(0, 4.0),
    # functionalized by xlakit's own kernel (functionalization._functionalized_inplace)
    "addcmul_": lambda t: t.addcmul_(t, t, value=0.5),
    "addcdiv_": lambda t: t.addcdiv_(t, t.abs() + 1, value=-2),
    "lerp_": lambda t: t.lerp_(torch.full_like(t, 2.0), 0.25),
}
SYNCS = {
    "none": lambda ts: None,
    "partial": lambda ts: xlakit.sync(list(ts)),
    "step": lambda ts: xlakit.mark_step(),
}


def run(base, view_fn, mutate, on_view, sync):
    view = view_fn(base)
    other = base[0]                       # a second view that must see the change
    sync((base, view))
    mutate(view if on_view else base)
    sync((view,))
    return base, view, other


@pytest.mark.parametrize("sync", sorted(SYNCS))
@pytest.mark.parametrize("on_view", [True, False], ids=["on_view", "on_base"])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_mutation_through_views_matches_eager(dev, view, mutation, on_view, sync):
    torch.manual_seed(0)
    base = torch.randn(4, 6)
    eager = run(base.clone(), VIEWS[view], MUTATIONS[mutation], on_view, SYNCS["none"])
    lazy = run(base.to(dev), VIEWS[view], MUTATIONS[mutation], on_view, SYNCS[sync])
    for got, want in zip(lazy, eager):
        assert_same(got, want)
    xlakit.mark_step()
    for got, want in zip(lazy, eager):
        assert_same(got, want)


def test_a_buffer_read_by_a_live_view_is_never_donated(dev):
    base = torch.arange(6.0).to(dev)
    view = base[2:4]
    xlakit.mark_step()
    base.mul_(10)           # the view aliases the base: it must show the new values
    xlakit.mark_step()
    record = xlakit.last_step()
    # the old base buffer is free to reuse; the view's own buffer is still read
    assert [d.shape for d in record.donated] == [(6,)]
    assert view.cpu().tolist() == [20.0, 30.0]
    assert base.cpu().tolist() == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]


@pytest.mark.parametrize("first", ["inference_mode", "no_grad"])
def test_a_module_first_called_in_inference_mode_matches_eager(dev, first):
    # its first call names its parameters, and reading them there left each one raising
    # "Cannot set version_counter for inference tensor" at every view of it (a Linear's
    # weight.t()), in that call and all later ones
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model = copy.deepcopy(eager).to(dev)
    x = torch.randn(4, 6)
    with torch.inference_mode() if first == "inference_mode" else torch.no_grad():
        assert_same(model(x.to(dev)), eager(x))
    for _ in range(2):
        with torch.inference_mode():
            got, want = model(x.to(dev)), eager(x)
            assert got.is_inference() == want.is_inference()
            assert_same(got, want)
        assert_same(model(x.to(dev)).detach(), eager(x).detach())  # and outside it


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_views_in_inference_mode_are_eagers(dev, name):
    # every view of a normal tensor raised "Cannot set version_counter for
    # inference tensor" under torch.inference_mode (torch_xla 2.9 too); eager
    # torch makes it a normal tensor, and an op's new result an inference tensor
    make = VIEWS[name]

    def program(base):
        with torch.inference_mode():
            view = make(base)
            made = base * 2
            made_view = make(made)
            view.mul_(3)          # in-place on a view of a normal tensor: allowed in inference mode
        return view, made, made_view, base

    base = torch.arange(24.0).reshape(4, 6)
    for got, want in zip(program(base.to(dev)), program(base.clone())):
        assert got.is_inference() == want.is_inference()
        assert_same(got, want)
