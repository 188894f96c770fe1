"""The lazy device's tensors: `LazyTensor`, the functional wrapper around it,
and moving values between the host and the device.

A user-visible tensor is a functional wrapper (`torch._to_functional_tensor`)
around a `LazyTensor`, whose value the engine keeps (a `LiveValue`). Every
aten op on a LazyTensor goes to the frontend's dispatcher (front/recorder.py),
which records it as IR; the frontend installs it with `set_dispatcher`.
"""
from __future__ import annotations

import itertools
import time
import weakref

import torch
from torch.utils._pytree import tree_leaves

from ..core import sources, transfer
from ..core.ir import Aval, DeviceData, Node
from ..core.record import Trigger
from ..engine import tape
from ..engine.executor import current
from ..engine.records import TRACE as _TRACE
from ..engine.values import LiveValue
from . import host_reads

DEVICE = torch.device("lazy", 0)
_clock = time.perf_counter


# (strides, storage offset) of a tensor, as eager torch would give it
Layout = tuple


def _no_dispatcher(func, args, kwargs):
    raise RuntimeError("xlakit internal error: xlakit.front.recorder was not imported")


_dispatch = _no_dispatcher


def set_dispatcher(dispatch) -> None:
    """dispatch(func, args, kwargs): how an aten op on lazy tensors is recorded."""
    global _dispatch
    _dispatch = dispatch


class LazyTensor(torch.Tensor):
    """A torch tensor on the lazy device; its value is kept by the engine."""

    @staticmethod
    def __new__(cls, state: LiveValue, layout: Layout | None = None):
        return holding(state, layout)

    @property
    def _state(self) -> LiveValue:
        return current().value_of(self)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        start = _clock()
        try:
            return _dispatch(func, args, kwargs or {})  # the frontend's (installed on its import)
        finally:
            _TRACE.seconds += _clock() - start

    def __repr__(self) -> str:
        return f"LazyTensor({self._state})"


tape.set_tensor_class(LazyTensor)


def new_tensor(aval: Aval, node: Node | None = None, index: int = 0,
               data: DeviceData | None = None, layout: Layout | None = None) -> LazyTensor:
    return holding(LiveValue(aval, node, index, data), layout)  # not LazyTensor(...): a type call less an op


_wrapper = torch.Tensor._make_wrapper_subclass


def holding(state: LiveValue, layout: Layout | None) -> LazyTensor:
    """A new LazyTensor holding `state`, laid out as `layout` says (None: contiguous)."""
    # A functional wrapper takes its inner tensor's strides and storage offset (a view's
    # wrapper, those of its view op on meta), and contiguous(), reshape() and view()
    # decide by them whether to copy: they must be eager's (a transposed view that said
    # it was contiguous was returned by contiguous() itself, and writes to the "copy"
    # changed its base).
    aval = state.aval
    if layout is None:
        t = _wrapper(LazyTensor, aval.shape, dtype=aval.dtype, device=DEVICE)
    else:
        t = _wrapper(LazyTensor, aval.shape, strides=layout[0], storage_offset=layout[1], dtype=aval.dtype,
                     device=DEVICE)
        layout = tape.plain_layout(aval.shape, layout)
    current().register(t, state, layout)
    return t


# -- wrapping -----------------------------------------------------------------
def wrap(inner: LazyTensor) -> torch.Tensor:
    t = torch._to_functional_tensor(inner)
    own(t)
    return t


def unwrap(t: torch.Tensor) -> LazyTensor:
    """The LazyTensor currently behind a user-visible tensor."""
    if isinstance(t, LazyTensor):
        return t
    inner = _inner(t)
    if inner is None:
        raise TypeError(f"expected a tensor on {DEVICE}, got one on {t.device}")
    return inner


def lazy_tensor(t) -> LazyTensor | None:
    """The LazyTensor behind `t` where it is a tensor on the device, else None: the device's test and
    unwrap in one, with no torch.device made to compare (a compiled step's graphs read ~275 inputs)."""
    if isinstance(t, LazyTensor):
        return t
    if isinstance(t, torch.Tensor):
        return _inner(t)
    return None


def _inner(t: torch.Tensor) -> LazyTensor | None:
    """The LazyTensor behind a functional wrapper, brought up to date; None behind anything else."""
    if torch._is_functional_tensor(t):
        # the C++ sync torch._sync calls for a wrapper that is not a Python FunctionalTensor
        # (never one here: _is_functional_tensor is False for those); ~2 µs less per tensor.
        # Not under inference mode: called there on a tensor made outside it (a module's
        # parameter, named at the module's first call), it left the tensor raising "Cannot
        # set version_counter for inference tensor" at every view of it from then on
        if torch.is_inference_mode_enabled():
            with torch.inference_mode(False):
                torch._functionalize_sync(t)
        else:
            torch._functionalize_sync(t)
        inner = torch._from_functional_tensor(t)
        if isinstance(inner, LazyTensor):
            return inner
    return None


def lazy_values(obj) -> list[LiveValue]:
    """The values of the lazy tensors among obj's leaves (a tensor, list, dict, ...)."""
    return [unwrap(t)._state for t in tree_leaves(obj) if isinstance(t, torch.Tensor) and t.device == DEVICE]


# -- owners --------------------------------------------------------------------
# The user tensors made on the device (.to, torch.tensor), written in place (own_at_write) or named (labels.py):
# at each step marker each one's current value is stamped with the tensor's
# id, its name, and the buffer the tensor held before it, so that a step that fails a
# check can give a tensor it updated in place its old buffer back
# (engine/check_results.py). A view written in place is not tracked: a failed step
# poisons it.
class Owner:
    """An owned tensor's id (the ledger's key for its last computed buffer) and its name."""

    __slots__ = ("id", "label")

    def __init__(self, id_: int):
        self.id, self.label = id_, None


class _OwnedRef(weakref.ref):
    """An owned tensor's weak reference, with its Owner and its key in _OWNED (the tensor's id).
    Not torch's WeakTensorKeyDictionary: its lookup makes a weak reference in Python each time
    (~1.1 µs; the optimizer's naming hook asks for every parameter and state at every step), and
    its iteration is a Python generator (stamp_owners runs one at every marker)."""

    __slots__ = ("owner", "key")


def _disowned(ref: _OwnedRef) -> None:
    if _OWNED.get(ref.key) is ref:
        del _OWNED[ref.key]


_OWNED: dict[int, _OwnedRef] = {}  # id(tensor) -> its reference
_owner_ids = itertools.count(1)
# the TensorImpls of _OWNED's tensors as of the last own or stamp: the in-place write path's test
# before own_at_write, which allocates nothing (each allocation brings Python's collector nearer);
# an impl a dead tensor left stays until the next stamp
owned_impls: set[int] = set()


def own(t: torch.Tensor) -> Owner:
    ref = _OWNED.get(id(t))
    if ref is not None and ref() is t:
        return ref.owner
    ref = _OwnedRef(t, _disowned)
    ref.owner, ref.key = Owner(next(_owner_ids)), id(t)
    _OWNED[ref.key] = ref
    owned_impls.add(t._cdata)
    return ref.owner


def owner_of(t: torch.Tensor) -> Owner | None:
    ref = _OWNED.get(id(t))
    return ref.owner if ref is not None and ref() is t else None


def own_at_write(t: torch.Tensor) -> None:
    """Own `t` at its first in-place write, unless a view: a tensor a factory or an op made reaches
    the user in a wrapper xlakit never held (torch's functionalization makes it after xlakit's
    kernel returned). Its value until this write, when computed, is what a failed step gives back."""
    if t._base is not None or t.device != DEVICE:
        return
    try:
        value = unwrap(t)._state
    except TypeError:  # a fake value, while torch.compile traces: nothing to give back
        return
    owner = own(t)
    value.resolve()
    if value.data is not None:
        current().note_owned(owner.id, value.data)


def note_computed(t: torch.Tensor) -> None:
    """An owned tensor's value computed outside a step (a compiled call's output copied into it):
    what a step that then fails gives back (engine/check_results.py, values.dropped)."""
    owner = owner_of(t)
    if owner is not None:
        current().note_owned(owner.id, unwrap(t)._state.data)


def stamp_label(value: LiveValue, label: str, replacing: str | None = None) -> None:
    """Name `value`, and its buffer where that has no name yet (or the name `replacing`): a
    buffer shared with another tensor (a clone's source) keeps that one's."""
    value.label = label
    if value.data is not None and value.data.label in (None, replacing):
        value.data.label = label


def _stamp(value: LiveValue, owner: Owner) -> None:
    """Give `value`, owner's tensor's value now, its owner, its name and the buffer it replaces."""
    value.owner = owner.id
    if owner.label is not None:
        stamp_label(value, owner.label)
    if value.data is not None:
        current().note_owned(owner.id, value.data)
    else:
        value.previous = current().owned(owner.id)


def stamp_owners() -> None:
    """Stamp every owned tensor's value (before each step marker). A value stamped before and
    unchanged since (its owner and name on it, its buffer the ledger's for its tensor) is passed
    over: nothing written, no weak reference made in the ledger. Each owned tensor is still
    visited (~1.5–2.7 µs a tensor, mostly its unwrap; bench/RESULTS.md, seventeenth round)."""
    engine = current()
    value_of, owned = engine.value_of, engine.owned
    owned_impls.clear()
    for ref in list(_OWNED.values()):
        t, owner = ref(), ref.owner
        if t is None:
            continue
        owned_impls.add(t._cdata)
        value = value_of(unwrap(t))
        data = value.data
        label = owner.label
        if data is None or value.owner != owner.id or owned(owner.id) is not data \
                or label is not None and (value.label != label or data.label is None):
            _stamp(value, owner)


def copy_strides(t: torch.Tensor, memory_format=torch.preserve_format) -> tuple[int, ...]:
    """The strides eager's copy of `t` (host or lazy) to another device takes: a dense tensor's own,
    else dense ones in the same order (as `empty_like` lays out), or those of `memory_format`."""
    if memory_format is torch.preserve_format and t.is_contiguous():
        return t.stride()
    return torch.empty_like(torch.empty_strided(t.shape, t.stride(), device="meta"),
                            memory_format=memory_format).stride()


def from_host(t: torch.Tensor, *, label: str | None = None, strides: tuple[int, ...] | None = None) -> LazyTensor:
    """The device copy keeps a dense host tensor's strides, as eager's copies between devices do
    (or takes `strides`: a copy's to a memory format)."""
    data = transfer.uploaded(t, label=label)
    transfer.keep_host_copy(data, t)
    return new_tensor(data.aval, data=data, layout=(copy_strides(t) if strides is None else strides, 0))


def to_host(inner: LazyTensor, *, trigger: Trigger) -> torch.Tensor:
    """A partial sync of `inner`, unless the host can compute its value itself (host_reads.py)."""
    state = inner._state
    engine = current()
    # an assert waiting for the next sync makes this read an execution (its check raises here)
    host = None if engine.has_pending_asserts() else host_reads.answer(state)
    if host is not None:  # no wait for steps dispatched ahead: their faults are the next device read's
        engine.count_host_read()
    else:
        engine.sync([state], trigger=trigger, source=sources.user_line())
        host = transfer.to_host(engine.read(state).array, inner.dtype)
    if inner.is_contiguous():
        return host
    # laid out as eager's copy from a GPU is (.cpu(), torch.save)
    return torch.empty_strided(inner.shape, copy_strides(inner), dtype=inner.dtype).copy_(host)
