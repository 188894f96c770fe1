"""What xlakit does for nn.Modules whose tensors are on the lazy device, the
first time each module runs: names their parameters and buffers (for step
records), and keeps their gradients free of view bases."""
from __future__ import annotations

import warnings
import weakref

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from . import labels
from .frontend import DEVICE

_SEEN: weakref.WeakSet = weakref.WeakSet()  # not ids: ids of dead modules are reused
_REBASED = WeakTensorKeyDictionary()


def _rebase_grad(param: torch.Tensor) -> None:
    """Autograd may store a view as `.grad` (the transpose of a matmul, for a
    Linear weight). Functionalization then keeps the view's base alive, and
    every step marker would compute and store both, with physical transposes
    (measured: 4x the execution time of an MLP's AdamW step). A clone is a new
    tensor with the same value: no device copy, and no base to keep."""
    with torch.no_grad():
        param.grad = param.grad.clone()


def _on_first_forward(module: torch.nn.Module, args) -> None:
    # The outermost module runs its pre-hook first, so names are relative to it.
    if torch.compiler.is_compiling() or module in _SEEN:
        return
    _SEEN.add(module)
    for name, t in (*module.named_parameters(), *module.named_buffers()):
        if t.device != DEVICE:
            continue
        labels.name_if_unnamed(t, name)
        if isinstance(t, torch.nn.Parameter) and t.requires_grad and t not in _REBASED:
            _REBASED[t] = t.register_post_accumulate_grad_hook(_rebase_grad)


# torch.compile warns that global module hooks fire once more for its wrapper
# module; ours is idempotent, so that is harmless.
warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
torch.nn.modules.module.register_module_forward_pre_hook(_on_first_forward)
