"""torch.save of lazy tensors: the file holds CPU tensors, so plain torch.load
reads it without xlakit.

torch pickles a tensor with `Tensor._reduce_ex_internal`, which writes its
storage; a lazy tensor (a functional wrapper) has none, and torch.save failed
("Attempted to access the data pointer on an invalid python storage"). Here a
lazy tensor is pickled as its host copy. torch.save itself first computes the
lazy tensors it is given in one partial sync (never donating, as every
partial sync), and within one save, tensors that share a storage and a layout
(a state dict's tied weights: two `detach()`es of one parameter) are written as
one storage, as eager torch writes them.
"""
from __future__ import annotations

import functools
import threading

import torch

from ..core import sources
from ..core.record import Trigger
from ..engine.executor import current
from .tensor import DEVICE, lazy_values, to_host, unwrap


class _Saving(threading.local):
    copies: dict | None = None  # during a torch.save: id(value) -> (value, its host copy)


_SAVING = _Saving()


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    inner = unwrap(t)
    copies = _SAVING.copies
    if copies is None:  # pickled outside torch.save (pickle.dumps, copy.copy)
        return to_host(inner, trigger=Trigger.SAVE)
    # one storage and one layout: one tensor of eager's (a tied weight's two detach()es); a
    # clone holds the same value but a storage of its own, and is written on its own
    key = ((t.untyped_storage()._cdata, tuple(t.shape), t.stride(), t.storage_offset())
           if torch._is_functional_tensor(t) else id(inner._state))
    if key not in copies:
        copies[key] = (t, to_host(inner, trigger=Trigger.SAVE))  # t kept alive: its storage's id stays its own
    return copies[key][1]


def _reduce_ex_internal(reduce):
    @functools.wraps(reduce)
    def wrapper(self, proto):
        if self.device != DEVICE:
            return reduce(self, proto)
        host = _host_copy(self).detach()  # the copy's storage, this tensor's requires_grad
        return reduce(host.requires_grad_(self.requires_grad), proto)
    return wrapper


def _save(save):
    @functools.wraps(save)
    def wrapper(obj, f, *args, **kwargs):
        values = lazy_values(obj)
        if values:
            current().sync(values, trigger=Trigger.SAVE, source=sources.user_line())
        outer, _SAVING.copies = _SAVING.copies, {}
        try:
            return save(obj, f, *args, **kwargs)
        finally:
            _SAVING.copies = outer
    return wrapper


def install() -> None:
    """Pickle lazy tensors as CPU tensors; make torch.save one partial sync."""
    torch.Tensor._reduce_ex_internal = _reduce_ex_internal(torch.Tensor._reduce_ex_internal)
    torch.save = torch.serialization.save = _save(torch.serialization.save)
