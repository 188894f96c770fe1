"""The lowering table: which JAX function computes each aten op (`@lowers`), and its lookup.

Keys: "aten::add" (every overload) or "aten::add.Tensor" (that overload, which wins).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True, slots=True)
class Lowering:
    fn: Callable
    promote: bool = False
    opmath_scalar: str = ""


TABLE: dict[str, Lowering] = {}


def lowers(*names: str, promote: bool = False, opmath_scalar: str = ""):
    """Register the decorated function as the lowering of `names`."""
    def register(fn):
        for name in names:
            if name in TABLE:
                raise ImportError(f"xlakit internal error: two lowerings of {name}")
            TABLE[name] = Lowering(fn, promote, opmath_scalar)
        return fn
    return register


def find(op) -> Lowering | None:
    """The lowering of one op overload, or None."""
    name = op._schema.name
    return TABLE.get(f"{name}.{op._overloadname}") or TABLE.get(name)
