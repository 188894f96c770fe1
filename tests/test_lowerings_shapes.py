"""Shape, layout and factory lowerings (xlakit/lowerings/shapes.py, factories.py)
against eager torch: values, dtypes and shapes, exactly, on the cases that
are easy to get wrong (torch's slice clamping, negative pads, cat's skipped
empty inputs and promotion, arange's count and rounding, linspace's two-sided
formula, casts). strict_lowering is on: a lowering that raises or returns the
wrong shape fails here instead of being computed eagerly on CPU."""
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import xlakit
from xlakit import lowerings

aten = torch.ops.aten


def _f(*shape, dtype=torch.float32):
    """Distinct, exactly representable values."""
    n = 1
    for s in shape:
        n *= s
    values = (torch.arange(n, dtype=torch.float64) * 1.25 - n / 3).reshape(shape)
    return values.to(dtype)


def _i(*shape):
    return _f(*shape, dtype=torch.int64)


# name -> (fn(*tensors, device=...), tensors). fn runs on CPU tensors and on lazy ones.
CASES = {
    # -- slicing: None, negative, clamped, empty, steps -------------------------
    "slice negative start": (lambda x, device: x[-3:], [_f(5, 4)]),
    "slice clamped": (lambda x, device: x[:, -100:100], [_f(3, 4)]),
    "slice end before start": (lambda x, device: x[4:2], [_f(5, 2)]),
    "slice step": (lambda x, device: x[1::3, ::2], [_f(8, 5)]),
    "slice op None bounds": (lambda x, device: aten.slice.Tensor(x, 1, None, -1, 2), [_f(2, 7)]),
    "slice op past the end": (lambda x, device: aten.slice.Tensor(x, 0, 10, 20), [_f(4, 2)]),
    "select negative": (lambda x, device: x.select(1, -1), [_f(3, 4)]),
    "narrow negative start": (lambda x, device: x.narrow(0, -3, 2), [_f(5, 3)]),
    "narrow_copy": (lambda x, device: x.narrow_copy(1, 1, 2), [_f(2, 4)]),
    # -- views ------------------------------------------------------------------
    "view -1": (lambda x, device: x.view(-1, 6), [_f(4, 3, 2)]),
    "reshape of a transpose": (lambda x, device: x.t().reshape(-1), [_f(3, 4)]),
    "permute negative": (lambda x, device: x.permute(-1, 0, 1), [_f(2, 3, 4)]),
    "t 1-d": (lambda x, device: x.t(), [_f(5)]),
    "transpose negative": (lambda x, device: x.transpose(-1, -3), [_f(2, 3, 4)]),
    "expand -1 and new dims": (lambda x, device: x.expand(2, 3, -1, 4), [_f(3, 1, 4)]),
    "expand 0-d": (lambda x, device: x.expand(3, 2), [torch.tensor(1.5)]),
    "squeeze all": (lambda x, device: x.squeeze(), [_f(1, 3, 1, 2)]),
    "squeeze dim not 1": (lambda x, device: x.squeeze(1), [_f(1, 3, 1)]),
    "squeeze dims": (lambda x, device: x.squeeze((0, -1, 1)), [_f(1, 3, 1)]),
    "squeeze 0-d": (lambda x, device: x.squeeze(0), [torch.tensor(2.0)]),
    "unsqueeze -1": (lambda x, device: x.unsqueeze(-1), [_f(2, 3)]),
    "unsqueeze 0-d": (lambda x, device: x.unsqueeze(0), [torch.tensor(2.0)]),
    "movedim": (lambda x, device: x.movedim((0, 1), (-1, 0)), [_f(2, 3, 4)]),
    "unflatten empty": (lambda x, device: x.unflatten(0, (2, 0)), [_f(0, 3)]),
    "diagonal offset": (lambda x, device: x.diagonal(1), [_f(3, 4)]),
    "diagonal negative offset dims": (lambda x, device: x.diagonal(-1, -1, 0), [_f(3, 4, 2)]),
    "diagonal offset past the end": (lambda x, device: x.diagonal(5), [_f(3, 4)]),
    "as_strided overlapping": (lambda x, device: x.as_strided((3, 3), (2, 1), 1), [_f(12)]),
    "as_strided zero stride": (lambda x, device: x.as_strided((2, 4), (0, 3)), [_f(3, 4)]),
    "as_strided_scatter": (lambda x, y, device: x.as_strided_scatter(y, (2, 2), (1, 3), 2),
                           [_f(4, 3), _f(2, 2) * 10]),
    "unfold": (lambda x, device: x.unfold(1, 3, 2), [_f(2, 8)]),
    "unfold 0-d": (lambda x, device: x.unfold(0, 1, 1), [torch.tensor(3.0)]),
    "view_as_real": (lambda x, device: torch.view_as_real(x), [torch.complex(_f(3), _f(3) * 2)]),
    "view_as_complex": (lambda x, device: torch.view_as_complex(x), [_f(3, 2)]),
    "complex broadcast": (lambda re, im, device: torch.complex(re, im), [_f(2, 1), _f(3)]),
    "view as another dtype": (lambda x, device: x.view(torch.int32), [_f(2, 3)]),
    # -- splitting --------------------------------------------------------------
    "split uneven": (lambda x, device: x.split(3, 1), [_f(2, 8)]),
    "split_with_sizes": (lambda x, device: x.split([1, 0, 3]), [_f(4, 2)]),
    "chunk uneven": (lambda x, device: x.chunk(3), [_f(7)]),
    "unbind negative": (lambda x, device: x.unbind(-1), [_f(2, 3)]),
    "tensor_split indices": (lambda x, device: x.tensor_split([1, -1, 10]), [_f(5)]),
    # -- joining: skipped empty inputs, promotion -----------------------------------
    "cat skips 1-d empty": (lambda a, b, c, device: torch.cat([a, b, c], 1), [_f(0), _f(2, 3), _f(2, 1)]),
    "cat all empty": (lambda a, b, device: torch.cat([a, b]), [_f(0), _i(0)]),
    "cat promotes int and float": (lambda a, b, device: torch.cat([a, b]), [_i(2, 2), _f(1, 2)]),
    "cat promotes uint8 and int8": (lambda a, b, device: torch.cat([a, b]),
                                    [torch.tensor([200, 3], dtype=torch.uint8), torch.tensor([-5], dtype=torch.int8)]),
    "cat promotes bool": (lambda a, b, device: torch.cat([a, b]),
                          [torch.tensor([True, False]), torch.tensor([3], dtype=torch.int16)]),
    "stack promotes": (lambda a, b, device: torch.stack([a, b], -1), [_f(3), _i(3)]),
    "stack 0-d": (lambda a, b, device: torch.stack([a, b]), [torch.tensor(1.0), torch.tensor(2.0)]),
    # -- flips, rolls, repeats ------------------------------------------------------
    "flip": (lambda x, device: x.flip(0, -1), [_f(2, 3, 4)]),
    "roll flat": (lambda x, device: x.roll(5), [_f(3, 4)]),
    "roll dims": (lambda x, device: x.roll((1, -2), (0, 1)), [_f(3, 4)]),
    "rot90": (lambda x, device: x.rot90(-1, (1, 2)), [_f(2, 3, 4)]),
    "repeat with new dims": (lambda x, device: x.repeat(2, 1, 3), [_f(2, 2)]),
    "tile": (lambda x, device: x.tile((2,)), [_f(2, 3)]),
    # -- padding: negative pads crop, values cast as torch casts them ----------------
    "pad negative crops": (lambda x, device: F.pad(x, (-1, 2, 1, -2), value=9.5), [_f(4, 5)]),
    "pad float value on ints": (lambda x, device: F.pad(x, (1, 1), value=2.7), [_i(2, 3)]),
    "pad bool": (lambda x, device: F.pad(x, (0, 2), value=1), [torch.tensor([[True, False]])]),
    "reflect 1d": (lambda x, device: F.pad(x, (2, 3), mode="reflect"), [_f(1, 2, 4)]),
    "reflect 2d": (lambda x, device: F.pad(x, (1, 2, 2, 1), mode="reflect"), [_f(1, 1, 3, 4)]),
    "reflect 3d": (lambda x, device: F.pad(x, (1, 1, 1, 0, 0, 1), mode="reflect"), [_f(1, 1, 2, 3, 3)]),
    "replicate 2d": (lambda x, device: F.pad(x, (3, 0, 1, 2), mode="replicate"), [_f(1, 2, 2, 3)]),
    "replicate negative": (lambda x, device: F.pad(x, (-1, 2), mode="replicate"), [_f(1, 2, 4)]),
    "circular": (lambda x, device: F.pad(x, (1, 2), mode="circular"), [_f(1, 2, 4)]),
    "reflection_pad2d_backward": (lambda g, x, device: aten.reflection_pad2d_backward(g, x, [1, 2, 2, 1]),
                                  [_f(1, 6, 7), _f(1, 3, 4)]),
    "replication_pad1d_backward": (lambda g, x, device: aten.replication_pad1d_backward(g, x, [2, 3]),
                                   [_f(2, 9), _f(2, 4)]),
    # -- writing into views -----------------------------------------------------------
    "setitem slice": (lambda x, device: x.__setitem__((slice(None), slice(-3, None)), 7.0) or x, [_f(3, 5)]),
    "setitem step": (lambda x, y, device: x.__setitem__(slice(1, None, 2), y) or x, [_f(5, 2), _f(2, 2) * 3]),
    "fill diagonal view": (lambda x, device: (x.diagonal(-1).fill_(4.0), x)[1], [_f(4, 3)]),
    "select_scatter negative": (lambda x, y, device: x.select_scatter(y, 0, -1), [_f(3, 2), _f(2)]),
    "slice_scatter clamped": (lambda x, y, device: x.slice_scatter(y, 1, -2, 100), [_f(2, 5), _f(2, 2)]),
    "diagonal_scatter": (lambda x, y, device: x.diagonal_scatter(y, -1, 1, 0), [_f(3, 4), _f(3)]),
    "slice_backward": (lambda g, device: aten.slice_backward(g, [4, 6], 1, -4, 100, 2), [_f(4, 2)]),
    "select_backward": (lambda g, device: aten.select_backward(g, [3, 4], 0, -2), [_f(4)]),
    "diagonal_backward": (lambda g, device: aten.diagonal_backward(g, [3, 4], 1, 0, 1), [_f(3)]),
    "tril": (lambda x, device: x.tril(-1), [_f(2, 3, 4)]),
    "triu": (lambda x, device: x.triu(2), [_f(3, 5)]),
    "diag_embed": (lambda x, device: torch.diag_embed(x, 1, 0, 2), [_f(2, 3)]),
    "pixel_shuffle": (lambda x, device: F.pixel_shuffle(x, 2), [_f(1, 8, 2, 3)]),
    "pixel_unshuffle": (lambda x, device: F.pixel_unshuffle(x, 2), [_f(2, 1, 4, 2)]),
    "channel_shuffle": (lambda x, device: F.channel_shuffle(x, 3), [_f(1, 6, 2)]),
    # -- casts -----------------------------------------------------------------------------
    "float to int truncates": (lambda x, device: x.to(torch.int64), [torch.tensor([-2.7, -0.5, 0.5, 2.7, 1e10])]),
    "float to int32": (lambda x, device: x.int(), [torch.tensor([-2.7, 3.9, 70000.5])]),
    "negative float to uint8": (lambda x, device: x.to(torch.uint8), [torch.tensor([-1.5, 300.7, -200.2, 2.9])]),
    "float to int8 wraps": (lambda x, device: x.to(torch.int8), [torch.tensor([-129.0, 200.5, 127.9])]),
    "float to bool": (lambda x, device: x.bool(), [torch.tensor([0.0, -0.0, 0.1, float("nan"), -3.0])]),
    "int to bool": (lambda x, device: x.bool(), [torch.tensor([0, 1, -7])]),
    "bool to float": (lambda x, device: x.float(), [torch.tensor([True, False])]),
    "complex to float keeps real": (lambda x, device: x.to(torch.float32), [torch.tensor([1 + 2j, -3 - 4j])]),
    "complex to bool": (lambda x, device: x.bool(), [torch.tensor([0j, 2j, 1 + 0j])]),
    "double to half": (lambda x, device: x.half(), [torch.tensor([1 / 3, 65519.0, 1e-8], dtype=torch.float64)]),
    # -- factories ---------------------------------------------------------------------------
    "arange float count": (lambda device: torch.arange(0, 1, 0.1, device=device), []),
    "arange float step count": (lambda device: torch.arange(1, 2.5, 0.5, device=device), []),
    "arange float rounding": (lambda device: torch.arange(0.1, 50, 0.37, device=device), []),
    "arange long float rounding": (lambda device: torch.arange(-3, 2000, 0.7, device=device), []),
    "arange double rounding": (lambda device: torch.arange(-1, 1, 0.3, dtype=torch.float64, device=device), []),
    "arange negative step": (lambda device: torch.arange(3, -7, -0.3, device=device), []),
    "arange ints are int64": (lambda device: torch.arange(10, 0, -3, device=device), []),
    "arange float end is float": (lambda device: torch.arange(5.0, device=device), []),
    "arange int dtype": (lambda device: torch.arange(-5, 7, 2, dtype=torch.int32, device=device), []),
    "arange empty": (lambda device: torch.arange(3, 3, device=device), []),
    "linspace float": (lambda device: torch.linspace(-3.3, 7.1, 100, device=device), []),
    "linspace int": (lambda device: torch.linspace(50, 1, 50, dtype=torch.int64, device=device), []),
    "linspace truncates": (lambda device: torch.linspace(0, 10, 7, dtype=torch.int32, device=device), []),
    "linspace half": (lambda device: torch.linspace(-3.3, 7.1, 100, dtype=torch.float16, device=device), []),
    "linspace complex": (lambda device: torch.linspace(0, 1 + 3j, 9, device=device), []),
    "linspace one step": (lambda device: torch.linspace(2.5, 9, 1, device=device), []),
    "linspace tensor ends": (lambda a, b, device: torch.linspace(a, b, 13), [torch.tensor(-2.5), torch.tensor(4.0)]),
    "logspace": (lambda device: torch.logspace(-2, 3, 11, device=device), []),
    "logspace base 2": (lambda device: torch.logspace(0, 10, 11, base=2, device=device), []),
    "eye": (lambda device: torch.eye(3, device=device), []),
    "eye n m": (lambda device: torch.eye(2, 4, dtype=torch.int64, device=device), []),
    "full int": (lambda device: torch.full((2, 3), 7, device=device), []),
    "full float to int": (lambda device: torch.full((2,), -2.7, dtype=torch.int64, device=device), []),
    "full bool": (lambda device: torch.full((2,), True, device=device), []),
    "full 0-d": (lambda device: torch.full((), 2.5, device=device), []),
    "zeros": (lambda device: torch.zeros(2, 0, 3, dtype=torch.int8, device=device), []),
    "ones": (lambda device: torch.ones(3, dtype=torch.complex64, device=device), []),
    "empty then fill_": (lambda device: torch.empty(2, 3, dtype=torch.int64, device=device).fill_(5), []),
    "scalar_tensor": (lambda device: torch.scalar_tensor(-1.5, dtype=torch.float64, device=device), []),
    "full_like": (lambda x, device: torch.full_like(x, 3.9, dtype=torch.int32), [_f(2, 2)]),
    "ones_like": (lambda x, device: torch.ones_like(x), [_i(3)]),
    "new_full": (lambda x, device: x.new_full((2,), 1.5), [_f(3)]),
    "new_zeros": (lambda x, device: x.new_zeros((2, 2)), [_i(1)]),
    "new_ones": (lambda x, device: x.new_ones(3, dtype=torch.bool), [_f(1)]),
    "fill_ float into ints": (lambda x, device: x.fill_(2.9), [_i(2, 3)]),
    "fill_ tensor": (lambda x, v, device: x.fill_(v), [_f(2, 3), torch.tensor(-4.5)]),
    "zero_": (lambda x, device: x.zero_(), [_f(3)]),
    "tril_indices": (lambda device: torch.tril_indices(4, 3, -1, device=device), []),
    "triu_indices": (lambda device: torch.triu_indices(3, 5, 1, device=device), []),
}


def _same(got, want):
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
        return
    assert got.device.type == "lazy"
    host = got.cpu()
    assert (host.dtype, host.shape) == (want.dtype, want.shape)
    torch.testing.assert_close(host, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager(dev, monkeypatch, name):
    monkeypatch.setattr(xlakit.config, "strict_lowering", True)  # no eager CPU fallback hides a bad lowering
    fn, tensors = CASES[name]
    want = fn(*[t.clone() for t in tensors], device="cpu")
    got = fn(*[t.to(dev) for t in tensors], device=dev)
    _same(got, want)
    xlakit.mark_step()
    assert xlakit.metrics()["fallbacks"] == 0


# Composite ops reach the table only from inside PyTorch's decompositions:
# their lowerings are called directly, on jax arrays. name -> (op, args).
DIRECT = {
    "flatten": (aten.flatten.using_ints, [_f(2, 3, 4), 1, -1]),
    "flatten 0-d": (aten.flatten.using_ints, [torch.tensor(2.0)]),
    "unflatten": (aten.unflatten.int, [_f(2, 12), -1, [3, -1]]),
    "atleast_3d": (aten.atleast_3d.default, [_f(4)]),
    "atleast_3d list": (aten.atleast_3d.Sequence, [[_f(2, 3), torch.tensor(1.0)]]),
    "broadcast_tensors": (aten.broadcast_tensors.default, [[_f(3, 1), _f(4)]]),
    "pad reflect": (aten.pad.default, [_f(1, 2, 5), [2, -1], "reflect"]),
    "pad circular": (aten.pad.default, [_f(1, 2, 4), [1, 3], "circular"]),
    "pad constant": (aten.pad.default, [_i(2, 3), [1, -1, 0, 2], "constant", 4.5]),
    "type_as": (aten.type_as.default, [_f(3) * 1.7, _i(1)]),
    "tensor_split sections": (aten.tensor_split.sections, [_f(7, 2), 3]),
    "chunk": (aten.chunk.default, [_f(5, 2), 2, 0]),
    "swapaxes": (aten.swapaxes.default, [_f(2, 3, 4), 0, -1]),
    "mH": (aten.mH.default, [torch.complex(_f(2, 3), _f(2, 3) + 1)]),
    "block_diag": (aten.block_diag.default, [[_f(2, 3), _i(1, 2), torch.tensor(5.0)]]),
    "diag of a vector": (aten.diag.default, [_f(3), -1]),
    "to other": (aten.to.other, [_f(3) * 1.7, _i(1)]),
    "range": (aten.range.step, [0, 1, 0.1]),
}


def _to_jax(value):
    if isinstance(value, torch.Tensor):
        return jnp.asarray(value.numpy())
    if isinstance(value, list):
        return [_to_jax(v) for v in value]
    return value


@pytest.mark.parametrize("name", sorted(DIRECT))
def test_composite_lowerings_match_eager(dev, name):  # dev: xlakit's runtime (JAX in 64 bits)
    op, args = DIRECT[name]
    with torch.no_grad():
        want = op(*args)
    got = lowerings.find(op).fn(*_to_jax(args))
    wants = want if isinstance(want, (tuple, list)) else [want]
    gots = got if isinstance(got, (tuple, list)) else [got]
    assert len(gots) == len(wants)
    for g, w in zip(gots, wants):
        g = torch.from_numpy(np.asarray(g)).to(w.dtype)  # the caller casts to torch's dtype
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("module", ["shapes", "factories"])
def test_every_key_names_an_existing_op(module):
    """A misspelled key would silently lower nothing."""
    for name, entry in lowerings.TABLE.items():
        if entry.lowering is None or entry.lowering.fn.__module__ != f"xlakit.lowerings.{module}":
            continue
        namespace, rest = name.split("::")
        packet_name, _, overload = rest.partition(".")
        packet = getattr(getattr(torch.ops, namespace), packet_name)
        assert packet.overloads(), name
        assert not overload or overload in packet.overloads(), name
