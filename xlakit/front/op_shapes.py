"""A recorded op's arguments split into tensors and constants (lifted scalars are tensors),
and its outputs' avals, structure and layouts from torch's meta kernels, memoized by
(op, input avals, constants).
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

from ..core.ir import Aval, Slot, fill
from ..core.state import PROCESS
from ..lowerings import registry
from ..lowerings.verdicts import NeedsEager
from .op_info import OpInfo, op_info

_META = torch.device("meta")


_LIFTED = ("lifted-scalar",)


def split(func, info: OpInfo, args, kwargs):
    """Separate tensors from constants.

    Returns (template, tensors, signature): template has `Slot`s where tensors
    (and lifted scalars) were; signature replaces tensors by their avals and is
    the memo key for shape inference, with the default dtype, which meta
    kernels read (int tensor / 4, arange(0., 3.), eye(2)).
    """
    tensors: list = []
    arg_template, arg_signature = [], []
    for value, lifted in zip(args, info.scalar_args):
        t, sig = _split_one(value, tensors, lifted)
        arg_template.append(t)
        arg_signature.append(sig)
    kw_template, kw_signature = [], []
    for name, value in kwargs.items():
        t, sig = _split_one(value, tensors, name in info.scalar_kwargs)
        kw_template.append((name, t))
        kw_signature.append((name, sig))
    template = (tuple(arg_template), tuple(kw_template))
    return template, tensors, (id(func), torch.get_default_dtype(), tuple(arg_signature), tuple(kw_signature))


# Module-level, not nested: a recursive closure forms a reference cycle that
# would keep every tensor it saw alive until the garbage collector runs.
def _split_one(value, tensors: list, lifted: bool):
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return Slot(len(tensors) - 1), (value.shape, value.dtype, value.stride())
    if isinstance(value, (list, tuple)):
        parts = [_split_one(v, tensors, False) for v in value]
        return tuple(p[0] for p in parts), tuple(p[1] for p in parts)
    if lifted and type(value) is float:
        tensors.append(value)
        return Slot(len(tensors) - 1), _LIFTED
    if isinstance(value, torch.device):
        return value, str(value)
    if isinstance(value, (float, complex)):  # exact: 0.0 == -0.0, yet 1 / x tells them apart
        return value, (value.__class__, repr(value))
    return value, (value.__class__, value)


# memo: signature -> (output avals, output structure, node signature bytes, template, output layouts).
# A signature determines its template, so nodes share the memo's template: fewer
# objects per recorded op outlive it, and Python's collector runs less often.
# Bounded (~1.2 KB each; ever-new slice offsets would grow it without end): the oldest go first.
_SHAPES_LIMIT = 8192


_SHAPES: dict = PROCESS.memo("front.op_shapes: shapes", _SHAPES_LIMIT,
                             "output avals per (op, input avals, constants): meta-tensor inference once")


def infer(func, template, tensors, signature):
    cached = _SHAPES.get(signature)
    if cached is not None:
        return cached
    metas = [meta(t) if isinstance(t, torch.Tensor) else t for t in tensors]
    args, kwargs = fill(meta_template(template), metas)
    try:  # torch's meta kernel, or xlakit's own rule where that is CUDA-bound (registry.Policy.meta)
        out = (registry.policy(func).meta or func)(*args, **kwargs)
    except (DynamicOutputShapeException, DataDependentOutputException, NotImplementedError) as e:
        raise NeedsEager("output shape depends on the data") from e
    except RuntimeError as e:
        if "meta" in str(e):  # "cannot repeat_interleave a meta tensor without output_size": it needs the data
            raise NeedsEager(f"its meta kernel cannot say its output ({e})") from e
        raise
    layouts_of = out
    view = op_info(func).view
    if view is not None:  # a view_copy's strides and offset are its view's (the copy's are contiguous)
        try:
            layouts_of = view(*args, **kwargs)
        except RuntimeError:  # a view its input's strides cannot give (a replay off a rewritten base)
            pass
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    if not all(o is None or isinstance(o, torch.Tensor) for o in outputs):
        raise NeedsEager("returns Python values, not tensors")
    # None: an output the op was asked not to compute (e.g. a backward's output_mask)
    avals = tuple(None if o is None else Aval(tuple(o.shape), o.dtype) for o in outputs)
    structure = type(out) if isinstance(out, (tuple, list)) else None
    node_signature = repr((str(func), template, avals)).encode()
    layouts = tuple(None if o is None else (o.stride(), o.storage_offset())
                    for o in (layouts_of if isinstance(layouts_of, (tuple, list)) else (layouts_of,)))
    result = _SHAPES[signature] = (avals, structure, node_signature, template, layouts)
    return result


def meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=_META)


def meta_template(template):
    args, kwargs = template
    return tuple(_to_meta(a) for a in args), tuple((k, _to_meta(v)) for k, v in kwargs)


def _to_meta(v):
    if isinstance(v, torch.device):
        return _META
    if isinstance(v, tuple):
        return tuple(_to_meta(x) for x in v)
    return v
