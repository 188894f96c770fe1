"""Workarounds for defects of the jax versions xlakit supports, each applied only where the
defect is there (found by what the version has, not by its number), each saying what it costs.
install() applies them, on first use of the lazy device (front/install.py), never at import.

jax 0.7's lowering (mlir.jaxpr_subcomp) deduplicates a jaxpr's literals in a dict keyed by
HashableLiteral, whose hash is its `data`: None for a LiteralArray, the type that version
gives every literal (`x * 2.0` makes one). So all of a jaxpr's literals share one hash, each
lookup compares with every literal of its aval seen before, and lowering is quadratic in the
step's literals: a Llama step's ranges test 12.6 s on jax 0.7.2 against 8.1 on jax 0.10
(which has no such cache), 8.7 with this fix. Colab's TPU runtime ships jax 0.7.2. The fix
gives a LiteralArray the data an ndarray literal already has: its bytes (its dtype and shape
are in the aval that __eq__ compares first)."""
from __future__ import annotations

import functools

from jax._src import literals
from jax._src.interpreters import mlir


def install() -> None:
    """Every mend this jax needs; idempotent."""
    _hash_literal_arrays_by_their_bytes()


def _hash_literal_arrays_by_their_bytes() -> None:
    hashable = getattr(mlir, "HashableLiteral", None)   # jax 0.10 has neither the cache
    literal_array = getattr(literals, "LiteralArray", None)   # nor this type
    if hashable is None or literal_array is None or hasattr(hashable.__init__, "__wrapped__"):
        return
    original_init = hashable.__init__

    @functools.wraps(original_init)
    def __init__(self, value):
        original_init(self, value)
        if self.data is None and isinstance(value.val, literal_array):
            self.data = value.val.val.tobytes()

    hashable.__init__ = __init__
