"""xlakit.capture(): exactly the StepRecords of the executions inside a block, from the one log."""
import pytest
import torch

import xlakit


def test_capture_gives_exactly_the_records_inside(dev):
    a = torch.ones(3).to(dev)
    (a * 2).sum().item()                     # an execution before: not captured
    with xlakit.capture() as steps:
        b = a + 1
        b.sum().item()                       # an implicit sync
        c = b * 3
        xlakit.mark_step()
    (c - 1).sum().item()                     # an execution after: not captured
    assert [r.trigger for r in steps] == ["item", "mark_step"]
    assert steps == xlakit.steps()[-3:-1]
    assert [r.index for r in steps] == [steps[0].index, steps[0].index + 1]
    with xlakit.capture() as none:
        pass
    assert none == []


def test_captures_nest(dev):
    x = torch.ones(2).to(dev)
    with xlakit.capture() as outer:
        x = x + 1
        xlakit.mark_step()
        with xlakit.capture() as inner:
            x = x * 2
            xlakit.mark_step()
        x = x - 1
        xlakit.mark_step()
    assert len(outer) == 3 and inner == outer[1:2]
    assert x.cpu().tolist() == [3.0, 3.0]


def test_an_exception_inside_keeps_the_records_so_far(dev):
    with pytest.raises(ValueError), xlakit.capture() as steps:
        y = torch.arange(4.0).to(dev) * 5
        y.sum().item()
        raise ValueError("boom")
    assert [r.trigger for r in steps] == ["item"]
    with xlakit.capture() as after:  # the failed block's capture is closed: it gets no more
        z = y + 1
        xlakit.mark_step()
    assert len(steps) == 1 and len(after) == 1 and after[0] is not steps[0]


def test_capture_outlives_the_log_bound(dev, monkeypatch):
    monkeypatch.setattr(xlakit.config, "record_limit", 2)
    w = torch.ones(4).to(dev)
    with xlakit.capture() as steps:
        for _ in range(5):
            w.mul_(2)
            xlakit.mark_step()
    assert len(steps) == 5 and len(xlakit.steps()) == 2 and xlakit.steps() == steps[-2:]


def test_torch_xla_adapter_records_go_into_the_same_log(dev):
    torch_xla = pytest.importorskip("torch_xla")
    from xlakit.integrations import torch_xla as adapter

    tdev = torch_xla.device()
    with xlakit.capture() as steps:
        z = (torch.ones(3).to(dev) * 2).sum()
        xlakit.mark_step()
        u = (torch.arange(5.0).to(tdev) * 3 - 1).sum()  # a graph no other test runs
        record = adapter.step()
    assert [r.backend for r in steps] == ["xlakit", "torch_xla"]
    assert steps[1] is record and xlakit.last_step() is record
    assert record.index == steps[0].index + 1
    assert z.cpu().item() == 6.0 and u.cpu().item() == 25.0
