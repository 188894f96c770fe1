"""A node's lowering is traced once per signature and replayed for the same
node elsewhere (a transformer's layers): what it computes and the checks it
asks for must stay each node's own."""
import inspect

import pytest
import torch
import torch.nn.functional as F

import xlakit
from conftest import assert_same
from xlakit import lowerings


@pytest.fixture
def counted_sinh(monkeypatch):
    """sinh's lowering, counting the times it is traced."""
    original = lowerings.find(torch.ops.aten.sinh.default)
    traced = []

    def sinh(self):
        traced.append(tuple(self.shape))
        return original.fn(self)
    monkeypatch.setitem(lowerings.TABLE, "aten::sinh.default",
                        lowerings.Entry(lowering=lowerings.Lowering(sinh, original.promote)))
    return traced


def test_the_same_node_is_traced_by_its_lowering_once(dev, counted_sinh):
    host = torch.linspace(-2, 2, 12).reshape(3, 4)
    x = host.to(dev)
    lazy = [x.sinh(), (x * 2).sinh(), (x + 1).sinh(), x[:2].sinh()]
    xlakit.mark_step()
    for got, want in zip(lazy, [host.sinh(), (host * 2).sinh(), (host + 1).sinh(), host[:2].sinh()]):
        assert_same(got, want)
    assert sorted(counted_sinh) == [(2, 4), (3, 4)]   # one trace per operand shape
    more = (x - 1).sinh() * 3   # another graph: its sinh replays the same trace
    xlakit.mark_step()
    assert_same(more, (host - 1).sinh() * 3)
    assert len(counted_sinh) == 2


def test_a_patched_lowering_is_traced_anew(dev, counted_sinh, monkeypatch):
    x = torch.ones(5).to(dev)
    x.sinh().cpu()
    monkeypatch.setitem(lowerings.TABLE, "aten::sinh.default",
                        lowerings.Entry(lowering=lowerings.Lowering(lambda self: self * 0 + 7)))
    assert_same(x.sinh() + 1, torch.full((5,), 8.0))   # a new graph, whose sinh node is the same


def test_nodes_that_differ_in_a_constant_only_each_get_their_own(dev):
    host = torch.tensor([float("nan"), 1.0, float("inf")])
    x = host.to(dev)
    values = [x.nan_to_num(nan=n, posinf=p) for n, p in [(0.0, 1.0), (-0.0, 1.0), (0.0, 2.0), (5.0, 1.0)]]
    xlakit.mark_step()
    for got, (n, p) in zip(values, [(0.0, 1.0), (-0.0, 1.0), (0.0, 2.0), (5.0, 1.0)]):
        assert_same(1 / got, 1 / host.nan_to_num(nan=n, posinf=p))


@pytest.mark.parametrize("bad_first", [True, False], ids=["bad_first", "bad_second"])
def test_a_check_of_a_replayed_lowering_names_its_own_node(dev, bad_first):
    w = torch.randn(6, 4).to(dev)
    good, bad = torch.tensor([0, 5]).to(dev), torch.tensor([1, 6]).to(dev)
    xlakit.mark_step()
    first = F.embedding(bad if bad_first else good, w); first_line = inspect.currentframe().f_lineno  # noqa: E702
    second = F.embedding(good if bad_first else bad, w); second_line = inspect.currentframe().f_lineno  # noqa: E702
    line = first_line if bad_first else second_line
    with pytest.raises(IndexError, match=rf"test_lowering_reuse.py:{line}\b.*embedding.*index 6 outside \[0, 6\)"):
        xlakit.mark_step()
    fine = second if bad_first else first
    assert_same(fine, F.embedding(torch.tensor([0, 5]), w.cpu()))
