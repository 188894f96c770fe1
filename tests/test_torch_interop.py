"""torch APIs users call on lazy tensors, compared with eager torch on CPU:
random streams, `.grad` accumulation, torch.save, parameter moves, gradient clipping."""
import ast
import os
import textwrap

import pytest
import torch
import torch.nn as nn
from torch.nn.utils import clip_grad

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


# -- dropout draws what eager CPU draws ----------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("how", ["functional", "module"])
def test_dropout_draws_eager_cpus_mask_and_leaves_the_generator_as_eager(dev, dtype, p, how):
    def run(device):
        torch.manual_seed(1)
        x = torch.linspace(-2, 2, 64, dtype=dtype, device=device).requires_grad_()
        y = nn.functional.dropout(x, p) if how == "functional" else nn.Dropout(p).train()(x)
        (y * torch.arange(64, dtype=dtype, device=device)).sum().backward()
        return y.detach(), x.grad, torch.rand(2)  # the generator's next draw

    got, got_grad, got_next = run(dev)
    want, want_grad, want_next = run("cpu")
    assert_same(got, want, rtol=0, atol=0)
    assert_same(got_grad, want_grad, rtol=0, atol=0)
    assert torch.equal(got_next, want_next)


@pytest.mark.parametrize("train", [True, False, None])
def test_native_dropout_called_directly_is_eager_cpus(dev, train):
    def run(device):
        torch.manual_seed(2)
        return (*torch.native_dropout(torch.linspace(-1, 1, 32, device=device), 0.4, train), torch.rand(2))

    for got, want in zip(run(dev), run("cpu")):
        assert_same(got, want, rtol=0, atol=0)


# -- torch.save writes CPU tensors ------------------------------------------------------
def _load_without_xlakit(new_python, path):
    """torch.load in a new process that never imports xlakit: each tensor's
    (device, dtype, values), and which names share one storage."""
    program = textwrap.dedent(f"""
        import sys, torch
        obj = torch.load({str(path)!r}, weights_only=False)
        assert "xlakit" not in sys.modules
        tensors = obj if isinstance(obj, dict) else {{"": obj}}
        print(repr({{name: (str(t.device), str(t.dtype), t.tolist(), type(t).__name__, t.requires_grad,
                     sorted(k for k, u in tensors.items() if u.untyped_storage().data_ptr()
                            == t.untyped_storage().data_ptr()))
                    for name, t in tensors.items()}}))
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = new_python("-c", program, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return ast.literal_eval(result.stdout.strip())


def tied_model():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 4))
    model[2].weight = model[0].weight
    return model


def test_torch_save_of_a_state_dict_loads_without_xlakit_as_eager(dev, new_python, tmp_path):
    def trained(device):
        torch.manual_seed(0)
        model = tied_model().to(device)
        torch.optim.SGD(model.parameters(), lr=0.1).zero_grad()
        model(torch.randn(8, 4).to(device)).sum().backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()  # pending on the device: saved unsynced
        return model

    torch.save(trained("cpu").state_dict(), tmp_path / "eager.pt")
    torch.save(trained(dev).state_dict(), tmp_path / "lazy.pt")
    want, got = (_load_without_xlakit(new_python, tmp_path / f"{name}.pt") for name in ("eager", "lazy"))
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(torch.tensor(got[name][2]), torch.tensor(want[name][2]), rtol=1e-5, atol=1e-6)
        assert got[name][:2] == want[name][:2] and got[name][3:] == want[name][3:], name  # tied stay tied
    assert got["0.weight"][5] == ["0.weight", "2.weight"]


def test_torch_save_of_tensors_views_and_pending_work_never_donates(dev, new_python, tmp_path):
    base = torch.arange(6.).reshape(2, 3)
    t = base.to(dev)
    xlakit.mark_step()
    reads_old = t * 2  # pending work that reads t's buffer
    t.add_(1)  # pending in-place update: a full step would donate t's buffer
    param = nn.Parameter(torch.ones(2).to(dev))
    objects = {"tensor": t, "view": t[1], "pending": reads_old, "param": param}
    with xlakit.capture() as steps:
        for name, obj in objects.items():
            torch.save(obj, tmp_path / f"{name}.pt")
        torch.save(list(objects.values()), tmp_path / "list.pt")
    assert steps and all(s.trigger == "save" and s.donated == () for s in steps)
    want = {"tensor": base + 1, "view": (base + 1)[1], "pending": base * 2, "param": torch.ones(2)}
    for name, value in want.items():
        loaded = _load_without_xlakit(new_python, tmp_path / f"{name}.pt")[""]
        assert loaded[:2] == ("cpu", "torch.float32") and loaded[2] == value.tolist(), name
    assert loaded[3:5] == ("Parameter", True)
    assert [u.tolist() for u in torch.load(tmp_path / "list.pt")] == [v.tolist() for v in want.values()]
    xlakit.mark_step()  # nothing the saves computed was donated: later reads are right
    assert_same(t, base + 1)
    assert_same(reads_old, base * 2)


# -- moves users make -------------------------------------------------------------------
def test_a_parameter_moved_by_data_is_a_parameter_on_the_device_that_trains(dev):
    def train(device):
        torch.manual_seed(0)
        p = nn.Parameter(torch.randn(3))
        p.note = "kept"
        p.data = p.data.to(device)
        assert isinstance(p, nn.Parameter) and p.device == torch.device(device) and p.note == "kept"
        opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
        for _ in range(3):
            opt.zero_grad()
            (p * p).sum().backward()
            opt.step()
        return p.detach()

    assert_same(train(dev), train("cpu"))


def test_a_parameter_that_cannot_move_by_data_says_what_to_do(dev):
    m = nn.Linear(2, 2).to(dev)
    m(torch.ones(1, 2, device=dev)).sum().backward()  # xlakit now names (weakly references) its parameters
    with pytest.raises(RuntimeError, match=r"Move its module instead"):
        m.weight.data = m.weight.data.cpu()
    assert_same(m(torch.ones(1, 2, device=dev)), m.cpu()(torch.ones(1, 2)))  # the session keeps working


@pytest.mark.parametrize("clip", ["norm", "value"])
def test_gradient_clipping_with_foreach_equals_eager(dev, clip):
    def clipped(device):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
        (model(torch.randn(5, 4).to(device)) * 10).sum().backward()
        # torch's own functions: importing torch_xla (conftest) replaces nn.utils.clip_grad_norm_
        # with one that refuses foreach=True on every device
        if clip == "norm":
            norm = clip_grad.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        else:
            norm = clip_grad.clip_grad_value_(model.parameters(), 0.1, foreach=True)
        return norm, [p.grad for p in model.parameters()]

    (got_norm, got), (want_norm, want) = clipped(dev), clipped("cpu")
    if clip == "norm":
        assert_same(got_norm, want_norm, rtol=1e-5, atol=1e-6)
    for g, w in zip(got, want):
        assert_same(g, w, rtol=1e-5, atol=1e-6)


def test_a_saved_clone_loads_as_a_tensor_of_its_own(dev, tmp_path):
    # a clone shares its value with the original on the device (values are immutable), not its storage
    a = torch.arange(3.).to(dev)
    torch.save({"a": a, "clone": a.clone(), "detached": a.detach()}, tmp_path / "t.pt")
    loaded = torch.load(tmp_path / "t.pt")
    loaded["clone"].add_(10)
    assert loaded["a"].tolist() == [0.0, 1.0, 2.0]  # as eager: the clone's write changes only the clone
    loaded["detached"].add_(1)
    assert loaded["a"].tolist() == [1.0, 2.0, 3.0]  # a detach() shares a's storage, in eager and here


def test_random_draws_on_a_transposed_tensor_are_eagers(dev):
    # eager's empty_like keeps the input's layout and a draw fills memory in order: found by make fuzz
    results = []
    for device in ("cpu", dev):
        x = torch.arange(20.).view(4, 5).to(device).t().contiguous().t()
        torch.manual_seed(5)
        results.append((nn.functional.dropout(x, 0.5).cpu(), torch.rand_like(x).cpu(), torch.rand(2)))
    for got, want in zip(results[1], results[0]):
        assert torch.equal(got, want)


def test_a_dispatch_mode_sees_the_ops_of_in_place_writes_as_eager_does(dev):
    """xlakit's kernels of in-place ops call its recording directly (functionalization's
    _write_functionally), not through torch's dispatcher, unless a user's TorchDispatchMode is
    active: it sees each write's op, as on eager's CPU tensors, and the values are eager's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    def writes(x, y):
        x.mul_(y)
        x.addcmul_(y, y, value=0.5)
        x.add_(0.5)
        return x

    seen_by = {}
    for device in ("cpu", dev):
        x, y = torch.linspace(-1, 1, 3, device=device), torch.full((3,), 2.0, device=device)
        with Seen() as seen:
            writes(x, y)
        # eager's mode sees the in-place overloads, a lazy one their functional twins below functionalization
        seen_by[device] = ([op.__name__.split(".")[0].rstrip("_") for op in seen.ops], x)
    (eager_ops, want), (lazy_ops, got) = seen_by["cpu"], seen_by[dev]
    assert eager_ops == lazy_ops == ["mul", "addcmul", "add"]
    assert_same(got, want)
