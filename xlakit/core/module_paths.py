"""Which module recorded an op: the module path the graph view groups nodes by.

Forward hooks on the modules whose tensors are on the device (front/modules.py
registers them) keep a stack of the modules being called; a
module's path is the name the outermost one's `named_modules()` gives it
("model.layers.3.self_attn"), "" for the outermost itself and outside every
module. An optimizer's step is "optimizer". An op a backward pass records is
named after the forward op it differentiates, found by autograd's sequence
number (an autograd node keeps the number its forward op was recorded at):
"backward.model.layers.3.self_attn", or "backward" for a top-level op.
Sequence numbers count per thread: a forward run on another thread than
its backward's neighbours may be misnamed (names are metadata, never keyed).
"""
from __future__ import annotations

import bisect
import re
import sys
import threading
import weakref

import torch

from .state import PROCESS

OPTIMIZER, BACKWARD = "optimizer", "backward"


class Entry:
    """A module (or optimizer step) being called: its path, and the frame that called it.
    While it runs, every frame above `frame` waits at the same line, so sources.capture
    walks an op's stack only down to it and reads the rest from `above`, which it fills
    once per call (a transformers op sits ~14 frames below the user's line)."""

    __slots__ = ("owner", "path", "frame", "parent", "above")

    def __init__(self, owner, path: str, frame, parent: Entry | None):
        self.owner, self.path, self.frame, self.parent = owner, path, frame, parent
        self.above = None  # sources.capture's: (user frame, library frame) above `frame`


class _Stack(threading.local):
    def __init__(self):
        self.entries: list[Entry] = []  # outermost first


STACK = _Stack()  # per thread; sources.capture reads it per op, not through innermost()
# The sequence numbers at which the path changed, and the path from each on: a
# backward op looks its forward op's number up here. Bounded; the oldest go first.
_SEQUENCE: list[int] = []
_PATHS: list[str] = []
_LIMIT = 1 << 16
PROCESS.keep("core.module_paths: paths by sequence number", _SEQUENCE, bound=_LIMIT,
             why="a backward op is named after the module its forward op ran in",
             clear=lambda: (_SEQUENCE.clear(), _PATHS.clear()))
_NAMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # outermost module -> {module: name}


_autograd_node = torch._C._current_autograd_node  # bound once: current() runs for every recorded op


def current() -> str:
    """The path of the code recording an op now."""
    entries = STACK.entries
    return path_of(_autograd_node(), entries[-1] if entries else None)


def innermost() -> Entry | None:
    """The module or optimizer step being called now, innermost."""
    entries = STACK.entries
    return entries[-1] if entries else None


def path_of(node, entry: Entry | None) -> str:
    """The path of an op recorded under autograd node `node` (None: not in a backward pass)
    with `entry` innermost."""
    if node is None:
        return entry.path if entry is not None else ""
    # a backward pass; a module running inside it is a checkpoint's recomputation
    path = entry.path if entry is not None else _forward_path(node._sequence_nr())
    return f"{BACKWARD}.{path}" if path else BACKWARD


def _forward_path(sequence_nr: int) -> str:
    at = bisect.bisect_right(_SEQUENCE, sequence_nr) - 1
    return _PATHS[at] if at >= 0 else ""


# one step of a Dynamo source name: `.lin`, `['layers']`, `[0]`
_FX_STEP = re.compile(r"\.(\w+)|\[['\"]?([^'\"\]]*)['\"]?\]")


def of_fx_stack(stack: dict | None) -> str:
    """An FX node's module path from Dynamo's `node.meta["nn_module_stack"]`
    ({key: (source name, type)}, outermost first), as `current()` names it:
    "L['self']._modules['layers']._modules['0'].lin" -> "layers.0.lin". The
    compiled frame's own module (L['self']) is "", as the outermost module is;
    a name in another spelling is kept as it is."""
    if not stack:
        return ""
    name = list(stack.values())[-1][0]
    root = re.match(r"[LG]\[[^\]]*\]", name)
    if root is None:
        return name
    steps = (a or b for a, b in _FX_STEP.findall(name[root.end():]))
    return ".".join(s for s in steps if s != "_modules")


def _mark(path: str) -> None:
    """From the next autograd node on, forward ops run in `path`."""
    number = torch.autograd._get_sequence_nr()
    if _SEQUENCE and _SEQUENCE[-1] == number:  # no node since the last change: replace it
        _PATHS[-1] = path
        return
    if _PATHS and _PATHS[-1] == path:
        return
    if len(_SEQUENCE) >= _LIMIT:
        del _SEQUENCE[: _LIMIT // 2], _PATHS[: _LIMIT // 2]
    _SEQUENCE.append(number)
    _PATHS.append(path)


def _name(root, module: torch.nn.Module, parent: str) -> str:
    if not isinstance(root, torch.nn.Module):  # a module called by an optimizer's step
        return f"{parent}.{type(module).__name__}"
    names = _NAMES.get(root)
    if names is None or module not in names:
        names = _NAMES[root] = weakref.WeakKeyDictionary({m: n for n, m in root.named_modules()})
        if module not in names:  # called, but not a submodule: named by its type, under its caller
            names[module] = f"{parent}.{type(module).__name__}" if parent else type(module).__name__
    return names[module]


def _enter(owner, path: str, frame) -> None:
    entries = STACK.entries
    entries.append(Entry(owner, path, frame, entries[-1] if entries else None))
    _mark(path)


def _leave(owner) -> None:
    entries = STACK.entries
    for at in range(len(entries) - 1, -1, -1):
        if entries[at].owner is owner:
            del entries[at:]  # and whatever an exception left above it
            _mark(entries[-1].path if entries else "")
            return


def module_entered(module, args, frame) -> None:
    """`module` is called from `frame` (its forward pre-hook's caller)."""
    if torch.compiler.is_compiling():
        return
    entries = STACK.entries
    _enter(module, _name(entries[0].owner, module, entries[-1].path) if entries else "", frame)


def module_left(module, args, output) -> None:
    if not torch.compiler.is_compiling():
        _leave(module)


def _optimizer_stepping(optimizer, args, kwargs) -> None:
    # under torch.compile the FX nodes' module stacks name the ops
    if not torch.compiler.is_compiling():
        _enter(optimizer, OPTIMIZER, sys._getframe(1))


def _optimizer_stepped(optimizer, args, kwargs) -> None:
    if not torch.compiler.is_compiling():
        _leave(optimizer)


def forget_optimizer_steps() -> None:
    """At a step marker, no optimizer step is running: drop one a raising step left."""
    entries = STACK.entries
    entries[:] = [e for e in entries if not isinstance(e.owner, torch.optim.Optimizer)]


def install() -> None:
    from torch.optim import optimizer

    optimizer.register_optimizer_step_pre_hook(_optimizer_stepping)
    optimizer.register_optimizer_step_post_hook(_optimizer_stepped)
