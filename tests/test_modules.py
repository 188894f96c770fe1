"""Real PyTorch programs on the lazy engine, compared with eager torch."""
import contextlib
import copy

import pytest
import torch
import torch.nn as nn
from conftest import assert_same

import xlakit

TOL = dict(rtol=2e-4, atol=2e-5)


def mlp():
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


def cnn():
    return nn.Sequential(
        # no conv bias before batch norm: its gradient is rounding noise, which Adam amplifies
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(8, 4),
    )


MODELS = {"mlp": (mlp, (16, 8)), "cnn": (cnn, (4, 3, 12, 12))}
OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "adam_foreach": lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=True),
}


def train(model, opt, x, y, steps, sync):
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        losses.append(loss.detach())
    return losses


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_training_matches_eager(dev, model_name, opt_name):
    make, shape = MODELS[model_name]
    torch.manual_seed(0)
    model = make()
    lazy_model = copy.deepcopy(model).to(dev)
    x, y = torch.randn(*shape), torch.randint(0, 4, (shape[0],))
    eager_losses = train(model, OPTIMIZERS[opt_name](model.parameters()), x, y, 5, lambda: None)
    records = []

    def step():
        xlakit.mark_step()
        records.append(xlakit.last_step())

    lazy_optimizers = [OPTIMIZERS[opt_name](lazy_model.parameters())]
    lazy_losses = train(lazy_model, lazy_optimizers[0], x.to(dev), y.to(dev), 5, step)
    for got, want in zip(lazy_losses, eager_losses):
        assert_same(got, want, **TOL)
    for (name, p), q in zip(lazy_model.state_dict().items(), model.state_dict().values()):
        assert_same(p, q, **TOL)
    names = {id(p): n for n, p in lazy_model.named_parameters()}
    expected = set(names.values())
    expected |= {f"{names[id(p)]}.{key}" for p, state in lazy_optimizers[-1].state.items()
                 for key, v in state.items() if isinstance(v, torch.Tensor) and v.device == dev}
    for r in records[1:]:
        # every parameter and every optimizer-state tensor on the device is donated
        assert expected <= {d.label for d in r.donated}, r
    assert all(r.cache == "hit" for r in records[2:]), [r.cache for r in records]


def test_donation_entries_name_module_parameters(dev):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4).to(dev)
    for _ in range(2):  # the first step too: its buffers came from model.to()
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        xlakit.mark_step()
        labels = sorted(d.label for d in xlakit.last_step().donated)
        assert labels == ["0.bias", "0.weight", "2.bias", "2.weight"]


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_transformer_encoder_forward_backward_matches_eager(dev, train):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0,
                                       batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).train(train)
    lazy_model = copy.deepcopy(model).to(dev)
    x = torch.randn(2, 10, 64)
    out = model(x)
    out.pow(2).mean().backward()
    lazy_out = lazy_model(x.to(dev))
    lazy_out.pow(2).mean().backward()
    xlakit.mark_step()
    assert_same(lazy_out, out.detach(), **TOL)
    for (name, p), q in zip(lazy_model.named_parameters(), model.parameters()):
        assert_same(p.grad, q.grad, rtol=1e-3, atol=1e-5)


ZOO = {
    "conv1d": (lambda: nn.Conv1d(4, 6, 3, stride=2), lambda: torch.randn(2, 4, 11)),
    "embedding": (lambda: nn.Sequential(nn.Embedding(10, 5), nn.LayerNorm(5)),
                  lambda: torch.randint(0, 10, (3, 7))),
    "mha": (lambda: nn.MultiheadAttention(16, 4, batch_first=True), lambda: torch.randn(2, 5, 16)),
    "dropout_eval": (lambda: nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.5)).eval(),
                     lambda: torch.randn(4, 6)),
    "gelu_softmax": (lambda: nn.Sequential(nn.Linear(6, 6), nn.GELU(), nn.Softmax(-1)),
                     lambda: torch.randn(4, 6)),
}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_module_forward_backward_matches_eager(dev, name):
    make, data = ZOO[name]
    torch.manual_seed(0)
    model, x = make(), data()
    lazy_model = copy.deepcopy(model).to(dev)

    def run(m, inp):
        out = m(inp, inp, inp)[0] if name == "mha" else m(inp)
        out.square().mean().backward()
        return out

    out, lazy_out = run(model, x), run(lazy_model, x.to(dev))
    xlakit.mark_step()
    assert_same(lazy_out, out.detach(), **TOL)
    for p, q in zip(lazy_model.parameters(), model.parameters()):
        assert_same(p.grad, q.grad, rtol=1e-3, atol=1e-5)


def test_state_dict_round_trip(dev):
    torch.manual_seed(0)
    model = mlp().to(dev)
    fresh = mlp()
    model.load_state_dict(fresh.state_dict())
    for p, q in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert_same(p, q)


def test_no_grad_and_zero_grad_set_to_none_false(dev):
    torch.manual_seed(0)
    model = mlp()
    lazy = copy.deepcopy(model).to(dev)
    x = torch.randn(4, 8)
    for m, xi in ((model, x), (lazy, x.to(dev))):
        m(xi).sum().backward()
        m.zero_grad(set_to_none=False)
        m(xi).sum().backward()
        m(xi).sum().backward()           # .grad accumulates
        with torch.no_grad():
            for p in m.parameters():
                p.sub_(0.1 * p.grad)
    for p, q in zip(lazy.parameters(), model.parameters()):
        assert_same(p.grad, q.grad, **TOL)
        assert_same(p, q.detach(), **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int32, torch.int64, torch.bool])
def test_dtypes_and_promotion(dev, dtype):
    torch.manual_seed(0)
    a = (torch.randn(5) * 4).to(dtype)
    b = torch.arange(5, dtype=torch.int64)
    c = torch.ones(5, dtype=torch.float32)
    programs = [
        lambda a, b, c: a + b, lambda a, b, c: a * c, lambda a, b, c: a.to(torch.float64) / 3,
        lambda a, b, c: (a == a), lambda a, b, c: a.sum(), lambda a, b, c: torch.where(a > 0, a, b),
    ]
    for program in programs:
        want = program(a, b, c)
        got = program(a.to(dev), b.to(dev), c.to(dev))
        assert_same(got, want, rtol=1e-2, atol=1e-2)


def test_random_ops_are_seeded_and_have_the_right_statistics(dev):
    torch.manual_seed(123)
    a = torch.rand(20000, device=dev)
    d = nn.functional.dropout(torch.ones(20000, device=dev), p=0.25)
    torch.manual_seed(123)
    b = torch.rand(20000, device=dev)
    assert torch.equal(a.cpu(), b.cpu())
    # without reseeding, every draw and every dropout mask is new (no key baked into an executable)
    draws = []
    for _ in range(3):
        draws.append((torch.rand(64, device=dev) * 1, nn.functional.dropout(torch.ones(64, device=dev), 0.5)))
        xlakit.mark_step()
    for (r1, m1), (r2, m2) in zip(draws, draws[1:]):
        assert not torch.equal(r1.cpu(), r2.cpu()) and not torch.equal(m1.cpu(), m2.cpu())
    x = torch.ones(64, device=dev)
    assert not torch.equal(x.clone().log_normal_().cpu(), x.clone().log_normal_().cpu())
    assert abs(a.mean().item() - 0.5) < 0.02
    kept = (d.cpu() != 0).float().mean().item()
    assert abs(kept - 0.75) < 0.02
    assert torch.allclose(d.cpu()[d.cpu() != 0], torch.tensor(1 / 0.75))
    n = torch.randn(20000, device=dev)
    assert abs(n.mean().item()) < 0.05 and abs(n.std().item() - 1) < 0.05


def test_op_without_lowering_falls_back_and_is_recorded(dev, monkeypatch):
    from xlakit.lowerings import eager
    monkeypatch.setattr(eager, "WARNED", set())  # each op warns once per process
    x = torch.tensor([3.0, 1.0, 2.0], device=dev) * 2
    with pytest.warns(UserWarning, match="runs eagerly on CPU"):
        idx = torch.nonzero(x > 3)
    assert idx.cpu().tolist() == [[0], [2]]
    fallback = [r for r in xlakit.steps() if r.trigger == "fallback"]
    assert fallback and "aten.nonzero" in fallback[-1].source and "test_modules.py" in fallback[-1].source


def test_gradients_do_not_keep_view_bases_alive(dev):
    # a Linear weight's gradient is the transpose of a matmul; materializing its
    # base too would double the step's outputs (and its execution time)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4).to(dev)
    xlakit.mark_step()
    model(x).sum().backward()
    opt.step()
    xlakit.mark_step()
    assert xlakit.last_step().num_outputs == 8  # 4 parameters, 4 gradients


class _ReadThroughAView(nn.Module):
    """A parameter read through a view: its gradient is a contiguous view of an op's output."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 3))

    def forward(self, x):
        return (x * self.w.view(6)).sum()


def test_a_gradient_that_is_a_contiguous_view_is_rebased_without_a_copy(dev):
    # each of GPT-2's 52 gradients (Llama's 39) reaches .grad as such a view: a new tensor holding
    # its value takes its place (front/modules._rebase_grad), and the step computes no view base
    torch.manual_seed(0)
    eager = _ReadThroughAView()
    model = copy.deepcopy(eager).to(dev)
    x = torch.randn(4, 6)
    eager(x).backward()
    xlakit.mark_step()
    model(x.to(dev)).backward()
    assert torch._is_functional_tensor_base(model.w.grad)
    xlakit.mark_step()
    step = xlakit.last_step()
    assert step.num_outputs == 1
    assert_same(model.w.grad.cpu(), eager.w.grad)
    model(x.to(dev)).backward()  # accumulated in place into the rebased gradient, as eager's
    eager(x).backward()
    assert_same(model.w.grad.cpu(), eager.w.grad)


def test_a_moved_modules_parameters_are_the_moved_tensors_not_views_of_them(dev):
    """module.to(device) makes each Parameter around the moved tensor, not a `detach` view of it
    (front/modules._parameters_as_moved: a view replayed itself through dispatch at every in-place
    write); ties, gradients, requires_grad and training stay eager's."""
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    eager[2].weight = eager[0].weight  # tied, as a language model's embedding and head
    eager[2].bias.requires_grad_(False)
    x = torch.randn(3, 4)
    model = copy.deepcopy(eager)
    eager(x).sum().backward()
    model(x).sum().backward()  # gradients made before the move move with it
    model = model.to(dev)
    assert all(type(p) is nn.Parameter and torch._is_functional_tensor_base(p) for p in model.parameters())
    assert model[2].weight is model[0].weight and not model[2].bias.requires_grad
    for p, q in zip(model.parameters(), eager.parameters()):
        assert (p.grad is None) == (q.grad is None)
        if q.grad is not None:
            assert_same(p.grad, q.grad, **TOL)
    dispatched = []
    with torch.no_grad(), _dispatched(dispatched):
        model[0].weight.mul_(0.5)
    assert dispatched == ["aten.mul.Tensor"], dispatched  # no view replayed around the write
    eager_opt, opt = torch.optim.AdamW(eager.parameters(), lr=0.1), torch.optim.AdamW(model.parameters(), lr=0.1)
    with torch.no_grad():
        eager[0].weight.mul_(0.5)
    for _ in range(3):
        eager_opt.step(), opt.step()
        eager_opt.zero_grad(), opt.zero_grad()
        eager(x).sum().backward(), model(x.to(dev)).sum().backward()
        xlakit.mark_step()
    for p, q in zip(model.parameters(), eager.parameters()):
        assert_same(p, q.detach(), **TOL)
    weight = model[0].weight
    model.to(torch.float64)  # a move on the device sets each parameter's data: the same objects, as in eager
    assert model[0].weight is weight and weight.dtype == torch.float64


@contextlib.contextmanager
def _dispatched(ops: list):
    """Each aten op the lazy device records inside the block, by name."""
    from xlakit.front import recorder, tensor

    def spy(func, args, kwargs):
        ops.append(str(func))
        return recorder.dispatch(func, args, kwargs)
    tensor.set_dispatcher(spy)
    try:
        yield
    finally:
        tensor.set_dispatcher(recorder.dispatch)


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_recomputes_on_the_device(dev, reentrant):
    # torch.utils.checkpoint looks up torch.<device type>: it raised "module
    # 'torch' has no attribute 'lazy'". Dropout in the segment: its recomputed
    # mask must be the forward's (lazy random ops draw from the CPU generator,
    # whose state checkpoint restores)
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.5), nn.ReLU(), nn.Linear(32, 4)).to(dev)
    x = torch.randn(16, 8).to(dev).requires_grad_()
    grads = []
    for checkpointed in (False, True):
        torch.manual_seed(1)
        out = checkpoint(model, x, use_reentrant=reentrant) if checkpointed else model(x)
        out.square().mean().backward()
        grads.append([p.grad.cpu() for p in model.parameters()] + [x.grad.cpu()])
        model.zero_grad()
        x.grad = None
    xlakit.mark_step()
    for plain, recomputed in zip(*grads):
        torch.testing.assert_close(recomputed, plain, **TOL)
    assert xlakit.metrics()["fallbacks"] == 0


def test_every_module_registered_into_a_hooked_tree_gets_xlakit_hooks(dev):
    """A module registered in a hooked module is hooked, and so are a new container a hooked
    module is registered in (a ModuleList slice, which transformers models make at every call)
    and that container's other submodules: each names its ops by its path, and its gradients
    keep no view bases."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).to(dev)
    model.append(nn.Sequential(nn.Linear(4, 4)).to(dev))  # made apart, registered into a hooked module
    model[2].append(nn.Identity())  # no tensors: hooked as a hooked module's submodule
    plain = nn.Linear(4, 4)  # on the CPU: not hooked until it joins a hooked module's container
    holder = nn.ModuleList([plain])
    holder.append(model[0])
    sliced = model[:3]  # a new Sequential holding hooked modules
    for m in (*model.modules(), holder, plain, sliced):
        assert any(h is xlakit.front.modules._on_call for h in m._forward_pre_hooks.values()), m
    x = torch.randn(3, 4).to(dev)
    xlakit.mark_step()
    sliced(x).sum().backward()
    xlakit.mark_step()
    assert {"0", "2.0"} <= {n.module for n in xlakit.last_step().graph.nodes}
    assert xlakit.last_step().num_outputs == 4  # the 4 gradients, no view base of one
