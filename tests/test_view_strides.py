"""Views carry eager's layout: every view op of PyTorch's OpInfo database has eager's
stride(), storage_offset() and is_contiguous() on xlakit, and contiguous(), reshape() and
flatten() after it copy exactly where eager copies, so a write through the result
changes exactly what eager's changes.

Which ops are views is taken from eager itself (an output that shares its input's
storage), not from a list of ours.
"""
import io
import itertools
import unittest.mock
import warnings

import pytest
import torch
from torch.utils._pytree import tree_flatten

import xlakit

pytest.importorskip("expecttest")  # torch.testing's OpInfo database needs it

SAMPLES_PER_OP = 2
AFTER = {"view itself": lambda t: t, "contiguous": torch.Tensor.contiguous,
         "reshape": lambda t: t.reshape(-1), "flatten": torch.Tensor.flatten}


def _views(out, inp):
    """The outputs of an op that are views of its input, in output order."""
    storage = inp.untyped_storage().data_ptr()
    return [o for o in tree_flatten(out)[0]
            if isinstance(o, torch.Tensor) and o.numel() and o._is_view()
            and o.untyped_storage().data_ptr() == storage]


def _overlaps(t) -> bool:
    """Whether two elements of t are one memory location (an expand, an unfold with step < size)."""
    span = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
    where = torch.arange(span).as_strided(t.shape, t.stride(), t.storage_offset())
    return where.unique().numel() != t.numel()


def _close(got, want) -> bool:
    # XLA fuses the write's multiply and add: a last-place difference is no aliasing difference
    return torch.allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)


def _layout(t):
    return tuple(t.shape), t.stride(), t.storage_offset(), t.is_contiguous()


def _view_samples():
    from torch.testing._internal.common_methods_invocations import op_db

    for op in op_db:
        if torch.float32 not in op.supported_dtypes("cpu") or "empty" in op.name:
            continue
        try:
            # the op's own sample generator: op.sample_inputs wraps it in a tracker that reads the
            # caller's stack (inspect.stack) per op, half of this sweep's time
            torch.manual_seed(0)
            samples = list(itertools.islice(op.sample_inputs_func(op, "cpu", torch.float32, False), SAMPLES_PER_OP))
        except Exception:  # noqa: BLE001 - an op without CPU samples has nothing to compare
            continue
        for sample in samples:
            if not isinstance(sample.input, torch.Tensor):
                continue
            inp = sample.input.to("cpu", copy=True)  # a device copy keeps a dense layout: so does this
            try:
                views = _views(op(inp, *sample.args, **sample.kwargs), inp)
            except Exception:  # noqa: BLE001 - eager rejects this sample
                continue
            if views:
                yield op, sample


def _run(op, sample, device, after, write: bool):
    """(base, view's layout, result's layout, result) after `after` of op's first view, and a write to it."""
    inp = sample.input.to("cpu", copy=True).to(device)
    args = [_move(a, device) for a in sample.args]
    kwargs = {k: _move(v, device) for k, v in sample.kwargs.items()}
    view = _views(op(inp, *args, **kwargs), inp)[0] if device == "cpu" else \
        _first_view_like(op(inp, *args, **kwargs))
    result = after(view)
    layouts = _layout(view), _layout(result)
    if write:
        result.mul_(-3).add_(7)
    return inp.cpu(), *layouts, result.cpu()


def _move(value, device):
    # index arguments stay on the CPU (tensor_split requires its indices there)
    return value.to(device) if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _first_view_like(out):
    # the lazy outputs are matched to eager's by position: the first tensor output that is a view
    tensors = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.numel()]
    return next(t for t in tensors if t._is_view())


def test_every_opinfo_view_has_eagers_layout_and_aliasing(dev):
    """Every sample of every OpInfo view op, then each use in AFTER (11-13 s alone, 14 s in a suite run; torch 2.9 and 2.13)."""
    import torch._lazy

    checked, wrong = set(), []
    # OpInfo's seeding wrapper (dropout) ends with a step marker on "lazy" devices: xlakit's
    with warnings.catch_warnings(), unittest.mock.patch.object(torch._lazy, "mark_step", xlakit.mark_step):
        warnings.simplefilter("ignore")
        for op, sample in _view_samples():
            for name, after in AFTER.items():
                want_base, want_view, want_layout, want = _run(op, sample, "cpu", after, write=False)
                # write only where eager's write is defined: no two elements in one location
                write = not _overlaps(_eager_result(op, sample, after))
                if write:
                    want_base, want_view, want_layout, want = _run(op, sample, "cpu", after, write=True)
                checked.add(op.name)
                where = f"{op.name}{tuple(sample.input.shape)} then {name}"
                try:
                    got_base, got_view, got_layout, got = _run(op, sample, dev, after, write=write)
                except Exception as e:  # noqa: BLE001 - reported with the others
                    wrong.append(f"{where}: {type(e).__name__}: {e}")
                    continue
                if got_view != want_view:
                    wrong.append(f"{where}: view (shape, stride, offset, contiguous) {got_view}, eager {want_view}")
                elif got_layout != want_layout:
                    wrong.append(f"{where}: result {got_layout}, eager {want_layout}")
                elif not (_close(got_base, want_base) and _close(got, want)):
                    wrong.append(f"{where}: after a write to the result, the base differs from eager's by up to "
                                 f"{(got_base - want_base).abs().max().item()}")
    assert len(checked) >= 40, sorted(checked)  # the sweep found PyTorch's view ops
    assert not wrong, "\n".join(wrong)


def _eager_result(op, sample, after):
    inp = sample.input.to("cpu", copy=True)
    return after(_views(op(inp, *sample.args, **sample.kwargs), inp)[0])


MOVES = {
    "t().contiguous()": lambda a: a.t().contiguous(),
    "t().reshape(-1)": lambda a: a.t().reshape(-1),
    "t().flatten()": lambda a: a.t().flatten(),
    "t().ravel()": lambda a: a.t().ravel(),
    "t().reshape_as": lambda a: a.t().reshape_as(torch.empty(12)),
    "mT.reshape": lambda a: a.mT.reshape(12),
    "[:, ::2].reshape": lambda a: a[:, ::2].reshape(-1),
    "narrow().reshape": lambda a: a.narrow(1, 1, 2).reshape(-1),
    "expand().reshape": lambda a: a[:1].expand(3, 4).reshape(-1),
    "clone()": lambda a: a.t().clone(),
    "clone(contiguous_format)": lambda a: a.t().clone(memory_format=torch.contiguous_format),
    "view(-1) of a contiguous": lambda a: a.view(-1),
    "[1].reshape": lambda a: a[1].reshape(2, 2),
}


@pytest.mark.parametrize("move", MOVES)
def test_a_copy_made_from_a_view_is_a_copy_as_in_eager(dev, move):
    # issue #24's class 1: x.t() said it was contiguous, so contiguous() and reshape() returned views
    results = {}
    for device in ("cpu", dev):
        a = torch.arange(12.).view(3, 4).to(device)
        y = MOVES[move](a)
        layout = y.stride(), y.storage_offset(), y.is_contiguous()
        a.mul_(10)  # changes y only where y is a view
        y.add_(1)   # changes a only where y is a view
        results[device] = (layout, a.cpu(), y.cpu())
    (want_layout, want_a, want_y), (got_layout, got_a, got_y) = results["cpu"], results[dev]
    assert got_layout == want_layout
    assert torch.equal(got_a, want_a) and torch.equal(got_y, want_y)



_HOST_LAYOUTS = {
    "transposed_dense": lambda: torch.randn(4, 5).t().contiguous().t(),
    "permuted_dense": lambda: torch.randn(2, 3, 4).permute(2, 0, 1).contiguous().permute(1, 2, 0),
    "transposed_view": lambda: torch.randn(4, 5).t(),
    "gapped_view": lambda: torch.randn(4, 6)[:, ::2],
    "channels_last": lambda: torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
}


@pytest.mark.parametrize("make", _HOST_LAYOUTS.values(), ids=_HOST_LAYOUTS.keys())
def test_a_host_tensor_moved_to_the_device_and_back_is_laid_out_as_eager_copies_are(dev, make):
    """torch's own _to_copy makes copies to a device without as_strided contiguous;
    eager's copies to a GPU and back (and torch.save of one) keep a dense tensor's strides."""
    x = make()
    want = torch.empty_like(x).stride()  # what eager's preserve_format copy gives
    moved = x.to(dev)
    assert moved.stride() == want
    assert x.to(dev, torch.float64).stride() == want and torch.as_tensor(x, device=dev).stride() == want
    assert x.to(dev, memory_format=torch.contiguous_format).stride() == x.contiguous().stride()
    if x.dim() == 4:  # a copy to the device in a memory format: eager's copy in it (on the host the same)
        channels_last = x.to(dev, torch.float64, memory_format=torch.channels_last)
        want_cl = x.to(torch.float64, memory_format=torch.channels_last)
        assert channels_last.stride() == want_cl.stride() and torch.equal(channels_last.cpu(), want_cl)
    back = moved.cpu()
    buffer = io.BytesIO()
    torch.save(moved, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    for host in (back, loaded):
        assert host.stride() == want and torch.equal(host, x)
    # random draws are made in memory order: the same mask as eager's
    torch.manual_seed(0)
    eager = torch.nn.functional.dropout(x, 0.5)
    torch.manual_seed(0)
    lazy = torch.nn.functional.dropout(moved, 0.5)
    torch.testing.assert_close(lazy.cpu(), eager)


@pytest.mark.parametrize("convert", [
    lambda t, f: t.to(memory_format=f), lambda t, f: t.to(torch.float64, memory_format=f),
    lambda t, f: t.contiguous(memory_format=f), lambda t, f: t.to(memory_format=f).to(memory_format=torch.contiguous_format)],
    ids=["to", "to_dtype", "contiguous", "and_back"])
@pytest.mark.parametrize("shape, layout", [((2, 3, 4, 5), torch.channels_last), ((2, 3, 2, 4, 5), torch.channels_last_3d)])
def test_a_memory_format_conversion_has_eagers_strides(dev, convert, shape, layout):
    # x.to(memory_format=torch.channels_last) kept contiguous strides on the device: its
    # is_contiguous(memory_format=...) answered wrong, and a view eager allows raised
    eager = torch.randn(shape)
    got, want = convert(eager.to(dev), layout), convert(eager, layout)
    assert (got.stride(), got.dtype) == (want.stride(), want.dtype)
    for memory_format in (layout, torch.contiguous_format):
        assert got.is_contiguous(memory_format=memory_format) == want.is_contiguous(memory_format=memory_format)
    if want.is_contiguous(memory_format=layout):  # channels last in memory: eager views it flat
        order = (0, *range(2, eager.dim()), 1)
        assert torch.equal(got.permute(order).view(-1).cpu(), want.permute(order).view(-1))
    assert got.cpu().stride() == want.stride()


AS_STRIDED_OF_VIEWS = {
    "flat": lambda x: x.view(-1).as_strided((2, 2), (1, 3), 1),
    "slice_default_offset": lambda x: x[1:].as_strided((2, 2), (1, 4)),
    "transpose": lambda x: x.t().as_strided((3,), (5,), 0),
    "narrow": lambda x: x.narrow(1, 1, 2).as_strided((2, 3), (4, 1), 2),
}


@pytest.mark.parametrize("view", AS_STRIDED_OF_VIEWS.values(), ids=AS_STRIDED_OF_VIEWS)
def test_writes_through_an_as_strided_view_of_a_view_reach_the_base(dev, view):
    # functionalization takes as_strided only of a base: an in-place write through
    # x.view(-1).as_strided(...) raised its "view chain" error where eager writes the storage
    def program(x):
        v = view(x)
        v.mul_(10).add_(1)
        return x, v, (v.stride(), v.storage_offset())

    eager = torch.arange(12.0).reshape(3, 4)
    (x, v, layout), (want_x, want_v, want_layout) = program(eager.to(dev)), program(eager.clone())
    xlakit.mark_step()
    assert layout == want_layout
    assert torch.equal(x.cpu(), want_x) and torch.equal(v.cpu(), want_v)


# in-place ops whose functional form's meta kernel lays its output out row-major where
# eager keeps self's strides (zero, uniform) or where eager does too (masked_fill, masked_scatter)
WRITES_LAID_OUT_ROW_MAJOR = {
    "zero_": lambda v: v.zero_(),
    "masked_fill_": lambda v: v.masked_fill_(torch.arange(v.numel(), device=v.device).view(v.shape) % 3 == 0, 2.0),
    "masked_scatter_": lambda v: v.masked_scatter_(torch.ones(v.shape, dtype=torch.bool, device=v.device),
                                                   torch.arange(float(v.numel()), device=v.device)),
    "scatter_": lambda v: v.scatter_(0, torch.zeros((1, *v.shape[1:]), dtype=torch.long, device=v.device), 7.0),
    "bernoulli_": lambda v: v.bernoulli_(0.0),  # a random op, drawn where p makes it certain
    "uniform_": lambda v: v.uniform_(3.0, 3.0),
}


@pytest.mark.parametrize("write", WRITES_LAID_OUT_ROW_MAJOR.values(), ids=WRITES_LAID_OUT_ROW_MAJOR)
def test_writes_through_a_transposed_view_of_a_flat_copy_reach_it(dev, write):
    # functionalization writes the base back through view_copy, whose meta kernel refused the
    # transposed value that eager's kernel copies (the fuzzer's t().flatten().view(5, 4).t())
    def program(x):
        flat = (x * 2).t().flatten()  # exact on both sides
        v = flat.view(5, 4).t()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the random ops run eagerly on the device
            write(v)
        return flat, v, v.stride()

    eager = torch.linspace(-1, 1, 20).reshape(4, 5)
    (flat, v, strides), (want_flat, want_v, want_strides) = program(eager.to(dev)), program(eager.clone())
    xlakit.mark_step()
    assert strides == want_strides
    assert torch.equal(flat.cpu(), want_flat) and torch.equal(v.cpu(), want_v)


NOT_ROW_MAJOR = {
    "transposed_copy": lambda x: x.t().contiguous().t(),   # a tensor of its own, laid out column-major
    "transposed_view": lambda x: x.t(),
    "sliced_transposed_view": lambda x: x.t()[1:],
    "strided_view": lambda x: x.view(-1)[::2],
}


@pytest.mark.parametrize("layout", NOT_ROW_MAJOR.values(), ids=NOT_ROW_MAJOR)
@pytest.mark.parametrize("write", WRITES_LAID_OUT_ROW_MAJOR.values(), ids=WRITES_LAID_OUT_ROW_MAJOR)
def test_an_in_place_write_keeps_the_tensors_strides(dev, write, layout):
    # eager's in-place ops never change a tensor's strides; functionalization lays the tensor out as
    # its functional op's output, row-major for these: a transposed tensor said it was contiguous
    # after zero_ (found by test_fuzz's loops), and reshape and view then decided as for another
    def program(x):
        t = layout(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the random ops run eagerly on the device
            write(t)
        return x, t, (t.stride(), t.is_contiguous())

    eager = torch.linspace(-1, 1, 20).reshape(4, 5)
    (x, t, strides), (want_x, want_t, want_strides) = program(eager.to(dev)), program(eager.clone())
    xlakit.mark_step()
    assert strides == want_strides
    assert torch.equal(x.cpu(), want_x) and torch.equal(t.cpu(), want_t)
