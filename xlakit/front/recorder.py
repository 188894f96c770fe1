"""The torch side: how aten ops on lazy tensors become IR.

PyTorch's functionalization layer turns views and in-place ops into functional
ops before they reach `LazyTensor.__torch_dispatch__` (tensor.py), so the IR
holds only functional ops and an in-place update is a rebinding of the wrapper
to a new `LazyTensor`. Each op is handled as its registration
(lowerings/registry.py, read once: op_info.py) says: recorded as a node (shape
and dtype from torch's meta kernels, memoized: op_shapes.py; Python scalars
checked as eager checks them: scalar_checks.py), decomposed, run eagerly on CPU
(eager.py), or by a handler of its own here (`@handles`).
xlakit's kernels in torch's dispatcher live in functionalization.py.
"""
from __future__ import annotations

import contextlib
import threading

import torch
import torch._decomp
from torch._prims_common import get_computation_dtype

from ..config import config
from ..core import sources, transfer
from ..core.ir import DeviceData, Node, fill
from ..core.record import Trigger
from ..engine.executor import current
from ..engine.values import LiveValue
from ..lowerings import eager, verdicts
from ..lowerings.registry import handles
from ..lowerings.verdicts import NeedsEager
from . import op_shapes, scalar_checks
from .op_info import op_info
from .tensor import DEVICE, LazyTensor, from_host, holding, new_tensor, set_dispatcher, to_host, unwrap, wrap  # noqa: F401

_META = torch.device("meta")


aten = torch.ops.aten


# -- recording ------------------------------------------------------------------
def _operand(value, func, source, tensors: list):
    """What one tensor argument (or lifted float) contributes to a node."""
    if isinstance(value, LazyTensor):
        return value._state.operand()
    if isinstance(value, float):  # in the dtype of the op's first float tensor (a complex one's real part),
        # as torch computes it: complex128 * 0.1 took 0.1 in float32
        float_dtype = next((t.dtype.to_real() for t in tensors if isinstance(t, torch.Tensor)
                            and (t.dtype.is_floating_point or t.dtype.is_complex)), torch.get_default_dtype())
        if op_info(func).opmath_scalar:  # float32 for float16 / bfloat16 (lowerings.Lowering.opmath_scalar)
            float_dtype = get_computation_dtype(float_dtype)
        return transfer.lifted_scalar(value, float_dtype)
    transfer.require_dense(value)  # (a quantized tensor's .to(lazy) stays on the CPU)
    # CPU scalars and CPU index tensors mix with device tensors, as in eager torch
    if value.dim() == 0:  # a CPU scalar (functionalization.py passes x.mul_(2)'s 2 so): uploaded once
        return transfer.lifted_scalar(value.item(), value.dtype)
    data = from_host(value)._state.data  # CPU indices (_record lets no other CPU tensor in)
    data.read_only = True
    return data


def mixed_devices(func, other: torch.device, source) -> RuntimeError:
    """Eager torch's error for an op given tensors on two devices, with the user's line and the remedy."""
    where = f" (at {sources.describe(source)})" if source is not None else ""
    return RuntimeError(
        f"{func}: expected all tensors to be on the same device, but found at least two devices, "
        f"{DEVICE} and {other}{where}. Move the {other.type} tensor with .to(xlakit.device()), "
        f"or the lazy one with .cpu()."
    )


def dispatch(func, args, kwargs):
    info = op_info(func)
    if info.special is not None:
        return info.special(*args, **kwargs)
    if info.functional is not None:
        return _mutate(func, info.functional, args, kwargs)
    if info.foreach is not None:
        return _foreach(info.foreach, args, kwargs)
    return _record(func, args, kwargs, info)


def _foreach(list_args, args, kwargs):
    """A `_foreach_*` op (optimizers' foreach paths) is its per-tensor op, once
    per list element: XLA fuses them in the step's graph anyway."""
    per_tensor, positions = list_args
    params = per_tensor._schema.arguments
    count = len(args[positions[0]])
    results = []
    for i in range(count):
        # the i-th foreach argument is the i-th per-tensor argument, which may be keyword-only
        args_i, kwargs_i = [], dict(kwargs)
        for p, a in enumerate(args):
            value = a[i] if p in positions and a is not None else a
            if params[p].kwarg_only:
                kwargs_i[params[p].name] = value
            else:
                args_i.append(value)
        results.append(dispatch(per_tensor, args_i, kwargs_i))
    return results


def _mutate(func, functional, args, kwargs):
    """An in-place op below functionalization (PyTorch decompositions write
    running statistics with copy_): compute the functional op, rebind self."""
    if "out" in kwargs:
        return _write_out(functional, args, kwargs)
    self = args[0]
    if functional is aten.copy.default:
        value = _copy(*args, **kwargs)
    else:
        value = dispatch(functional, args, kwargs)
    current().register(self, value._state)
    return self


def _write_out(functional, args, kwargs):
    """An out= op below functionalization (a composite kernel such as eye.m
    calls eye.m_out on an empty tensor): compute the functional op, then make
    `out` that value, resized as eager out= ops do."""
    kwargs = dict(kwargs)
    out = kwargs.pop("out")
    if "dtype" in (a.name for a in functional._schema.arguments) and "dtype" not in kwargs:
        kwargs.update(dtype=out.dtype, device=DEVICE)  # a factory makes out's dtype
    value = dispatch(functional, args, kwargs)
    if value.dtype != out.dtype:
        value = _record(aten._to_copy.default, (value,), {"dtype": out.dtype})
    if value.shape != out.shape:  # resize out's TensorImpl in place (the guard: set_data's type check)
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Python)):
            out.data = value
    current().register(out, value._state)
    return out


# The frames the walk for an op's source line skips: _record's, its caller's and that one's, each
# xlakit's (dispatch and __torch_dispatch__, or a handler here, or functionalization's kernels)
_OWN_FRAMES = 3


def _record(func, args, kwargs, info=None):
    """Add one node for `func` to the IR (or run it eagerly when it can't be); `info`: its op_info."""
    info = info or op_info(func)
    if info.decomposition is not None:
        return info.decomposition(*args, **kwargs)
    if info.shape_only_random:
        # drawn by torch's CPU generator (so torch.manual_seed holds) from the
        # input's shape and layout alone: nothing to sync, no graph split
        like = [_HostLike(a) if isinstance(a, LazyTensor) else a for a in args]
        host_kwargs = to_cpu(kwargs)
        return drawn(lambda: func(*[a.host() if isinstance(a, _HostLike) else a for a in like], **host_kwargs))
    engine = current()
    scalars = scalar_checks.given(info, args, kwargs) if info.checked_scalars else ()
    if id(func) not in verdicts.FAILED:  # the op the run it follows had here: reuse its recording if it matches
        # its Python scalars are inputs, not constants: checked by value, as a fresh record's, against the
        # output's dtype once its operands matched (a bfloat16 clamp after float16's was checked as float16's)
        replayed = engine.replay(func, args, kwargs, (lambda aval: scalar_checks.check(
            func, info, scalars, aval)) if scalars else None, _OWN_FRAMES)
        if replayed is not None:
            expected, node = replayed
            outputs = _new_outputs(node, info, args, expected.avals, expected.layouts)
            return expected.structure(outputs) if expected.structure is not None else outputs[0]
    template, tensors, signature = op_shapes.split(func, info, args, kwargs)
    for t in tensors:  # a loop, not a generator: this runs for every recorded op
        if t.__class__ is not LazyTensor and isinstance(t, torch.Tensor) and t.dim() and not info.cpu_indices:
            return _with_host_tensor(func, args, kwargs, template, tensors, signature, t)
    if info.cpu_indices and any(i is not None and i.dtype is torch.uint8 for i in args[1]):
        return run_eagerly(func, args, kwargs, reason="a uint8 index is deprecated: eager's own path, warning "
                                                      "and errors (its meta kernel rejects it)")
    try:
        avals, structure, node_signature, template, layouts = op_shapes.infer(func, template, tensors, signature)
    except NeedsEager as e:
        return run_eagerly(func, args, kwargs, reason=str(e))
    except Exception as e:
        where = sources.describe(sources.capture())
        raise type(e)(f"{func}: {e}" + (f" (at {where})" if where else "")) from e
    if scalars:
        scalar_checks.check(func, info, scalars, avals[0])
    if not info.lowerable:
        return run_eagerly(func, args, kwargs, reason=info.eager_reason)
    if id(func) in verdicts.FAILED:
        return run_eagerly(func, args, kwargs, reason="its XLA lowering failed")
    source = sources.capture(_OWN_FRAMES)
    operands = tuple(_operand(t, func, source, tensors) for t in tensors)
    node = Node(func, operands, template, avals, source, node_signature)
    # a view's storage offset is its input's plus what the view adds (the meta input had none)
    if info.view is not None:
        offset = _view_offset(func, tensors[0], template)
        layouts = tuple(None if layout is None else (layout[0], layout[1] + offset) for layout in layouts)
    engine.recorded(node, template=template, tensors=tensors, structure=structure, layouts=layouts,
                    default_dtype=signature[1])
    outputs = _new_outputs(node, info, args, avals, layouts)
    return structure(outputs) if structure is not None else outputs[0]


def _new_outputs(node, info, args, avals, layouts) -> list:
    if not torch.is_inference_mode_enabled():
        return _outputs(node, avals, layouts)
    if (info.view is not None or node.op.is_view) and not args[0].is_inference():
        # In inference mode a view of a normal tensor is a normal tensor (eager
        # torch). Functionalization gives the view's wrapper the inner value's
        # inference-ness, then the base's version counter, which torch refuses
        # for an inference tensor ("Cannot set version_counter for inference
        # tensor": every view failed under torch.inference_mode, as in torch_xla).
        # `is_view`: the view ops themselves, which a torch.compile graph runs on
        # LazyTensors (functionalization records their _copy forms).
        with torch._C._InferenceMode(False):
            return _outputs(node, avals, layouts)
    return _outputs(node, avals, layouts)


def _outputs(node, avals, layouts):
    if len(avals) == 1:  # most ops: no generator and zip per op, no call of new_tensor
        return [None if avals[0] is None else holding(LiveValue(avals[0], node, 0, None), layouts[0])]
    return [None if aval is None else new_tensor(aval, node, i, layout=layout)
            for i, (aval, layout) in enumerate(zip(avals, layouts))]


def _view_offset(func, base, template) -> int:
    """The storage offset a view adds to: its input's; as_strided's explicit offset is absolute."""
    if func is aten.as_strided_copy.default:
        args, kwargs = template
        if (args[3] if len(args) > 3 else dict(kwargs).get("storage_offset")) is not None:
            return 0
    return base.storage_offset()


def _with_host_tensor(func, args, kwargs, template, tensors, signature, host):
    """A CPU tensor (not a scalar) among lazy ones. Eager torch on a device takes it
    where the op takes CPU tensors by contract (pack_padded_sequence's lengths),
    and raises elsewhere. The op's meta kernel says which: it fails on a meta
    copy of such a tensor and runs with the CPU tensor itself. The values may
    set the output's shape: eager."""
    try:
        op_shapes.infer(func, template, tensors, signature)
    except Exception:  # noqa: BLE001 - the meta copy was refused: try the CPU tensor itself
        metas = [op_shapes.meta(t) if isinstance(t, LazyTensor) else t for t in tensors]
        meta_args, meta_kwargs = fill(op_shapes.meta_template(template), metas)
        try:
            func(*meta_args, **meta_kwargs)
        except Exception as e:  # the meta kernel's own message follows, as the cause
            raise mixed_devices(func, host.device, sources.capture()) from e
        return run_eagerly(func, args, kwargs, reason="takes a CPU tensor; its values may set the output's shape")
    raise mixed_devices(func, host.device, sources.capture())


# -- eager fallback -----------------------------------------------------------
def run_eagerly(func, args, kwargs, *, reason: str):
    """Run one op in eager torch on CPU (eager.py): inputs by a partial sync, results uploaded."""
    source = sources.capture()
    if config.strict_lowering:
        where = f" at {sources.describe(source)}" if source else ""
        raise NotImplementedError(
            f"xlakit: {func} cannot be lowered to XLA ({reason}){where}, and "
            "xlakit.config.strict_lowering is set. Unset it to run such ops eagerly on CPU."
        )
    current().count_fallback()
    if _DRAWS.log is not None and torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
        _DRAWS.log.append(None)
    eager.warn_once(func, reason, source)
    lazy = [a for a in _leaves((args, kwargs)) if isinstance(a, LazyTensor)]
    current().sync([t._state for t in lazy], trigger=Trigger.FALLBACK, source=sources.fallback_line(source, func))
    result = _upload_outputs(eager.run(func, to_cpu(list(args)), to_cpu(kwargs)))
    if _writes_self(func) and isinstance(args[0], LazyTensor):
        # an in-place op below functionalization (torch 2.13 makes randn empty + normal_,
        # which has no functional twin of its name): the host copy it wrote becomes self's value
        current().register(args[0], result._state)
        return args[0]
    return result


def _writes_self(func) -> bool:
    first = func._schema.arguments[:1]
    return bool(first) and first[0].alias_info is not None and first[0].alias_info.is_write


def to_cpu(v):
    if isinstance(v, LazyTensor):
        return transfer.to_host(current().read(v._state).array, v.dtype)
    if isinstance(v, torch.device) and v.type == "lazy":
        return torch.device("cpu")
    if isinstance(v, (list, tuple)):
        return type(v)(to_cpu(x) for x in v)
    if isinstance(v, dict):
        return {k: to_cpu(x) for k, x in v.items()}
    return v


def _upload_outputs(out):
    if isinstance(out, torch.Tensor):
        return from_host(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_upload_outputs(o) for o in out)
    return out


def _leaves(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    else:
        yield value


# -- ops with their own meaning on a lazy device (these overloads only) ----------
_ALIAS = "values are immutable: a new tensor sharing the value, no node, no copy"


@handles("aten::_to_copy.default", reason="a copy to the host is a sync; a cast is recorded")
def _to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if device is not None and torch.device(device).type != "lazy":
        host = to_host(x, trigger=Trigger.CPU)
        return host.to(device=device, dtype=dtype or host.dtype)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    copied = _record(aten._to_copy.default, (x,), kwargs)
    if memory_format is None or not isinstance(copied, LazyTensor):
        return copied
    # one node computes the value, whatever its layout; the copy's strides are the asked format's, as eager's
    return LazyTensor(copied._state, _layout(aten._to_copy.default, (x,), {**kwargs, "memory_format": memory_format}))


@handles("aten::copy.default", reason="the source, cast and expanded: an alias")
def _copy(dst, src, non_blocking=False):
    """src's value in dst's place: cast, broadcast, and laid out as dst (copy_ keeps dst's strides)."""
    if not isinstance(src, LazyTensor):
        transfer.require_dense(src)
        src = from_host(src.to(dtype=dst.dtype).expand(dst.shape))
    if src.dtype != dst.dtype:
        src = _record(aten._to_copy.default, (src,), {"dtype": dst.dtype})
    if tuple(src.shape) != tuple(dst.shape):
        src = _record(aten.expand_copy.default, (src, list(dst.shape)), {})
    return LazyTensor(src._state, (dst.stride(), dst.storage_offset()))


@handles("aten::detach.default", "aten::alias.default", "aten::detach_copy.default", "aten::alias_copy.default",
         "aten::lift_fresh.default", reason=_ALIAS)
def alias(x, *_, **__):
    """A new tensor sharing x's value (values are immutable): no node, no copy."""
    return LazyTensor(x._state, (x.stride(), x.storage_offset()))


@handles("aten::clone.default", reason=_ALIAS)
def _clone(x, **kwargs):
    """x's value (values are immutable), with the strides eager's clone gives it."""
    return LazyTensor(x._state, _layout(aten.clone.default, (x,), kwargs))


def _layout(func, args, kwargs):
    """(strides, storage offset) of func's first output in eager torch, from the shape memo."""
    info = op_info(func)
    template, tensors, signature = op_shapes.split(func, info, args, kwargs)
    strides, offset = op_shapes.infer(func, template, tensors, signature)[4][0]
    return strides, offset + (_view_offset(func, tensors[0], template) if info.view is not None else 0)


@handles("aten::slice_copy.Tensor", reason="a slice of a pending cat is taken from the cat's input")
def _slice_copy(*args, **kwargs):
    piece = _slice_of_cat(*args, **kwargs)
    if piece is None:
        return _record(aten.slice_copy.Tensor, args, kwargs)
    return LazyTensor(piece._state, _layout(aten.slice_copy.Tensor, args, kwargs))


def _slice_of_cat(x, dim=0, start=None, end=None, step=1):
    """A slice of a pending cat that lies inside one of its inputs, taken from
    that input: generate() appends each token with cat and reads the last one
    back, and its decode step should neither hold the growing cat nor change
    shape with every token. None when that does not apply."""
    operand = x._state.operand()
    if operand.__class__ is not tuple or operand[0].op is not aten.cat.default or step != 1:
        return None
    node = operand[0]
    cat_args, cat_kwargs = node.template
    cat_dim = cat_args[1] if len(cat_args) > 1 else dict(cat_kwargs).get("dim", 0)
    shape = node.avals[0].shape
    if dim % len(shape) != cat_dim % len(shape):
        return None
    length = shape[dim]
    start = 0 if start is None else min(max(start + length if start < 0 else start, 0), length)
    end = length if end is None else min(max(end + length if end < 0 else end, 0), length)
    offset = 0
    for piece in node.operands:
        data = piece if piece.__class__ is DeviceData else None
        aval = data.aval if data is not None else piece[0].avals[piece[1]]
        if len(aval.shape) != len(shape) or aval.dtype != x.dtype:
            return None  # a skipped empty input, or a dtype that cat promotes
        size = aval.shape[dim]
        if offset <= start < end <= offset + size:
            inner = new_tensor(aval, None if data else piece[0], 0 if data else piece[1], data)
            if (start, end) == (offset, offset + size):
                return inner
            return _record(aten.slice_copy.Tensor, (inner, dim, start - offset, end - offset), {})
        offset += size
    return None


class _HostLike:
    """A lazy tensor's shape, strides and dtype: `host()` is an uninitialized host tensor laid
    out as it, and a draw into its empty_like fills memory in the order eager's does, so a
    transposed input gets eager's values in eager's places."""

    def __init__(self, t: torch.Tensor):
        self.shape, self.stride, self.dtype = t.shape, t.stride(), t.dtype

    def host(self) -> torch.Tensor:
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype)


class _Draws(threading.local):
    log: list | None = None


_DRAWS = _Draws()


@contextlib.contextmanager
def draws_logged():
    """While a compiled graph is traced: a list of its random draws, in the order they were
    drawn, each (its DeviceData, a function that draws it again from torch's CPU generator),
    or None for a draw that cannot be repeated that way (integrations/dynamo.py)."""
    outer, _DRAWS.log = _DRAWS.log, []
    try:
        yield _DRAWS.log
    finally:
        _DRAWS.log = outer


def drawn(draw) -> LazyTensor:
    """The tensor torch's CPU generator draws (`draw()`), uploaded, and logged with `draw`."""
    value = from_host(draw())
    if _DRAWS.log is not None:
        _DRAWS.log.append((value._state.data, draw))
    return value


@handles("aten::native_dropout.default", reason="eager CPU's dropout: the noise drawn and scaled on the host by "
                                                 "torch's CPU generator, then one multiply in the graph")
def _native_dropout(x, p, train=None):
    """Dropout as eager CPU computes it. torch sends dropout on the lazy device
    to native_dropout (its fused kernel, as on CUDA); on CPU it draws
    `empty_like(x).bernoulli_(1 - p)` and divides that by 1 - p. Drawn and
    scaled the same way on the host, the mask, its values and the generator's
    next state are eager's for the same seed."""
    if train is False or x.numel() == 0:
        return alias(x), from_host(torch.ones(x.shape, dtype=torch.bool))
    like = _HostLike(x)

    def draw():
        noise = torch.empty_like(like.host()).bernoulli_(1 - p)
        return noise.div_(1 - p) if p < 1 else noise   # p == 1 drops everything (native_dropout's scale is 0)
    noise = drawn(draw)
    return _record(aten.mul.Tensor, (x, noise), {}), _record(aten.ne.Scalar, (noise, 0), {})


@handles("aten::_local_scalar_dense.default", reason="a read of the value: a partial sync")
def _local_scalar_dense(x):
    return to_host(x, trigger=Trigger.ITEM).item()


def _no_output(self, assert_msg=None):
    """An assert's node returns an empty bool array (lowerings/asserts.py): its meta."""
    return torch.empty((0,), dtype=torch.bool, device=_META)


@handles("aten::_assert_async", meta=_no_output,
         reason="an in-graph check: the next sync computes it, the read after it raises eager's error")
def _assert_async(cond, assert_msg=None):
    """Eager raises when the one-element `cond` is zero. Recorded as a check
    (lowerings/asserts.py) that the next sync computes, whatever it computes: nothing
    reads an assert's output, so a cut would leave it out. With config.checks off,
    nothing is checked (docs/bad_input.md)."""
    if cond.numel() != 1:  # its shape says so: eager's error now, no sync
        where = sources.describe(sources.capture())
        amount = "no values" if cond.numel() == 0 else "more than one value"
        at = f" (at {where}: aten._assert_async)" if where else ""
        raise RuntimeError(f"Boolean value of Tensor with {amount} is ambiguous{at}. "
                           "Assert one value, e.g. cond.all().")
    if not config.checks:
        return
    if assert_msg is None:
        checked = _record(aten._assert_async.default, (cond,), {})
    else:
        checked = _record(aten._assert_async.msg, (cond, assert_msg), {})
    if isinstance(checked, LazyTensor):  # else it ran eagerly (its lowering failed before): checked there
        current().check_at_next_sync(checked._state)


set_dispatcher(dispatch)
