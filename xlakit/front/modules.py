"""What xlakit does for nn.Modules whose tensors are on the lazy device: keeps
shared parameters and buffers shared when they move there, moves a Parameter
by `p.data = ...`, lets torch's gradient clipping use foreach ops there, and,
the first time each module runs, names their parameters and buffers (for step
records) and keeps their gradients free of view bases."""
from __future__ import annotations

import functools
import threading
import warnings
import weakref

import torch
from torch.utils import _foreach_utils
from torch.utils.weak import WeakTensorKeyDictionary

from ..core import module_paths
from ..engine.executor import current
from . import labels
from .recorder import DEVICE

_SEEN: weakref.WeakSet = weakref.WeakSet()  # not ids: ids of dead modules are reused
_REBASED = WeakTensorKeyDictionary()


def _rebase_grad(param: torch.Tensor) -> None:
    """Autograd may store a view as `.grad` (the transpose of a matmul, for a
    Linear weight). Functionalization then keeps the view's base alive, and
    every step marker would compute and store both, with physical transposes
    (measured: 4x the execution time of an MLP's AdamW step). A clone is a new
    tensor with the same value: no device copy, and no base to keep. Only a
    view is replaced: later backwards accumulate into `.grad` in place, and a
    `.grad` the user holds must stay the parameter's (as in eager torch)."""
    if not torch._is_functional_tensor_base(param.grad):
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




# -- shared parameters survive the move to the device ---------------------------
# Module._apply (behind .to, .cuda-style helpers, to_empty, .half, ...) sets a
# moved tensor with `param.data = new` only when the two tensor types are
# compatible; a lazy tensor is not compatible with a CPU one, so every module
# gets a new Parameter of its own. A Parameter shared by two modules (GPT-2's
# LM head and token embedding) then becomes two, each receiving part of the
# gradient: silently wrong training. load_state_dict(assign=True) unties the
# same way. torch offers no hook inside _apply, so both are wrapped: within one
# call, one tensor that lands on the lazy device stays one object everywhere.
def _slots(module: torch.nn.Module):
    """(store, name, tensor) for every parameter and buffer in the tree."""
    return [(store, name, t) for m in module.modules() for store in (m._parameters, m._buffers)
            for name, t in store.items() if t is not None]


def _retie(before) -> None:
    """Where one tensor stood in several places before and now stands on the
    lazy device as several objects, put the first of them in every place."""
    moved: dict[int, torch.Tensor] = {}
    for store, name, old in before:
        new = store.get(name)
        if new is None or new is old or new.device != DEVICE:
            continue
        one = moved.setdefault(id(old), new)
        if new is not one:
            store[name] = one


def _load_state_dict(load):
    @functools.wraps(load)
    def wrapper(self, *args, **kwargs):
        before = _slots(self)
        result = load(self, *args, **kwargs)
        _retie(before)
        return result
    return wrapper


def _apply(apply):
    @functools.wraps(apply)
    def wrapper(self, fn, recurse=True):
        if _MOVING.active:  # _apply recurses into children; the outermost call reties
            return apply(self, fn, recurse)
        before = _slots(self)
        memo: dict[int, tuple] = {}  # id -> (tensor, result); holding the tensor keeps its id unique

        def once(t):  # a shared tensor is moved (uploaded) to the device once
            if id(t) in memo:
                return memo[id(t)][1]
            result = fn(t)
            if isinstance(result, torch.Tensor) and result.device == DEVICE:  # other moves stay torch's
                memo[id(t)] = (t, result)
            return result
        _MOVING.active = True
        try:
            result = apply(self, once, recurse)
        finally:
            _MOVING.active = False
        _retie(before)
        return result
    return wrapper


class _Moving(threading.local):
    active = False


_MOVING = _Moving()


# -- p.data = p.data.to(device) -------------------------------------------------------
# torch's `.data` setter (set_data) swaps the tensor's storage only between tensors
# of one kind; a lazy tensor is a functional wrapper and a CPU tensor is not, so
# it refused the move. The Parameter then takes the new tensor's contents instead
# (what torch.utils.swap_tensors does for Module._apply under
# torch.__future__.set_swap_module_params_on_conversion), keeping its identity
# and Python attributes.
_DATA = torch._C.TensorBase.data


def _set_data(param: torch.Tensor, new: torch.Tensor) -> None:
    if torch._has_compatible_shallow_copy_type(param, new) or DEVICE not in (param.device, new.device):
        _DATA.__set__(param, new)  # torch's own move (and its own errors)
        return
    attributes = param.__dict__
    try:
        torch.utils.swap_tensors(param, torch.Tensor._make_subclass(type(param), new, param.requires_grad))
    except RuntimeError as e:  # e.g. weak references to it (xlakit names parameters that have run)
        raise RuntimeError(f"xlakit: `.data = ...` cannot move this {type(param).__name__} from {param.device} "
                           f"to {new.device} ({e}). Move its module instead (module.to(...)), or make a new "
                           "Parameter: torch.nn.Parameter(p.data.to(...)).") from e
    param.__dict__ = attributes  # swap_tensors swaps these too; set_data keeps them


# -- foreach on the lazy device ---------------------------------------------------------
# The frontend runs `_foreach_*` ops (as one op per tensor in the graph), and
# optimizers with foreach=True use them; clip_grad_norm_ and clip_grad_value_
# ask torch's list of devices with foreach kernels first, and refused foreach=True.
def _with_lazy(devices):
    @functools.wraps(devices)
    def wrapper():
        return [*devices(), DEVICE.type]
    return wrapper


def install() -> None:
    """Name and rebase parameters at a module's first forward; keep shared tensors shared;
    name each op by the module that records it; move Parameters by `.data`; foreach for clipping."""
    # torch.compile warns that global module hooks fire once more for its wrapper
    # module; ours is idempotent, so that is harmless.
    warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
    torch.nn.modules.module.register_module_forward_pre_hook(_on_first_forward)
    module_paths.install()
    current().before_step.append(module_paths.forget_optimizer_steps)
    torch.nn.Module._apply = _apply(torch.nn.Module._apply)
    torch.nn.Module.load_state_dict = _load_state_dict(torch.nn.Module.load_state_dict)
    torch.nn.Parameter.data = property(_DATA.__get__, _set_data, doc=_DATA.__doc__)
    _foreach_utils._get_foreach_kernels_supported_devices = _with_lazy(
        _foreach_utils._get_foreach_kernels_supported_devices)
