"""torch.autocast and the lazy device.

Autocast casts only tensors of its own device type ("cpu", "cuda", "xla", ...;
torch refuses "lazy"), through dispatch keys a lazy tensor does not have. So
inside any autocast region a model on the lazy device silently ran in float32
(found with real models: bf16 autocast changed nothing). xlakit has no autocast
policy of its own yet; a module called with lazy tensors inside an autocast
region warns once. The check sits in a module hook, not in the dispatcher:
below the Python dispatch key every autocast key is excluded, so autocast
always looks off there.
"""
from __future__ import annotations


import torch

from . import sources
from .frontend import DEVICE

_WARNED = False


def _on_forward(module: torch.nn.Module, args) -> None:
    global _WARNED
    if _WARNED or not torch._C._is_any_autocast_enabled() or torch.compiler.is_compiling():
        return
    if not any(t.device == DEVICE for t in module.parameters()) and not any(
            isinstance(a, torch.Tensor) and a.device == DEVICE for a in args):
        return
    _WARNED = True
    sources.warn("xlakit: torch.autocast does not apply to tensors on the lazy device: their ops run in "
                 "their inputs' dtypes. For bfloat16 compute, cast the model and its floating-point inputs "
                 "(model.to(torch.bfloat16)).", sources.capture())


torch.nn.modules.module.register_module_forward_pre_hook(_on_forward)
