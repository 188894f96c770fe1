"""`torch.lazy`: the runtime module that torch utilities look up by device type
(torch.utils.checkpoint, torch.random.fork_rng, torch.get_device_module).
Without it, gradient checkpointing of a model on the lazy device raised
`AttributeError: module 'torch' has no attribute 'lazy'`.

Random ops on the lazy device draw from torch's CPU generator (frontend), so
this device's RNG state is the CPU generator's. Checkpointing restores the CPU
state before it recomputes a segment, so dropout masks are replayed exactly;
`_initialized = False` keeps it from stashing the same state a second time.
"""
from __future__ import annotations

import sys

import torch

_initialized = False


def is_available() -> bool:
    return True


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def get_rng_state(device=None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state: torch.Tensor, device=None) -> None:
    torch.set_rng_state(state)


def install() -> None:
    if getattr(torch, "lazy", None) is None:
        torch._register_device_module("lazy", sys.modules[__name__])
