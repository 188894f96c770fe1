"""Python reads answered on the host (front/host_reads.py): a read of a value computed from
host uploads alone costs no execution, and is exactly what the device would give, what eager
gives; everything else is read from the device as before. Its use on real models (an attention
mask): tests/test_real_models.py::test_an_attention_mask_costs_no_execution."""
import pytest
import torch

import xlakit
from xlakit.config import config


def executions() -> int:
    return xlakit.metrics()["executions"]


def read_on_host(dev, f, *inputs):
    """f(*inputs) read by Python on the device copies: (the value, executions it took)."""
    lazy = [t.to(dev) for t in inputs]
    before = executions()
    value = f(*lazy)
    return value, executions() - before


INTEGER_READS = [
    ("sum", lambda m: m.sum().item()),
    ("fast_all", lambda m: bool(m.bool().sum() == m.numel())),  # transformers' masking_utils.fast_all
    ("all", lambda m: bool(m.bool().all())),
    ("any_of_not", lambda m: bool((~m.bool()[:, 1:]).any())),
    ("tolist", lambda m: (m * 3 - 1).tolist()),
    ("max", lambda m: m.max().item()),
    ("floor_divide", lambda m: (m // 2).tolist()),
    ("int64_wraps", lambda m: (m + (2 ** 63 - 1)).tolist()),
    ("comparison", lambda m: (m.cumsum(1) >= 2).tolist()),
    ("where", lambda m: torch.where(m > 0, m, -m).tolist()),
]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
@pytest.mark.parametrize("name,f", INTEGER_READS, ids=[n for n, _ in INTEGER_READS])
def test_integer_reads_are_eagers_with_no_execution(dev, name, f, dtype):
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]).to(dtype)
    try:
        want = f(mask)
    except RuntimeError as error:  # an op eager refuses for this dtype (bool arithmetic)
        with pytest.raises(type(error)):
            f(mask.to(dev))
        return
    got, ran = read_on_host(dev, f, mask)
    assert got == want and type(got) is type(want)
    assert ran == 0


FLOAT_READS = [
    ("sum", lambda x: x.sum().item()),
    ("nan_any", lambda x: bool(torch.isnan(x).any())),
    ("nan_equal", lambda x: bool((x == x).all())),
    ("positive", lambda x: (x > 0).tolist()),
    ("to_bool", lambda x: x.bool().tolist()),
]


@pytest.mark.parametrize("name,f", FLOAT_READS, ids=[n for n, _ in FLOAT_READS])
def test_float_reads_run_on_the_device(dev, name, f):
    """Floats are never answered on the host: XLA:CPU reads subnormals as zero, so `1e-40 > 0`
    is False on the device and True in eager; the device's own value is the lazy one."""
    x = torch.tensor([1.5, float("nan"), -2.0, 0.0, float("inf")])
    got, ran = read_on_host(dev, f, x)
    assert got == f(x) or (name == "sum" and got != got)  # nan != nan
    assert ran == 1
    tiny = torch.tensor([1e-40])
    assert read_on_host(dev, lambda t: (bool(t > 0), bool(t.bool())), tiny)[1] == 2


def test_no_host_copy_over_the_limit(dev, monkeypatch):
    mask = torch.tensor([1, 1, 0])
    monkeypatch.setattr(config, "host_copy_bytes", mask.nbytes - 1)
    assert read_on_host(dev, lambda m: bool(m.all()), mask) == (False, 1)
    monkeypatch.setattr(config, "host_copy_bytes", mask.nbytes)
    assert read_on_host(dev, lambda m: bool(m.all()), mask) == (False, 0)


def test_an_in_place_write_on_the_device_is_read(dev):
    """An uploaded tensor written in place holds a new value: computed from host copies alone it
    is still answered on the host, from a device value it is read from the device."""
    mask = torch.tensor([1, 1, 0, 1])
    lazy = mask.to(dev)
    lazy.add_(1)
    mask.add_(1)
    got, ran = read_on_host(dev, lambda: lazy.tolist())
    assert (got, ran) == (mask.tolist(), 0)

    weights = torch.tensor([0.5, -1.0, 2.0, -3.0])
    lazy[1:3] = (weights.to(dev) * 2 > 0).long()[1:3]
    mask[1:3] = (weights * 2 > 0).long()[1:3]
    got, ran = read_on_host(dev, lambda: (lazy.sum().item(), lazy.tolist()))
    assert got == (mask.sum().item(), mask.tolist())
    assert ran == 1  # one partial sync computes lazy; the second read finds it computed

    xlakit.mark_step()  # lazy's value is the step's output now, a buffer the host never had
    lazy.mul_(3)
    mask.mul_(3)
    got, ran = read_on_host(dev, lambda: lazy.tolist())
    assert (got, ran) == (mask.tolist(), 1)


def test_the_host_tensor_and_the_read_are_copies(dev):
    mask = torch.tensor([1, 1, 0])
    lazy = mask.to(dev)
    mask[0] = 7  # after the upload: the device's value is the old one, the host's copy too
    first = (lazy + 0).cpu()
    first[1] = 9  # the read is the user's own tensor
    assert (lazy + 0).tolist() == [1, 1, 0]
    assert lazy.cpu().tolist() == [1, 1, 0]


def test_a_mask_made_on_the_device(dev):
    # from device floats: read from the device, once
    logits = torch.randn(2, 5, 4)
    ids = logits.argmax(-1)
    got, ran = read_on_host(dev, lambda x: (bool((x.argmax(-1) != 0).all()), (x.argmax(-1) != 0).tolist()), logits)
    assert got == (bool((ids != 0).all()), (ids != 0).tolist())
    assert ran == 2
    # a factory's (empty, then filled with a lifted float): read from the device
    ones = torch.ones(2, 16, dtype=torch.long, device=dev)
    assert read_on_host(dev, lambda: (bool(ones.sum() == ones.numel()), ones[0].tolist())) == ((True, [1] * 16), 2)
    empty = torch.empty(3, dtype=torch.long, device=dev)
    assert read_on_host(dev, lambda: empty.tolist()) == ([0, 0, 0], 1)  # the device's zeros, not host memory


def test_bad_input_raises_the_devices_error(dev):
    """Eager raises on the host copy: the device computes the read and raises xlakit's error, as before."""
    values, zeros, index = torch.tensor([5, 7]), torch.tensor([0, 1]), torch.tensor([5])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        (values.to(dev) // zeros.to(dev)).tolist()
    with pytest.raises(IndexError, match="out of bounds"):
        values.to(dev)[index.to(dev)].tolist()


def test_a_pending_assert_is_checked_at_the_read(dev):
    mask = torch.tensor([1, 1, 0]).to(dev)
    torch._assert_async(torch.tensor(0).to(dev), "the batch is empty")
    with pytest.raises(RuntimeError, match="the batch is empty"):
        bool(mask.all())


def test_a_read_answered_on_the_host_waits_for_no_step_dispatched_ahead(dev, monkeypatch):
    """Dispatching ahead, a read answered on the host (transformers' mask, each step) neither waits
    for the steps still running nor reads their checks: waiting there kept every step's Python from
    running beside the step before it. The next read of the device reports a failed step, as
    without that read."""
    monkeypatch.setattr(config, "wait_for_execution", False)
    from xlakit.session import current

    a = torch.arange(4.0).to(dev)
    xlakit.mark_step()
    picked = a[torch.tensor([9]).to(dev)].sum()  # out of bounds: the step's check fails
    xlakit.mark_step()  # returns at dispatch; the check is unread
    running = current().in_flight
    assert running
    got, ran = read_on_host(dev, lambda m: bool(m.all()), torch.tensor([1, 1, 0]))
    assert (got, ran) == (False, 0)
    assert current().in_flight is running  # not waited for
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 4"):
        (a * 3).cpu()
    with pytest.raises(IndexError, match="could not be computed"):
        picked.cpu()


def test_replayed_steps_branch_as_fresh_ones(dev):
    """A step recorded with its mask read on the host, replayed; then a step whose mask the device
    computed (a read that executes), a padded one (the other branch), and the first again."""
    torch.manual_seed(0)
    w = torch.randn(8, 4)
    x = torch.randn(2, 8)
    lazy_w = w.to(dev).requires_grad_()
    w.requires_grad_()
    masks = [torch.ones(2, 4, dtype=torch.long)] * 2 + [None, torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])]
    masks.append(masks[0])
    per_step = []
    for mask in masks:
        def step(w, x, mask):
            h = x @ w
            if mask is None:  # a mask the device computed from the weights
                mask = (w.detach().sum(0, keepdim=True) > -1e9).long().expand(2, 4)
            if bool(mask.sum() == mask.numel()):  # masking_utils' test
                h = h * 2
            else:
                h = h.masked_fill(mask == 0, 0.0)
            loss = h.square().mean()
            loss.backward()
            with torch.no_grad():
                w -= 0.1 * w.grad
                w.grad = None
            return loss.detach()
        want = step(w, x, mask)
        with xlakit.capture() as records:
            got = step(lazy_w, x.to(dev), None if mask is None else mask.to(dev))
            xlakit.mark_step()
        torch.testing.assert_close(got.cpu(), want)
        torch.testing.assert_close(lazy_w.detach().cpu(), w.detach())
        per_step.append([r.trigger for r in records])
    assert per_step == [["mark_step"], ["mark_step"], ["item", "mark_step"], ["mark_step"], ["mark_step"]]


def test_a_read_is_answered_again_only_from_the_same_ops_and_host_values(dev, monkeypatch):
    """A read answered before, from the same ops, constants and host values, is not run again
    (transformers' models read the same one every step); a new value, a new constant or another
    op is computed, each eager's."""
    from xlakit.front import host_reads
    from xlakit.lowerings import eager

    host_reads._ANSWERS.clear()  # what earlier tests in this process read
    ran = []
    run_node = eager.run_node
    monkeypatch.setattr(eager, "run_node", lambda node, host: ran.append(node.op) or run_node(node, host))
    cumsum = lambda m: (m.cumsum(0) + 2 == 3).tolist()  # noqa: E731
    reads = [  # (host values, the read, whether eager runs it)
        ([1, 1, 0], cumsum, True),
        ([1, 1, 0], cumsum, False),                                      # the same: not run again
        ([1, 0, 1], cumsum, True),                                       # a padded mask
        ([1, 1, 0], lambda m: (m.cumsum(0) + 5 == 3).tolist(), True),    # another constant
        ([1, 1, 0], lambda m: (m.cumprod(0) + 2 == 3).tolist(), True),   # another op
        ([1, 0, 1], cumsum, False),                                      # the padded one again: kept
    ]
    for values, f, runs in reads:
        ran.clear()
        mask = torch.tensor(values)
        got, executed = read_on_host(dev, f, mask)
        assert (got, executed) == (f(mask), 0)
        assert bool(ran) == runs, (values, ran)
