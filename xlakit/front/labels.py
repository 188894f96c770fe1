"""Names for device tensors (module parameter names, optimizer state), shown in StepRecords.

A label belongs to the user's tensor, not to one buffer: in-place updates
rebind the tensor to new values, so labels are stamped on its current value
before every step marker.
"""
from __future__ import annotations

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..engine.executor import current
from .recorder import DEVICE, unwrap
from .tensor import own, owner_of, stamp_label, stamp_owners


def label(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """Name a lazy tensor in step records (donation tables, graph inputs); a tensor named again
    takes the new name, and so does its buffer where it had the old one (a buffer it shares with
    another tensor, a clone's source, keeps that one's)."""
    if tensor.device != DEVICE:
        raise ValueError(f"xlakit.label: {name!r} is on {tensor.device}, not on {DEVICE}")
    owner = own(tensor)
    before, owner.label = owner.label, name
    stamp_label(unwrap(tensor)._state, name, replacing=before)
    return tensor


def name_if_unnamed(tensor: torch.Tensor, name: str) -> None:
    """Name a tensor that has no name yet, and its current value right away (a
    step may donate that buffer before the next stamp)."""
    owner = own(tensor)
    if owner.label is None:
        owner.label = name
        stamp_label(unwrap(tensor)._state, name)


def stamp_if_named(tensor: torch.Tensor) -> None:
    """Give a named tensor's new value its name now, as a step's results get theirs: a value a
    compiled graph computed outside a step, which the next step reads (its donors are paired by name)."""
    owner = owner_of(tensor)
    if owner is not None and owner.label is not None:
        stamp_label(unwrap(tensor)._state, owner.label)


def _label_optimizer_state(optimizer, args, kwargs) -> None:
    if torch.compiler.is_compiling():  # Dynamo inlines this hook: nothing to trace
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            owner = owner_of(p)
            name = owner and owner.label
            for key, value in optimizer.state.get(p, {}).items():
                if name and isinstance(value, torch.Tensor) and value.device == DEVICE:
                    state = own(value)
                    if state.label is None:
                        state.label = f"{name}.{key}"


def install() -> None:
    """Stamp owners and their labels before every step marker; name optimizer state after each step."""
    current().before_step.append(stamp_owners)
    register_optimizer_step_post_hook(_label_optimizer_state)
