"""The same programs eagerly and through xlakit: values, dtypes and shapes agree."""
import copy

import pytest
import torch

import xlakit
from conftest import assert_same

CASES = {
    "elementwise": lambda a, b: (a * b + a.exp() - b.sin() / 3, (a > b), a.clamp(-0.5, 0.5)),
    "matmul": lambda a, b: (a @ b.T, torch.mm(a, b.T).relu()),
    "reductions": lambda a, b: (a.sum(), a.mean(dim=1), b.amax(dim=0), a.argmax(dim=1), a.std()),
    "broadcasting": lambda a, b: (a + b[0], a * b[:, :1], a - 2.5),
    "indexing": lambda a, b: (a[1], a[:, 1:3], a[a > 0], a[torch.tensor([0, 2])]),
    "int_dtypes": lambda a, b: ((a * 10).long() // 3, (a * 10).int() + 1, torch.arange(5) * 2),
    "addcmul_addcdiv": lambda a, b: (
        torch.addcmul(a, a, b, value=0.3), torch.addcdiv(a, a, b.abs() + 1, value=-2),
        a.clone().addcmul_(b, b[0], value=0.7), torch.addcmul(a.double(), a, b),
        torch.addcmul((a * 9).long(), (a * 9).long(), (b * 9).long(), value=3)),
    "cat_stack": lambda a, b: (torch.cat([a, b]), torch.stack([a, b]).transpose(0, 2)),
    # slices inside one input of a pending cat are taken from that input
    "slices_of_cat": lambda a, b: (
        torch.cat([a, b], 1)[:, -1:], torch.cat([a, b], 1)[:, 4:8], torch.cat([a, b], -1)[:, 5:7],
        torch.cat([a, b], 1)[:, 3:5], torch.cat([a, b], 1)[:, 4::2], torch.cat([a, b])[2:, 1:],
        torch.cat([a, b], 1)[:, 9:99], torch.cat([a.int(), b.long()], 1)[:, -1:], torch.cat([a, b], 1)[:, 5:5]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_functions_match_eager(dev, name):
    torch.manual_seed(0)
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    eager = CASES[name](a, b)
    lazy = CASES[name](a.to(dev), b.to(dev))
    for got, want in zip(lazy, eager):
        assert_same(got, want.to(got.device).cpu() if False else want, rtol=1e-5, atol=1e-5)


def _inplace_program(x, y, sync):
    x.add_(y)
    sync(x)
    x.mul_(2).sub_(y, alpha=0.5)
    v = x[1]
    v.fill_(7.0)          # in-place on a view updates the base
    sync(v)
    x[:, 0] = -1.0        # index_put through a view
    y.zero_()
    return x, y, v


@pytest.mark.parametrize("sync", ["none", "partial", "step"])
def test_inplace_ops_and_views_with_syncs_at_awkward_moments(dev, sync):
    torch.manual_seed(0)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    eager = _inplace_program(x.clone(), y.clone(), lambda t: None)
    sync_fn = {"none": lambda t: None, "partial": lambda t: xlakit.sync([t]),
               "step": lambda t: xlakit.mark_step()}[sync]
    lazy = _inplace_program(x.to(dev), y.to(dev), sync_fn)
    xlakit.mark_step()
    for got, want in zip(lazy, eager):
        assert_same(got, want)


def test_mlp_forward_backward_and_sgd_step_match_eager(dev):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    lazy_model = copy.deepcopy(model).to(dev)
    x, target = torch.randn(8, 6), torch.randint(0, 3, (8,))
    xd, td = x.to(dev), target.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    lazy_opt = torch.optim.SGD(lazy_model.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        for o in (opt, lazy_opt):
            o.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step()
        lazy_loss = torch.nn.functional.cross_entropy(lazy_model(xd), td)
        lazy_loss.backward()
        for p, q in zip(lazy_model.parameters(), model.parameters()):
            assert_same(p.grad, q.grad, rtol=1e-5, atol=1e-6)
        lazy_opt.step()
        xlakit.mark_step()
        assert_same(lazy_loss, loss.detach(), rtol=1e-5, atol=1e-6)
    for p, q in zip(lazy_model.parameters(), model.parameters()):
        assert_same(p, q.detach(), rtol=1e-5, atol=1e-6)


def test_item_print_and_data_dependent_branch(dev, capsys):
    t = torch.tensor([1.5, -2.0, 3.0], device=dev)
    assert t.sum().item() == pytest.approx(2.5)
    assert xlakit.last_step().trigger == "item"
    branch = "pos" if t.sum() > 0 else "neg"
    assert branch == "pos"
    print(t * 2)
    assert "tensor([ 3., -4.,  6.], device='lazy:0')" in capsys.readouterr().out


def test_python_scalar_dtypes_follow_torch(dev):
    i = torch.tensor([1, 2, 3], device=dev)
    f = torch.tensor([1.0, 2.0], device=dev, dtype=torch.float64)
    assert_same(i * 2.5, torch.tensor([1, 2, 3]) * 2.5)
    assert_same(i + 1, torch.tensor([2, 3, 4]))
    assert_same(f * 0.1, torch.tensor([1.0, 2.0], dtype=torch.float64) * 0.1)
    assert_same((i > 1.5), torch.tensor([False, True, True]))


@pytest.mark.parametrize("device", ["lazy", "cpu"])
def test_inplace_pointwise_errors_match_eager(dev, device):
    # xlakit functionalizes addcmul_/addcdiv_/lerp_ itself, for every device (a
    # CPU tensor meets it inside a functional wrapper): eager's in-place rules hold
    def put(t):
        return t.to(dev) if device == "lazy" else torch._to_functional_tensor(t)

    def host(t):
        if device == "lazy":
            return t.cpu()
        torch._sync(t)
        return torch._from_functional_tensor(t)

    x, wide = put(torch.zeros(3)), put(torch.ones(2, 3))
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        x.addcmul_(wide, wide)
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
        put(torch.zeros(3, dtype=torch.long)).addcmul_(x, x)
    assert host(x).tolist() == [0.0] * 3  # a rejected update changes nothing
    halves = torch.full((3,), 0.5, dtype=torch.float64)
    got = x.addcmul_(put(halves), put(halves))  # float64 operands, float32 self: cast, as eager does
    want = torch.zeros(3).addcmul_(halves, halves)
    assert_same(host(got), want)


# xlakit's own Functionalize kernels (front/functionalization.py: _functionalized_inplace), each with
# what eager's in-place rules decide: broadcasting, casts, Python numbers, views and layouts
_OWN_INPLACE = {
    "add_": lambda x, y: x.add_(y, alpha=2), "sub_": lambda x, y: x.sub_(y), "mul_": lambda x, y: x.mul_(y),
    "div_": lambda x, y: x.div_(y), "lerp_": lambda x, y: x.lerp_(y, 0.25),
    "addcmul_": lambda x, y: x.addcmul_(y, y, value=0.5), "addcdiv_": lambda x, y: x.addcdiv_(y, y + 3, value=-0.5),
}
_INPLACE_CASES = {
    "same_shape": lambda: (torch.arange(6.0).view(2, 3), torch.linspace(-1, 1, 6).view(2, 3)),
    "broadcast_other": lambda: (torch.arange(6.0).view(2, 3), torch.tensor([0.5, -1.0, 2.0])),
    "wider_other": lambda: (torch.arange(3.0), torch.ones(2, 3)),
    "python_float": lambda: (torch.arange(6.0).view(2, 3), 0.75),
    "int_self_float_other": lambda: (torch.arange(6).view(2, 3), torch.full((2, 3), 1.5)),
    "int_self_python_float": lambda: (torch.arange(6).view(2, 3), 1.5),
    "bool_self_int_other": lambda: (torch.tensor([True, False]), torch.tensor([1, 2])),
    "half_self_float_other": lambda: (torch.arange(6.0, dtype=torch.float16).view(2, 3), torch.full((2, 3), 0.1)),
    "transposed_self": lambda: (torch.arange(6.0).view(3, 2).t(), torch.linspace(-1, 1, 6).view(2, 3)),
    "row_of_self": lambda: (torch.arange(6.0).view(2, 3)[1], torch.tensor([2.0, 3.0, 4.0])),
}


@pytest.mark.parametrize("case", _INPLACE_CASES)
@pytest.mark.parametrize("write", _OWN_INPLACE)
def test_own_inplace_kernels_match_eager(dev, write, case):
    """Each: eager's value, dtype, shape and strides (of the result and, for a view, its base), or an
    error where eager raises one, with nothing changed."""
    def run(device):
        base, other = _INPLACE_CASES[case]()
        full = base._base if base._base is not None else base
        full = full.to(device)
        self = full if base._base is None else full.as_strided(base.shape, base.stride(), base.storage_offset())
        other = other.to(device) if isinstance(other, torch.Tensor) else other
        try:
            out = _OWN_INPLACE[write](self, other)
        except (RuntimeError, TypeError) as e:
            return type(e), full.cpu()
        assert out is self
        return (out.cpu(), out.stride()), full.cpu()

    (want, want_base), (got, got_base) = run("cpu"), run(dev)
    if isinstance(want, type):  # (xlakit's words are its meta kernels', at times not eager's)
        assert got is want
    else:
        assert got[1] == want[1]  # strides
        assert_same(got[0], want[0])
    assert_same(got_base, want_base)


_DOUBLE_WRITES = {
    "mul_": lambda x, n: x.mul_(n), "div_": lambda x, n: x.div_(n), "sub_": lambda x, n: x.sub_(n),
    "add_alpha": lambda x, n: x.add_(n, alpha=3), "mul_out": lambda x, n: torch.mul(x, n, out=x),
    "lerp_": lambda x, n: x.lerp_(x * 2, 0.1), "addcmul_": lambda x, n: x.addcmul_(x, x, value=0.1),
    "times_a_float": lambda x, n: x * 0.1,  # out of place: a complex128 x took 0.1 in float32 too
}


@pytest.mark.parametrize("number", [0.1, 0.1 + 0.3j])
@pytest.mark.parametrize("write", _DOUBLE_WRITES)
def test_a_python_number_in_a_double_op_keeps_its_full_value(dev, write, number):
    """A Python number reaches xlakit's in-place kernels as a Python float: made a 0-d tensor of the
    default dtype, 0.1 was 0.1 rounded to float32, and a float64 result was off by ~1e-8 of itself
    (a float with a complex128 tensor likewise).
    float64's own rounding is ~1e-16 an op, so 1e-14 tells the two apart on any machine."""
    dtype = torch.complex128 if isinstance(number, complex) else torch.float64
    want = _DOUBLE_WRITES[write](torch.linspace(0.5, 3, 6, dtype=dtype), number)
    got = _DOUBLE_WRITES[write](torch.linspace(0.5, 3, 6, dtype=dtype).to(dev), number)
    assert_same(got, want, rtol=1e-14, atol=0)


def test_the_first_write_of_a_tensor_an_op_made_is_undone_by_a_failed_step(dev):
    """A tensor made by an op is a user's from its first in-place write (tensor.own_at_write), by
    each of xlakit's own kernels as by torch's: a failed step gives its value back, as eager keeps it."""
    made = [torch.ones(2, 3, device=dev) * 2 for _ in _OWN_INPLACE]
    xlakit.mark_step()
    before = [t.cpu() for t in made]
    bad = torch.ones(2, 3, device=dev).index_select(0, torch.tensor([0, 7]).to(dev))
    for t, write in zip(made, _OWN_INPLACE.values()):
        write(t, bad)
    with pytest.raises(IndexError, match="index_select"):
        xlakit.mark_step()
        xlakit.wait()
    for t, want in zip(made, before):
        assert_same(t, want)


def test_compiled_cpu_inplace_ops_still_match_eager():
    # torch.compile's own functionalization reaches the same kernels
    def fn(p, g):
        p = p.clone()
        p.addcmul_(g, g, value=0.1).lerp_(g, 0.3)
        p[1:].addcdiv_(g[1:], g[1:].abs() + 1, value=-0.5)
        return p

    p, g = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(torch.compile(fn, backend="aot_eager")(p, g), fn(p, g))


def test_writes_to_a_host_tensor_after_it_moved_leave_the_device_copy_alone(dev):
    """JAX's CPU client may alias host memory on upload: .to(), copy_() and load_state_dict()
    copy, so a later in-place write on the host (an eager optimizer step) is not seen."""
    a = torch.ones(3)
    moved = a.to(dev)
    a.add_(1)
    host_model, device_model = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).to(dev)
    device_model.load_state_dict(host_model.state_dict())
    before = host_model.weight.detach().clone()
    with torch.no_grad():
        host_model.weight.add_(100)
    source, target = torch.zeros(2, 2), torch.zeros(2, 2, device=dev)
    target.copy_(source)
    source.add_(5)
    half = torch.ones(2, dtype=torch.bfloat16)
    moved_half = half.to(dev)
    half.mul_(3)
    torch.testing.assert_close(moved.cpu(), torch.ones(3))
    torch.testing.assert_close(device_model.weight.cpu(), before)
    torch.testing.assert_close(target.cpu(), torch.zeros(2, 2))
    torch.testing.assert_close(moved_half.cpu(), torch.ones(2, dtype=torch.bfloat16))
