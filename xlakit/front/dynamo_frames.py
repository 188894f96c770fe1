"""Dynamo never starts a frame in xlakit's code, nor in what xlakit's code calls.

torch.compile's frame hook sees every Python frame that runs while a compiled
function runs. Where the compiled code falls back to Python (a graph break, a
frame Dynamo gave up on), an aten op on a lazy tensor enters xlakit's
dispatcher, and Dynamo used to try to compile it and everything below it:
107 frames for one MLP call, `config.recompile_limit` hit on the engine's
`register`. Each code object of xlakit gets Dynamo's "skip, and skip what it
calls" strategy: xlakit runs as plain Python under torch.compile. Inlining is
untouched: a module hook Dynamo inlines while it traces still returns at
`torch.compiler.is_compiling()`, with no graph break.

Dynamo is imported on first use (0.8 s): xlakit's code is marked when it
loads, or at install when it already has.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import inspect
import sys
import types

_DYNAMO = "torch._dynamo"


def install() -> None:
    """Mark xlakit's code now if Dynamo is loaded, else when it loads."""
    if _DYNAMO in sys.modules:
        mark()
    elif not any(isinstance(f, _MarkWhenDynamoLoads) for f in sys.meta_path):
        sys.meta_path.insert(0, _MarkWhenDynamoLoads())


def mark() -> None:
    """Set Dynamo's skip-recursively strategy on every code object of the loaded
    xlakit modules (idempotent; modules imported since the last call are marked too)."""
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    strategy = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
    for code in xlakit_code():
        set_code_exec_strategy(code, strategy)


def xlakit_code() -> list[types.CodeType]:
    """Every code object defined in the loaded xlakit modules: functions, methods,
    properties, and the closures and comprehensions inside them."""
    seen: dict[int, types.CodeType] = {}
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "xlakit" or name.startswith("xlakit.")):
            for value in list(vars(module).values()):
                _collect(value, module.__name__, seen, set())
    return list(seen.values())


def _collect(value, module: str, seen: dict, visited: set) -> None:
    if id(value) in visited:
        return
    visited.add(id(value))
    if isinstance(value, (staticmethod, classmethod)):
        _collect(value.__func__, module, seen, visited)
    elif isinstance(value, property):
        for f in (value.fget, value.fset, value.fdel):
            _collect(f, module, seen, visited)
    elif isinstance(value, types.FunctionType):
        if value.__module__ == module:
            _code(value.__code__, seen)
        _collect(getattr(value, "__wrapped__", None), module, seen, visited)
    elif inspect.isclass(value) and value.__module__ == module:
        for attribute in list(vars(value).values()):
            _collect(attribute, module, seen, visited)


def _code(code: types.CodeType, seen: dict) -> None:
    if id(code) in seen:
        return
    seen[id(code)] = code
    for const in code.co_consts:  # closures, lambdas, comprehensions, nested classes' bodies
        if isinstance(const, types.CodeType):
            _code(const, seen)


class _MarkWhenDynamoLoads(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when torch._dynamo is imported, marks xlakit's code
    after its module ran, then leaves sys.meta_path."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _DYNAMO:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            mark()

        spec.loader.exec_module = exec_module
        return spec
