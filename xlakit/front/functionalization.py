"""xlakit's kernels in torch's dispatcher, installed once by install.install
(`register_kernels`): the Lazy key's fallback, which makes factories with
device=lazy and copies from the host, Functionalize kernels of xlakit's
own (they serve every device), and one_hot's kernel for the lazy device.
"""
from __future__ import annotations

import warnings

import torch
from torch._subclasses.fake_tensor import is_fake

from ..core import sources, transfer
from ..core.record import Trigger
from ..core.state import PROCESS
from .op_info import functional_variant, op_info
from .recorder import alias, dispatch, mixed_devices, to_cpu
from .tensor import LazyTensor, copy_strides, from_host, own, own_at_write, owned_impls, to_host, unwrap, wrap

aten = torch.ops.aten


# -- the Lazy dispatch key: factories and copies from the host -------------------
_READ_KEYS = (torch._C.DispatchKey.Functionalize, torch._C.DispatchKey.Python, torch._C.DispatchKey.PythonTLSSnapshot)


def _lazy_backend(op, *args, **kwargs):
    """Ops reach the Lazy key only when no argument is a LazyTensor (those stop
    at the Python key first): factories with device=lazy and copies from CPU."""
    if op in (aten._copy_from.default, aten._copy_from_and_resize.default):
        src, dst = args[0], args[1]
        transfer.require_dense(src)
        value = src.to(dtype=dst.dtype)
        if op is aten._copy_from.default:
            value = value.expand(dst.shape)
        return _replace(dst, from_host(value))
    wrap_ = _wrapping()
    if wrap_ is wrap and any(isinstance(a, torch.Tensor) and torch._is_functional_tensor(a) for a in args):
        # torch.tensor([t[0], t[1]]) reads each element (.item()) with Functionalize
        # and Python both skipped: the lazy tensor arrives in its wrapper. Read it
        # as anywhere else (syncing a view replays it through those keys).
        excluded = torch._C._dispatch_tls_local_exclude_set()
        for key in _READ_KEYS:
            excluded = excluded.remove(key)
        with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded):
            return op(*args, **kwargs)
    out = kwargs.get("out")
    if out is None and op_info(op).lowerable:
        return wrap_(dispatch(op, args, kwargs))
    host_args, host_kwargs = to_cpu(list(args)), to_cpu({k: v for k, v in kwargs.items() if k != "out"})
    if out is not None:
        op = functional_variant(op)
    result = op(*host_args, **host_kwargs)
    if out is not None:
        return _replace(out, from_host(result))
    return wrap_(from_host(result))


def _to_copy_from_host(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
                       memory_format=None):
    """A host tensor's copy to the device, laid out as eager's copies to a GPU are:
    torch's own `_to_copy` makes every copy to a device without `as_strided` (Lazy,
    XLA) contiguous, so a transposed tensor lost its strides, and random draws made
    in memory order (dropout's mask) then differed from eager's. Uploaded at once: made as an
    empty device tensor and then written with copy_, as torch's kernel makes it, an upload cost
    ~170 µs, where JAX's device_put takes ~30 (a transformers cache makes two each layer and step)."""
    value = self if dtype is None or dtype == self.dtype else self.to(dtype)
    copy = _wrapping()(from_host(value, strides=copy_strides(self, memory_format or torch.preserve_format)))
    if torch._is_functional_tensor(copy):
        # as written by copy_: else a parameter's first in-place update changes how
        # functionalization replays its views, and a training loop's first step is a graph of
        # its own (one compile more: tests/spmd_cases.py's torch_xla comparison)
        torch._functionalize_commit_update(copy)
    own(copy)  # a user's tensor from the start, as torch.tensor's (front/tensor.py's owners)
    return copy


def _wrapping():
    """How a kernel here returns a lazy value: in a functional wrapper, unless called inside a
    functionalization kernel's redispatch (e.g. empty in eye.m, under linalg.matrix_power): its
    caller wraps it. torch.tensor(...) also skips Functionalize, but skips Python too, and lifts a
    functional result itself."""
    below = (torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.Functionalize)
             and not torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.Python))
    return alias if below else wrap


def _replace(dst: torch.Tensor, inner: LazyTensor) -> torch.Tensor:
    if torch._is_functional_tensor(dst):
        torch._functionalize_replace(dst, inner)
        torch._functionalize_commit_update(dst)
        torch._sync(dst)
        return dst
    raise TypeError(f"cannot copy into {type(dst).__name__} on {dst.device}")


def _lift_fresh_functionalize(t):
    """torch.tensor(..., device=lazy) ends in lift_fresh, which functionalization
    makes a view of a temporary: in-place ops on the result would then update a
    hidden base. A freshly made lazy tensor is its own base. Any other tensor is
    lifted as torch's own kernel lifts it, below Functionalize first: under
    torch.compile that is where FakeTensorMode turns torch.tensor's host constant
    into a fake one (wrapped as it was, the real constant reached the fake mode
    at its move to the device, and AOTAutograd failed on a transformers
    DynamicCache's torch.tensor([], device=...))."""
    if torch._is_functional_tensor(t):
        return t if t.device.type == "lazy" else t.view_as(t)
    with torch._C._ExcludeDispatchKeyGuard(_SKIP_FUNCTIONALIZE):
        t = aten.lift_fresh.default(t)
    return torch._to_functional_tensor(t)


_SKIP_FUNCTIONALIZE = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)


def _write_functionally(functional, self, args, kwargs):
    """PyTorch's generated Functionalize kernel of an in-place op, without its first step:
    running the in-place op on meta copies to catch shape errors. That check is a Python
    meta kernel (addcdiv_ 365 µs a call, measured; a replayed mul_ 30–34 µs with it, 26–27
    without, in paired runs), most of an optimizer step's tracing. The functional op's
    output already says what the check would: its shape must be self's and its dtype
    castable to self's."""
    inner_self = _inner(self)
    inner_args = [_inner(a) for a in args]
    inner_kwargs = {k: _inner(v) for k, v in kwargs.items()}
    with torch._C._ExcludeDispatchKeyGuard(_SKIP_FUNCTIONALIZE):  # below functionalization, as its kernels call
        if inner_self.__class__ is LazyTensor and _lazy_or_host(inner_args) and _lazy_or_host(inner_kwargs.values()) \
                and not torch._C._len_torch_dispatch_stack():
            # where the dispatcher's Python key would lead: ~15 µs less a write than through torch's
            # dispatcher (an optimizer step makes a write per parameter and state)
            out = LazyTensor.__torch_dispatch__(functional, (), (inner_self, *inner_args), inner_kwargs)
        else:
            out = functional(inner_self, *inner_args, **inner_kwargs)
    if out.shape != self.shape:
        raise RuntimeError(f"output with shape {list(self.shape)} doesn't match the broadcast shape "
                           f"{list(out.shape)}")
    if out.dtype is not self.dtype and not torch.can_cast(out.dtype, self.dtype):
        raise RuntimeError(f"result type {out.dtype} can't be cast to the desired output type {self.dtype}")
    torch._functionalize_replace(self, out)
    torch._functionalize_commit_update(self)
    torch._functionalize_sync(self)
    if inner_self.__class__ is not LazyTensor and inner_self.device.type == "xla":
        # torch_xla aliases an in-place update's buffers by this
        torch.ops.aten._propagate_xla_data(inner_self, torch._from_functional_tensor(self))
    return self


def _functionalized_inplace(inplace, functional):
    """The Functionalize kernel of `inplace` for every device: _write_functionally, after the
    writes _checked_writes guards (a host self, a first write, overlapping elements)."""
    def kernel(self, *args, **kwargs):
        if not torch._is_functional_tensor(self):
            if _reads_lazy((*args, *kwargs.values())):
                raise _host_written(inplace, self)
            with torch._C._ExcludeDispatchKeyGuard(_SKIP_FUNCTIONALIZE):
                return inplace(self, *args, **kwargs)
        if self._cdata not in owned_impls:
            own_at_write(self)
        if _plainly_laid_out(self):
            return _write_functionally(functional, self, args, kwargs)
        result = _write_overlapping(inplace, (self, *args), kwargs)
        if result is not None:
            return result
        return _keeping_layout(self, lambda: _write_functionally(functional, self, args, kwargs))
    return kernel


def _inner(a):
    """What a functional wrapper holds, brought up to date; anything else as it is. Not
    torch._sync: a Python wrapper of the C call that costs each argument ~1 µs (a wrapper here
    is never a Python FunctionalTensor, which _is_functional_tensor does not count)."""
    if isinstance(a, torch.Tensor) and torch._is_functional_tensor(a):
        torch._functionalize_sync(a)
        return torch._from_functional_tensor(a)
    return a


def _lazy_or_host(values) -> bool:
    """Whether each tensor among values is a LazyTensor or a plain host tensor: no other
    class whose own __torch_dispatch__ torch would call first."""
    for v in values:
        if isinstance(v, torch.Tensor) and v.__class__ is not LazyTensor and v.__class__ is not torch.Tensor:
            return False
    return True


def _plainly_laid_out(self: torch.Tensor) -> bool:
    """A contiguous tensor has no two elements in one place, and is a view through torch's
    unfold only of a base whose memory is not row-major: no write to it needs _write_overlapping."""
    return self.is_contiguous() and (self._base is None or self._base.is_contiguous())


# -- writes that eager torch checks and functionalization does not ----------------------
# PyTorch's Functionalize kernel of an op that writes a tensor asserts ("mutating a
# non-functional tensor with a functional tensor is not allowed") when the written
# tensor is a plain (host) one and another argument a functional wrapper; it exempts
# torch_xla's device by name only. xlakit's kernel in front of it does what eager
# torch does across devices: copy_ copies (a partial sync, as .cpu()), any other op
# raises eager's error for tensors on two devices.
# It also refuses what eager refuses and functionalization would turn into a sum:
# a write to a tensor where two elements are one memory location (an expand).
def _reads_lazy(values) -> bool:
    for v in values:
        if isinstance(v, (list, tuple)):
            if _reads_lazy(v):
                return True
        elif isinstance(v, torch.Tensor) and torch._is_functional_tensor(v) \
                and isinstance(torch._from_functional_tensor(v), LazyTensor):
            return True
    return False


def _host_written(op, written: torch.Tensor) -> RuntimeError:
    return mixed_devices(op, written.device, sources.capture())


def _overlapping(t: torch.Tensor) -> bool:
    """Whether two elements of t are one memory location by a stride of 0 (an expand):
    eager's `has_internal_overlap` says Yes."""
    return any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride()))


def _may_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of t may be one memory location: no dim, taken by increasing stride,
    steps past everything the smaller ones span."""
    span = 0
    for size, stride in sorted((d for d in zip(t.shape, t.stride()) if d[0] > 1), key=lambda d: d[1]):
        if stride <= span:
            return True
        span += (size - 1) * stride
    return False


# Writes whose result does not read what they overwrite: through overlapping windows they
# give eager's values (as_strided_scatter's lowering writes the changed elements).
_ASSIGNMENTS = {aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default, aten.copy_.default,
                aten.masked_fill_.Scalar, aten.masked_fill_.Tensor, aten.index_fill_.int_Scalar,
                aten.index_fill_.int_Tensor}
_REFUSES_OVERLAP: dict = PROCESS.memo("front.functionalization: refuses overlap", 1 << 10,
                                      "per in-place op, whether eager refuses to write an expanded tensor: asked once")


def _write_overlapping(op, args, kwargs):
    """An in-place write to a lazy tensor whose elements share memory, or that is a view through
    torch's unfold, as eager does it; None when torch's kernel gives eager's result.

    Functionalization's inverse of expand adds the copies of an element up (sum_to), and its
    inverse of unfold (unfold_backward) adds overlapping windows up. Where eager refuses such a
    write (asked once per op, on a small expanded CPU tensor), its error; where it writes
    (fill_, masked_fill_, ...), the op runs on a dense copy, then the copy is scattered into
    the base, which holds each location once (as_strided_scatter).
    Through overlapping windows xlakit's own unfold (see _unfold) makes, an assignment is such a
    scatter already; an update that reads what it writes is applied by eager element by element
    in memory order: xlakit says so and stops."""
    self = args[0]
    if self.device.type != "lazy":
        return None
    through_unfold = _through_torchs_unfold(self)
    if not (through_unfold or _may_overlap(self)):
        return None
    where = sources.describe(sources.capture())
    at = f" (at {where})" if where else ""
    if not _overlapping(self):
        assigns = op in _ASSIGNMENTS or \
            (op is aten.index_put_.default and not (args[3:4] or [kwargs.get("accumulate")])[0])
        if assigns and not through_unfold:
            return None
        if not assigns and _may_overlap(self):
            raise RuntimeError(f"{op}: xlakit does not update a view whose elements overlap (an unfold with step < "
                               "size) in place: eager torch applies the update element by element in memory order. "
                               f"clone() the view first, or assign to it (view[...] = value){at}.")
    else:
        refuses = _REFUSES_OVERLAP.get(op)
        if refuses is None:
            refuses = _REFUSES_OVERLAP[op] = _eager_refuses_overlap(op, args, kwargs)
        if refuses:
            raise RuntimeError(f"{op}: unsupported operation: more than one element of the written-to tensor refers "
                               f"to a single memory location. Please clone() the tensor before performing the "
                               f"operation{at}.")
    dense_base = _dense_base(self)
    if dense_base is None:
        return None
    base, order = dense_base
    dense = self.clone(memory_format=torch.contiguous_format)
    op(dense, *args[1:], **kwargs)
    # the whole base rewritten, not its as_strided view: functionalization refuses a write through
    # an as_strided view of a base that is itself a view (a reshape's copy: x.t().flatten().view(..)).
    # The base's dims in memory order are row-major, which is what as_strided addresses.
    memory = base if order is None else base.permute(order)
    scattered = aten.as_strided_scatter.default(memory, dense, self.shape, self.stride(), self.storage_offset())
    base.copy_(scattered if order is None else scattered.permute(sorted(range(len(order)), key=order.__getitem__)))
    torch._sync(self)
    return self


def _dense_base(t: torch.Tensor) -> tuple[torch.Tensor, list[int] | None] | None:
    """t's base, and the order of its dims in memory where they are not row-major (None:
    row-major), where as_strided can address it: each location once, from offset 0."""
    base = t._base if t._base is not None else t
    if base.device.type != "lazy" or not torch._is_functional_tensor(base) or base.storage_offset() != 0:
        return None
    if base.is_contiguous():
        return base, None
    order = sorted(range(base.dim()), key=lambda d: -base.stride(d))
    dense = torch.empty(base.permute(order).shape, device="meta").stride()
    if any(base.stride(d) != stride for d, stride in zip(order, dense) if base.shape[d] > 1):
        return None
    return base, order


def _through_torchs_unfold(t: torch.Tensor) -> bool:
    """Whether t is a view through torch's unfold kernel (_unfold leaves it the views of a base
    whose memory is not row-major), whose inverse adds overlapping windows up."""
    base = t._base
    if base is None or base.is_contiguous() or not torch._is_functional_tensor(t):
        return False
    return any(isinstance(m, _UNFOLD_VIEW) for m in torch._C._functionalization.get_view_meta_sequence(t))


_UNFOLD_VIEW = torch._C._functionalization.unfold_ViewMeta


def _eager_refuses_overlap(op, args, kwargs) -> bool:
    self = args[0]
    shape = [1 if stride == 0 else size for size, stride in zip(self.shape, self.stride())]
    expanded = torch.zeros(shape, dtype=self.dtype).expand(self.shape)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(expanded, *_zeros_like_on_host(args[1:]), **_zeros_like_on_host(kwargs))
    except RuntimeError as e:
        return "more than one element of the written-to tensor" in str(e)
    return False


def _zeros_like_on_host(v):
    if isinstance(v, dict):
        return {k: _zeros_like_on_host(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_zeros_like_on_host(x) for x in v)
    if isinstance(v, torch.Tensor):
        return torch.zeros(v.shape, dtype=v.dtype)
    return v


def _checked_writes(op, original, functional=None):
    """PyTorch's Functionalize kernel of `op`, unless it writes a host tensor from a lazy one or a
    lazy tensor whose elements share memory (see above). `functional`: op's functional twin, by
    which _write_functionally writes a plainly laid out lazy tensor (not a fake one, which
    torch.compile traces under modes that torch's own kernel meets)."""
    arguments = op._schema.arguments
    written = tuple((i, a.name) for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write)
    read = tuple((i, a.name) for i, a in enumerate(arguments) if not (a.alias_info and a.alias_info.is_write))

    def picked(places, args, kwargs):
        values = [args[i] if i < len(args) else kwargs.get(name) for i, name in places]
        return [t for v in values for t in (v if isinstance(v, (list, tuple)) else (v,))]  # _foreach_*_ lists

    tensor_positions = tuple(i for i, a in enumerate(arguments) if str(a.type) == "Tensor" and not a.kwarg_only)
    inplace = len(written) == 1 and written[0][0] == 0 and not arguments[0].kwarg_only  # self alone written

    def kernel(keyset, *args, **kwargs):
        # Every in-place op on the device comes here: the usual case (a functional self, the only
        # tensor written, laid out so no two elements meet) allocates nothing on its way through,
        # as each allocation brings Python's collector nearer.
        self = args[0] if inplace else None
        if not (isinstance(self, torch.Tensor) and torch._is_functional_tensor(self)):
            targets = picked(written, args, kwargs)
            if not all(isinstance(t, torch.Tensor) and torch._is_functional_tensor(t) for t in targets) \
                    and _reads_lazy(picked(read, args, kwargs)):
                host = next(t for t in targets if isinstance(t, torch.Tensor) and not torch._is_functional_tensor(t))
                if op is not aten.copy_.default:
                    raise _host_written(op, host)
                return host.copy_(to_host(unwrap(args[1]), trigger=Trigger.CPU), *args[2:], **kwargs)
        else:
            if self._cdata not in owned_impls:
                own_at_write(self)
            if not _plainly_laid_out(self):
                result = _write_overlapping(op, args, kwargs)
                if result is not None:
                    return result
                return _keeping_layout(self, lambda: original.call_boxed(keyset, *_numbers(args, tensor_positions),
                                                                         **kwargs))
            if functional is not None and isinstance(torch._from_functional_tensor(self), LazyTensor):
                # a float as it came, lifted by the recorder in the op's dtype: its full value, where a
                # 0-d tensor made of it held it in the default dtype; an int as a 0-d tensor, an input
                # of the step, so a new factor never recompiles (x * 2 keeps its 2 a constant)
                return _write_functionally(functional, self, _numbers(args, tensor_positions, _INTEGRAL)[1:], kwargs)
        return original.call_boxed(keyset, *_numbers(args, tensor_positions), **kwargs)
    return kernel


_NUMBER_DTYPES = {bool: torch.bool, int: torch.int64, float: None, complex: None}
_INTEGRAL = (bool, int)
_DOUBLE = (torch.float64, torch.complex128)


def _numbers(args, positions, kinds=_NUMBER_DTYPES):
    """args, with a Python number of a type in `kinds` at a Tensor's position as
    _numbers_as_tensors makes it."""
    for i in positions:
        if i < len(args) and type(args[i]) in kinds:
            return _numbers_as_tensors(args, positions, kinds)
    return args


def _keeping_layout(self: torch.Tensor, write):
    """An in-place write to a tensor laid out otherwise than row-major keeps its strides, as
    eager's do: functionalization lays the tensor out as its functional op's output, and some
    meta kernels make that row-major where eager's kernel keeps self's (zero_, uniform_) or
    where eager's in-place kernel writes through them (masked_fill_): a transposed tensor
    said it was contiguous after zero_, and reshape and view then decided as for another tensor."""
    shape, layout = self.shape, (self.stride(), self.storage_offset())
    result = write()
    # (an op that changes the shape in place, as stft's resize_ does, lays the result out anew)
    if self.shape == shape and self.stride() != layout[0] and isinstance(torch._from_functional_tensor(self),
                                                                         LazyTensor):
        # (not a fake value, under torch.compile: its graph's outputs are laid out by AOTAutograd)
        torch._functionalize_replace(self, LazyTensor(unwrap(self)._state, layout))
        torch._functionalize_commit_update(self)
        torch._sync(self)
    return result


def _numbers_as_tensors(args, positions, kinds):
    """A Python kernel receives a wrapped number (`torch.mul(x, 0.9, out=y)`) as a Python number,
    which the boxed call back does not take for a Tensor: a 0-d tensor of the dtype that
    promotes as the number would (a float: the default dtype, the same category), or double
    where a tensor operand is double: its value is the number's own, as eager computes
    (in the default dtype a float64 op used 0.9 rounded to float32), and it promotes alike."""
    args = list(args)
    double = any(isinstance(args[i], torch.Tensor) and args[i].dtype in _DOUBLE for i in positions if i < len(args))
    for i in positions:
        if i < len(args) and type(args[i]) in kinds:
            dtype = _NUMBER_DTYPES[type(args[i])]
            if dtype is None:
                real = torch.float64 if double else torch.get_default_dtype()
                dtype = real if type(args[i]) is float else real.to_complex()
            args[i] = torch.scalar_tensor(args[i], dtype=dtype)
    return args


def _writing_ops(skip: set):
    """Every aten op that writes a tensor argument, by its Functionalize kernel."""
    registered = set(torch._C._dispatch_get_all_op_names())  # the JIT's schemas include TorchScript's own
    for schema in torch._C._jit_get_all_schemas():
        name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
        if not schema.name.startswith("aten::") or schema.name in skip or name not in registered:
            continue
        writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        if writes and torch._C._dispatch_has_kernel_for_dispatch_key(name, "Functionalize"):
            yield name


def _unfold(original):
    """unfold on a lazy tensor as the as_strided view of its base that it is:
    functionalization's inverse of unfold (unfold_backward) adds overlapping windows up
    (size > step) and zeroes the elements no window covers, where eager's writes through
    the view change just what they write; as_strided's inverse is a scatter (see
    as_strided_scatter's lowering). Functionalization takes as_strided only of a base (it
    is not compositional), and xlakit's as_strided addresses that base's elements in row-major order:
    a base laid out so from offset 0. Others keep torch's kernel, and a write through its views
    is a scatter into the base (_write_overlapping)."""
    def kernel(keyset, self, dimension, size, step):
        dense_base = _dense_base(self) if self.device.type == "lazy" else None
        if dense_base is not None and dense_base[1] is None:
            base = dense_base[0]
            view = torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device="meta") \
                .unfold(dimension, size, step)
            return aten.as_strided.default(base, view.shape, view.stride(), self.storage_offset() + view.storage_offset())
        return original.call_boxed(keyset, self, dimension, size, step)
    return kernel


def _as_strided(original):
    """as_strided of a lazy view as the as_strided of its base that it is: as_strided addresses
    the storage, not the view (its offset defaults to the view's). Functionalization takes
    as_strided only of a base: a write through x.view(-1).as_strided(...) raised its "view
    chain" error where eager writes. A base not laid out row-major keeps torch's kernel (_unfold)."""
    def kernel(keyset, self, size, stride, storage_offset=None):
        dense_base = _dense_base(self) if self._base is not None and self.device.type == "lazy" else None
        if dense_base is not None and dense_base[1] is None:
            offset = self.storage_offset() if storage_offset is None else storage_offset
            return aten.as_strided.default(dense_base[0], size, stride, offset)
        return original.call_boxed(keyset, self, size, stride, storage_offset)
    return kernel


def _one_hot(self, num_classes=-1):
    """one_hot's composite reads the classes' min and max back to check them
    (two syncs per call) on devices it does not know; recorded as one node,
    its lowering checks them in the step's executable. With num_classes=-1
    the shape depends on the data: the composite, as in eager; and on torch.compile's
    fake tensors (they say they are on the lazy device too), as on any other device."""
    if num_classes < 0 or is_fake(self):
        return aten.one_hot.default.decompose(self, num_classes)
    functional = torch._is_functional_tensor(self)
    out = dispatch(aten.one_hot.default, (unwrap(self),), {"num_classes": num_classes})
    return wrap(out) if functional else out


def _pack_padded_sequence(input, lengths, batch_first):
    """Packing keeps its batch sizes on the host, as eager's does for every device (packed
    RNNs read them there): eager's own kernel gives them, and its checks, from a
    one-feature host tensor of the input's shape; the data are the input's rows, gathered
    by ops autograd records."""
    shape = (*input.shape[:2], 1)
    _, batch_sizes = aten._pack_padded_sequence.default(torch.empty(shape), lengths, batch_first)
    steps = input.transpose(0, 1) if batch_first else input
    return torch.cat([steps[t, :size] for t, size in enumerate(batch_sizes.tolist())]), batch_sizes


def _pad_packed_sequence(data, batch_sizes, batch_first, padding_value, total_length):
    """Unpacking: eager's kernel on the host says the lengths and checks the sizes; the
    padded output is built from the data's rows by ops autograd records."""
    _, lengths = aten._pad_packed_sequence.default(torch.empty(data.shape[0], 1), batch_sizes, batch_first,
                                                   padding_value, total_length)
    sizes = batch_sizes.tolist()
    steps = max(total_length, len(sizes))
    rows, start = [], 0
    for size in sizes + [0] * (steps - len(sizes)):
        rows.append(torch.cat([data[start:start + size],
                               data.new_full((len(lengths) - size, *data.shape[1:]), padding_value)]))
        start += size
    padded = torch.stack(rows)
    return (padded.transpose(0, 1) if batch_first else padded), lengths


_LIBRARIES: list = []  # torch unregisters a library's kernels when the Library object dies


def register_kernels() -> None:
    """The lazy device's kernels in torch's dispatcher (install.install calls this once):
    the Lazy key's fallback (factories, copies from the host) and xlakit's
    Functionalize kernels (which serve every device)."""
    lazy = torch.library.Library("_", "IMPL")
    lazy.fallback(_lazy_backend, "Lazy")
    to_device = torch.library.Library("aten", "IMPL", "Lazy")
    to_device.impl("_to_copy", _to_copy_from_host)  # reached only with no lazy argument: from the host
    functionalize = torch.library.Library("aten", "IMPL", "Functionalize")
    own = ((aten.addcmul_.default, aten.addcmul.default), (aten.addcdiv_.default, aten.addcdiv.default),
           (aten.lerp_.Scalar, aten.lerp.Scalar), (aten.lerp_.Tensor, aten.lerp.Tensor))
    # an optimizer's most frequent writes: on a lazy tensor, written as `own`'s are
    written_functionally = {getattr(aten, f"{name}_").Tensor: getattr(aten, name).Tensor
                            for name in ("add", "sub", "mul", "div")}
    with warnings.catch_warnings():  # it says it overrides torch's kernel: that is the point
        warnings.simplefilter("ignore")
        functionalize.impl("lift_fresh", _lift_fresh_functionalize)
        functionalize.impl(aten.unfold.default, _unfold(torch.library.get_kernel(aten.unfold.default, "Functionalize")),
                           with_keyset=True)
        functionalize.impl(aten.as_strided.default,
                           _as_strided(torch.library.get_kernel(aten.as_strided.default, "Functionalize")),
                           with_keyset=True)
        for inplace, functional in own:
            functionalize.impl(inplace, _functionalized_inplace(inplace, functional))
        for name in _writing_ops({inplace._schema.name for inplace, _ in own}):
            op = torch._library.utils.lookup_op(name)
            functionalize.impl(op, _checked_writes(op, torch.library.get_kernel(op, "Functionalize"),
                                                   written_functionally.get(op)), with_keyset=True)
    autograd = torch.library.Library("aten", "IMPL", "AutogradLazy")
    autograd.impl("one_hot", _one_hot)  # an integer result: nothing for autograd to record
    autograd.impl("_pack_padded_sequence", _pack_padded_sequence)
    autograd.impl("_pad_packed_sequence", _pad_packed_sequence)
    _LIBRARIES.extend((lazy, to_device, functionalize, autograd))
