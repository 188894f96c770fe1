"""`torch._assert_async(cond[, msg])` as an in-graph check (core/checks.py).

Eager raises RuntimeError (with `msg`, where given) when the one-element `cond`
is zero. The lowering asks for that check and returns an empty array: the
op has no output, and the node needs one that a step can return so that it is
not cut away (front/recorder.py keeps it for the next sync). The check is read
with the step's others, so a passing assert costs no sync and splits nothing.
Eager stops at a failed assert: the check halts (core/checks.py), so what the
graph places after it (all it does not need: asserts are cut first) is poisoned,
or keeps its old value where it updated a tensor of the user's in place, as for
any failed check (engine/check_results.py).
"""
from __future__ import annotations

import jax.numpy as jnp

from ..core import checks
from .registry import lowers

# eager's message for _assert_async without one of the user's
ZERO = "Expected Tensor with single nonzero value, but got zero"


@lowers("aten::_assert_async")
def _assert_async(self, assert_msg=None):
    # the message is a format string for the offending value (Check.message): the user's braces are kept
    message = ZERO if assert_msg is None else assert_msg.replace("{", "{{").replace("}", "}}")
    checks.require(self != 0, RuntimeError, message, halts=True)
    return jnp.zeros((0,), jnp.bool_)
