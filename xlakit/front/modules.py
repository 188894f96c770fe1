"""What xlakit does for nn.Modules whose tensors are on the lazy device: keeps
shared parameters and buffers shared when they move there, moves a Parameter
by `p.data = ...`, lets torch's gradient clipping use foreach ops there, and
hooks each such module (and its submodules): the first time it runs, its
parameters and buffers are named (for step records) and its gradients kept
free of view bases; each call enters its module path (core/module_paths.py).

The hooks are the module's own, not global ones: torch.compile(module) warns
that global hooks fire once more for its wrapper, and Dynamo cannot go straight
to a module's forward while any global hook exists. A module gets them when its
tensors move to the device (`.to`, `load_state_dict`), when a device tensor is
registered on it (a module built on the device), and when it is registered in
a hooked module or a hooked module in it."""
from __future__ import annotations

import functools
import sys
import threading
import weakref

import torch
from torch.utils import _foreach_utils
from torch.utils.weak import WeakTensorKeyDictionary

from ..core import module_paths
from ..engine.executor import current
from . import autocast, labels
from .recorder import DEVICE
from .tensor import holding, unwrap

_SEEN: weakref.WeakSet = weakref.WeakSet()  # not ids: ids of dead modules are reused
_REBASED = WeakTensorKeyDictionary()


def _rebase_grad(param: torch.Tensor) -> None:
    """Autograd may store a view as `.grad` (the transpose of a matmul, for a
    Linear weight; a bias's summed gradient reshaped). Functionalization then keeps
    the view's base alive, and every step marker would compute and store both, with
    physical transposes (measured: 4x the execution time of an MLP's AdamW step). A
    clone is a new tensor with the same value: no device copy, and no base to keep.
    A lazy view laid out as a new tensor is, contiguous from offset 0 (each of GPT-2's
    52 gradients and Llama's 39, every step), takes a new tensor holding its value, as
    clone's would (values are immutable), with no op dispatched. Only a view is
    replaced: later backwards accumulate into `.grad` in place, and a `.grad` the
    user holds must stay the parameter's (as in eager torch)."""
    grad = param.grad
    if torch._is_functional_tensor_base(grad):
        return
    if grad.device == DEVICE and grad.storage_offset() == 0 and grad.is_contiguous():
        # no op, so no no_grad() around it: entering one cost ~8 µs in the step
        param.grad = torch._to_functional_tensor(holding(unwrap(grad)._state, None))
        return
    with torch.no_grad():
        param.grad = grad.clone()


def _rebase_grads_of(param: torch.Tensor) -> None:
    if isinstance(param, torch.nn.Parameter) and param.requires_grad and param not in _REBASED:
        _REBASED[param] = param.register_post_accumulate_grad_hook(_rebase_grad)


def _on_call(module: torch.nn.Module, args) -> None:
    """Each call of a hooked module: the first names its parameters and buffers (the
    outermost module runs its pre-hook first, so names are relative to it); each enters
    its module path and checks autocast's device type. One pre-hook, not three: each hook
    is a Python call at every call of the module."""
    if torch.compiler.is_compiling():
        return
    if module not in _SEEN:
        _name_tensors(module)
    module_paths.module_entered(module, args, sys._getframe(1))  # the frame that called the module
    autocast.warn_other_device_type(module, args)


def _name_tensors(module: torch.nn.Module) -> None:
    """Name the module's device parameters and buffers (for step records), relative to it,
    and keep their gradients free of view bases."""
    _SEEN.add(module)
    for name, t in (*module.named_parameters(), *module.named_buffers()):
        if t.device == DEVICE:
            labels.name_if_unnamed(t, name.replace("_orig_mod.", ""))  # through torch.compile's wrappers
            _rebase_grads_of(t)


# -- the hooks of modules on the device -------------------------------------------
def _hooked(module: torch.nn.Module) -> bool:
    return any(hook is _on_call for hook in module._forward_pre_hooks.values())


def hook(module: torch.nn.Module, *, below_hooked: bool = True) -> None:
    """Give `module` and its submodules xlakit's forward hooks (once each; a deep copy
    of a hooked module has them already). torch.compile(module)'s wrapper gets one that
    names its parameters at its first call and goes: hooks on it cost ~10 µs of every
    compiled call's Python, and its module, whose hooks Dynamo traces, has its own.
    `below_hooked=False`: not into a hooked module's submodules, which got theirs with it or
    at their own registration (a transformers model slices its layers' ModuleList at every
    call: each layer registered in the slice walked the slice's whole tree, 0.3 ms a step)."""
    for m in module.modules() if below_hooked else _unhooked(module):
        if _compiled_wrapper(m):
            if m not in _SEEN and not any(h is _name_at_first_call for h in m._forward_pre_hooks.values()):
                m.register_forward_pre_hook(_name_at_first_call)
        elif not _hooked(m):
            m.register_forward_pre_hook(_on_call)
            m.register_forward_hook(module_paths.module_left, always_call=True)


def _unhooked(module: torch.nn.Module):
    """`module` and its submodules, except a hooked one's (and its own, unless it is `module`)."""
    seen, stack = set(), [module]
    while stack:
        m = stack.pop()
        if id(m) in seen or m is not module and _hooked(m):
            continue
        seen.add(id(m))
        yield m
        stack.extend(child for child in m._modules.values() if child is not None)


def _name_at_first_call(wrapper: torch.nn.Module, args) -> None:
    if wrapper not in _SEEN:  # names relative to it, unless a module around it ran first
        _name_tensors(wrapper)
    for key, h in list(wrapper._forward_pre_hooks.items()):
        if h is _name_at_first_call:
            del wrapper._forward_pre_hooks[key]


def _hook_if_on_device(module: torch.nn.Module) -> None:
    if any(t.device == DEVICE for _, _, t in _slots(module)):
        hook(module)


def _on_tensor_registered(module: torch.nn.Module, name: str, t) -> None:
    # a Parameter or buffer made on the device (nn.Linear(..., device=dev)) is registered
    if isinstance(t, torch.Tensor) and t.device == DEVICE and not torch.compiler.is_compiling():
        hook(module)


def _on_module_registered(parent: torch.nn.Module, name: str, child) -> None:
    if isinstance(child, torch.nn.Module) and not torch.compiler.is_compiling() and (
            _hooked(parent) or _hooked(child)):
        hook(parent, below_hooked=False)
        hook(child, below_hooked=False)  # not in the parent's modules yet


def _compiled_wrapper(module: torch.nn.Module) -> bool:
    """torch.compile(module)'s wrapper (Dynamo is loaded by then)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return eval_frame is not None and isinstance(module, eval_frame.OptimizedModule)


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
        _hook_if_on_device(self)
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
        _parameters_as_moved(before, memo)
        _retie(before)
        _hook_if_on_device(self)
        return result
    return wrapper


def _parameters_as_moved(before, memo: dict[int, tuple]) -> None:
    """Each Parameter that `_apply` made on the device around a moved tensor is that tensor itself. torch
    makes it with `Parameter(moved)`, whose `_make_subclass` detaches it: under functionalization a
    `detach` view of a base nothing else holds, and every in-place write to the parameter then replayed
    that view twice through Python dispatch (a lazy Llama AdamW step: 175 of its 1721 ops). The moved
    tensor, private to this call, becomes the Parameter instead (its class set, as `_make_subclass`
    sets the new tensor's), keeping the gradient torch moved. `memo`: per moved tensor's id, (it, what
    it became); a Parameter subclass (quantized weights' own) is left as torch made it."""
    for store, name, old in before:
        new, moved = store.get(name), memo.get(id(old))
        # `new is old`: torch set its data (a tensor already on the device, given a new dtype), as eager does
        if moved is None or new is old or type(new) is not torch.nn.Parameter or new is moved[1]:
            continue
        base = moved[1]
        if type(base) is torch.Tensor:  # its first slot; a tensor in several slots is made a Parameter once
            grad, base.requires_grad = new.grad, new.requires_grad
            base.__class__ = torch.nn.Parameter
            base.grad = grad
        if type(base) is torch.nn.Parameter:
            store[name] = base


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
    if param.device == DEVICE:  # its module may never be hooked: its gradients are rebased all the same
        _rebase_grads_of(param)


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
    """Hook modules whose tensors are on the device (names, rebased gradients, module paths);
    keep shared tensors shared; move Parameters by `.data`; foreach for clipping."""
    from torch.nn.modules import module

    module.register_module_parameter_registration_hook(_on_tensor_registered)
    module.register_module_buffer_registration_hook(_on_tensor_registered)
    module.register_module_module_registration_hook(_on_module_registered)
    module_paths.install()
    current().before_step.append(module_paths.forget_optimizer_steps)
    torch.nn.Module._apply = _apply(torch.nn.Module._apply)
    torch.nn.Module.load_state_dict = _load_state_dict(torch.nn.Module.load_state_dict)
    torch.nn.Parameter.data = property(_DATA.__get__, _set_data, doc=_DATA.__doc__)
    _foreach_utils._get_foreach_kernels_supported_devices = _with_lazy(
        _foreach_utils._get_foreach_kernels_supported_devices)
