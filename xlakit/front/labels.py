"""Names for device tensors (module parameter names, optimizer state), shown in StepRecords.

A label belongs to the user's tensor, not to one buffer: in-place updates
rebind the tensor to new values, so labels are stamped on its current value
before every step marker.
"""
from __future__ import annotations

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.weak import WeakTensorKeyDictionary

from ..engine.executor import current
from .recorder import DEVICE, unwrap
from .tensor import own, stamp_owners

_NAMES = WeakTensorKeyDictionary()


def label(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """Name a lazy tensor in step records (donation tables, graph inputs)."""
    if tensor.device != DEVICE:
        raise ValueError(f"xlakit.label: {name!r} is on {tensor.device}, not on {DEVICE}")
    _NAMES[tensor] = name
    own(tensor)
    return tensor


def name_if_unnamed(tensor: torch.Tensor, name: str) -> None:
    """Name a tensor that has no name yet, and its current value right away (a
    step may donate that buffer before the next stamp)."""
    if tensor not in _NAMES:
        _NAMES[tensor] = name
        own(tensor)
        _stamp(tensor, name)


def stamp_if_named(tensor: torch.Tensor) -> None:
    """Give a named tensor's new value its name now, as a step's results get theirs: a value a
    compiled graph computed outside a step, which the next step reads (its donors are paired by name)."""
    name = _NAMES.get(tensor)
    if name is not None:
        _stamp(tensor, name)


def _stamp(tensor: torch.Tensor, name: str) -> None:
    value = unwrap(tensor)._state
    value.label = name
    if value.data is not None and value.data.label is None:
        value.data.label = name


def _stamp_labels() -> None:
    for tensor, name in list(_NAMES.items()):
        _stamp(tensor, name)


def _label_optimizer_state(optimizer, args, kwargs) -> None:
    if torch.compiler.is_compiling():  # Dynamo inlines this hook: nothing to trace
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            owner = _NAMES.get(p)
            for key, value in optimizer.state.get(p, {}).items():
                if owner and isinstance(value, torch.Tensor) and value.device == DEVICE \
                        and value not in _NAMES:
                    _NAMES[value] = f"{owner}.{key}"
                    own(value)


def install() -> None:
    """Stamp labels and owners before every step marker; name optimizer state after each step."""
    current().before_step.extend((_stamp_labels, stamp_owners))
    register_optimizer_step_post_hook(_label_optimizer_state)
