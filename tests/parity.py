"""Scenarios run on eager torch, xlakit and torch_xla, each recording values,
compile counts and donations. Used by tests/test_parity.py and docs/torch_xla.md's table."""
from __future__ import annotations

import os
import tempfile

import torch

import xlakit


class Eager:
    name = "eager"

    def device(self):
        return torch.device("cpu")

    def step(self):
        pass

    def partial_sync(self, tensors):
        pass

    def save(self, t, path):
        torch.save(t, path)

    def compiles(self):
        return 0

    def donations(self):
        return 0


class Xlakit(Eager):
    name = "xlakit"

    def __init__(self):
        xlakit.clear_cache()  # compile counts must not depend on what ran before
    def device(self):
        return xlakit.device()

    def step(self):
        xlakit.mark_step()

    def partial_sync(self, tensors):
        xlakit.sync(tensors)

    def save(self, t, path):
        xlakit.save(t, path)

    def compiles(self):
        return xlakit.metrics()["compiles"] + xlakit.metrics()["persistent_cache_hits"]

    def donations(self):
        return xlakit.metrics()["donated_buffers"]


class TorchXla(Eager):
    name = "torch_xla"

    def __init__(self):
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.metrics as met

        self.tx, self.xm, self.met = torch_xla, xm, met

    def device(self):
        return self.tx.device()

    def step(self):
        self.tx.sync()

    def partial_sync(self, tensors):
        # torch_xla's raw partial sync: what xm.save did before #8422 was fixed
        self.tx._XLAC._xla_sync_multi(tensors, devices=[], wait=True)

    def save(self, t, path):
        self.xm.save(t, path)

    def compiles(self):
        return self.met.counter_value("UncachedCompile") or 0

    def donations(self):
        data = self.met.metric_data("InputOutputAliasCount")
        return int(data[1]) if data else 0


def _values(*tensors):
    return [t.cpu().tolist() for t in tensors]


def donor(b):
    dev = b.device()
    t0, t1 = torch.tensor([1], device=dev), torch.tensor([2], device=dev)
    b.step()
    t1.add_(t0)
    b.step()
    t2 = t1 + t0
    b.step()
    return _values(t1, t2)


def _pending_read_of_updated_buffer(b):
    """t2 = t0 + t1 is pending when t1 is updated in place: (t1, t2)."""
    dev = b.device()
    t0, t1 = torch.tensor([1], device=dev), torch.tensor([2], device=dev)
    b.step()
    t2 = t0 + t1
    t1.add_(1)
    return t1, t2


def save(b):
    t1, t2 = _pending_read_of_updated_buffer(b)
    with tempfile.TemporaryDirectory() as d:
        b.save(t1, os.path.join(d, "t1.pt"))
        b.step()
        return _values(t2) + [torch.load(os.path.join(d, "t1.pt")).tolist()]


def partial_sync(b):
    t1, t2 = _pending_read_of_updated_buffer(b)
    b.partial_sync([t1])
    b.step()
    return _values(t1, t2)


def _double(x):
    return x * 2 + 1


def _double_elsewhere(y):

    return y * 2 + 1


def metadata(b):
    x = torch.arange(4.0).to(b.device())
    b.step()
    before = b.compiles()
    r1 = _double(x)
    b.step()
    r2 = _double_elsewhere(x)
    b.step()
    return _values(r1, r2) + [b.compiles() - before]


def learning_rate(b):
    dev = b.device()
    w, g = torch.ones(4).to(dev), torch.full((4,), 0.5).to(dev)
    b.step()
    w.add_(g, alpha=-0.1)
    b.step()
    before = b.compiles()
    for step in range(1, 6):
        w.add_(g, alpha=-0.1 / (step + 1))
        b.step()
    return _values(w) + [b.compiles() - before]


def view_mutation(b):
    base = torch.arange(12.0).reshape(3, 4).to(b.device())
    row, col = base[1], base[:, 2]
    b.step()
    row.mul_(10)
    col.add_(1)
    b.step()
    base.t()[0].fill_(-1)
    return _values(base, row, col)


def wiring(b):
    dev = b.device()
    a, c = torch.tensor([2.0, 3.0], device=dev), torch.tensor([5.0, 7.0], device=dev)
    b.step()
    r1 = a * c + a
    b.step()
    r2 = a * c + c
    b.step()
    return _values(r1, r2)


def training_loop(b):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(b.device())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(6, 4).to(b.device()), torch.randn(6, 2).to(b.device())
    b.step()
    compiles, donations, losses = b.compiles(), b.donations(), []
    for _ in range(4):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        b.step()
        losses.append(round(loss.item(), 5))
    return [losses, [round(v, 5) for v in model[0].weight.detach().cpu().flatten().tolist()[:4]],
            b.compiles() - compiles, b.donations() - donations]


SCENARIOS = {f.__name__: f for f in (donor, save, partial_sync, metadata, learning_rate, view_mutation,
                                      wiring, training_loop)}


def run(backend, name):
    """('ok', result) or ('error', 'ExceptionType: first line')."""
    try:
        return "ok", SCENARIOS[name](backend)
    except Exception as e:  # noqa: BLE001 - a backend's crash is a recorded outcome
        return "error", f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
