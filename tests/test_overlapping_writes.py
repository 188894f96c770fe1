"""Writes to views whose elements share memory (expand, unfold with step < size): eager's
values where eager writes, eager's error where eager refuses (issue #24 items 2 and 6).
Functionalization alone would add the shared elements up."""
import pytest
import torch

from conftest import assert_same


def _both(dev, program):
    """program(device) eagerly and on xlakit: (result, error message) each."""
    outcomes = []
    for device in ("cpu", dev):
        try:
            outcomes.append((program(device), None))
        except RuntimeError as e:
            outcomes.append((None, str(e)))
    return outcomes


EXPAND_WRITES = {
    "add_": lambda e, src: e.add_(1),
    "mul_": lambda e, src: e.mul_(2),
    "copy_": lambda e, src: e.copy_(src),
    "masked_fill_": lambda e, src: e.masked_fill_(src > 0, 5.0),
    "fill_": lambda e, src: e.fill_(3.0),
    "zero_": lambda e, src: e.zero_(),
}


@pytest.mark.parametrize("write", EXPAND_WRITES)
def test_a_write_to_an_expanded_tensor_is_eagers(dev, write):
    def program(device):
        base = torch.arange(12.).view(3, 4).to(device)
        expanded = base[1:2, 1:3].expand(3, 2)
        EXPAND_WRITES[write](expanded, torch.arange(6.).view(3, 2).to(device))
        return base.cpu()

    (want, want_error), (got, got_error) = _both(dev, program)
    if want_error is None:  # fill_ and zero_: eager writes each location once
        assert got_error is None and torch.equal(got, want)
    else:
        assert got_error is not None and want_error.rstrip(".") in got_error
        assert "test_overlapping_writes.py" in got_error  # the user's line
        base = torch.arange(12.).view(3, 4).to(dev)  # the session goes on
        assert_same(base * 2, torch.arange(12.).view(3, 4) * 2)


@pytest.mark.parametrize("write", ["fill_", "zero_", "masked_fill_"])
def test_a_write_to_an_expanded_view_of_a_reshaped_copy_is_eagers(dev, write):
    """The base is itself a view (a reshape that copies): found by `make fuzz`, where xlakit
    raised functionalization's as_strided refusal and eager wrote."""
    def program(device):
        x = torch.arange(20.).view(4, 5).to(device) * 2
        x = x.t().flatten().view(5, 4).t()
        EXPAND_WRITES[write](x[:1].expand(4, 5), torch.arange(20.).view(4, 5).to(device))
        return x.cpu()

    (want, want_error), (got, got_error) = _both(dev, program)
    assert want_error is None and got_error is None, got_error
    assert torch.equal(got, want)


UNFOLD_WRITES = {
    "overlapping column": lambda b: b.unfold(0, 4, 3).__setitem__((slice(None), 0), -1),
    "overlapping last column": lambda b: b.unfold(0, 4, 3).__setitem__((slice(None), 3), -1),
    "overlapping window": lambda b: b.unfold(0, 4, 3).__setitem__(1, 7.0),
    "gapped windows": lambda b: b.unfold(0, 2, 3).__setitem__((slice(None), 0), -1),
    "uncovered tail": lambda b: b.unfold(0, 5, 5).mul_(2),  # elements 10 and 11 in no window
    "of a view": lambda b: b.view(2, 6)[1:].unfold(1, 3, 1).__setitem__((slice(None), 1, 0), -5.0),
    "of a transposed view": lambda b: b.view(3, 4).t().unfold(0, 2, 1).__setitem__((slice(None), slice(None), 0),
                                                                                      0.0),
    "copy_ into windows": lambda b: b.unfold(0, 5, 2).copy_(torch.zeros(4, 5, device=b.device)),
}


# the same 12 elements in memory, a view of a base whose memory is row-major or permuted (a
# clone of a transposed tensor: found by `make fuzz`, where a write through the windows added
# the overlapping windows up)
LAYOUTS = {
    "row-major": lambda device: (torch.arange(12.).to(device),) * 2,
    "permuted memory": lambda device: (lambda c: (c, c.t().reshape(-1)))(torch.arange(12.).view(3, 4).to(device).t()
                                                                          .clone()),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("write", UNFOLD_WRITES)
def test_a_write_through_unfold_windows_is_eagers(dev, write, layout):
    def program(device):
        base, flat = LAYOUTS[layout](device)
        UNFOLD_WRITES[write](flat)
        return base.cpu(), base.stride()

    (want, want_error), (got, got_error) = _both(dev, program)
    assert want_error is None and got_error is None, got_error
    assert torch.equal(got[0], want[0]) and got[1] == want[1], (got, want)


def test_a_write_to_one_unfold_window_of_a_permuted_base_is_eagers(dev):
    # a contiguous window: its write is still one through torch's unfold
    def program(device):
        base = torch.arange(20.).view(4, 5).to(device).t().clone()
        windows = base.t().reshape(-1).unfold(0, 5, 3)
        windows[2] = -1.0
        windows[1:3, 1:3].mul_(3.0)
        return base.cpu(), windows.cpu()

    (want, want_error), (got, got_error) = _both(dev, program)
    assert want_error is None and got_error is None, got_error
    assert all(torch.equal(g, w) for g, w in zip(got, want)), (got, want)


def test_an_update_through_overlapping_windows_is_a_clear_error(dev):
    # eager multiplies the shared elements twice, in memory order: xlakit says it does not
    base = torch.arange(10.).to(dev)
    windows = base.unfold(0, 4, 3)
    with pytest.raises(RuntimeError, match=r"aten.mul_.Tensor: xlakit does not update a view whose elements overlap"
                                           r".*clone\(\) the view first.*test_overlapping_writes.py"):
        windows.mul_(2)
    assert_same(base, torch.arange(10.))  # nothing was written
    windows.clone().mul_(2)  # the remedy works


def test_unfold_windows_keep_eagers_values_layout_and_gradient(dev):
    x = torch.arange(10., requires_grad=True)
    results = []
    for device in ("cpu", dev):
        leaf = x.detach().clone().requires_grad_()
        windows = leaf.to(device).unfold(0, 4, 3)
        (windows * windows).sum().backward()
        results.append((windows.stride(), windows.storage_offset(), windows.cpu(), leaf.grad))
    (want_stride, want_offset, want, want_grad), (got_stride, got_offset, got, got_grad) = results
    assert (got_stride, got_offset) == (want_stride, want_offset)
    assert torch.equal(got.detach(), want.detach()) and torch.equal(got_grad, want_grad)
