"""The op registry: for each aten op, everything xlakit does with it, registered where it is written.

One table. An op's registration says how xlakit handles it (its `Policy`) and,
if it lowers, which JAX function computes it (its `Lowering`):
- `@lowers(...)` on a lowering in a family module (pointwise.py, nn.py, ...),
  with the policy flags that go with it (lifted scalars, CPU indices, a guard,
  checked scalars);
- `@decomposes(...)` on xlakit's own decompositions (decompositions.py);
- `@handles(...)` on the front's own handlers (front/recorder.py);
- `handled_as(...)` for ops with nothing of xlakit's to run: PyTorch's
  decomposition, eager CPU, random draws (in the family module they belong to).
An op registered nowhere is lowered if it has a lowering, replaced by
PyTorch's decomposition if it has one, and otherwise runs eagerly on CPU
("no XLA lowering"); an op with a Generator argument is random. Importing
xlakit registers every op (the front's handlers too) before any lookup.

Keys are `op._schema.name` ("aten::norm": every overload), or that name plus
the overload ("aten::copy.default": this overload only, which wins); a key's
policy and lowering are looked up apart, so an overload's handler leaves its
packet's lowering in place.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable

import torch
import torch._decomp

from ..core.state import PROCESS


class Handling(enum.Enum):
    LOWERED = "lowered by xlakit's lowering table (or, where it has no entry, PyTorch's decomposition)"
    DECOMPOSED = "replaced at record time by PyTorch's decomposition"
    OWN_DECOMPOSITION = "replaced at record time by xlakit's own decomposition (decompositions.py)"
    EAGER = "runs eagerly on CPU"
    RANDOM = "random: drawn eagerly by torch's CPU generator, so torch.manual_seed holds"
    RANDOM_LIKE = "random from the input's shape alone: drawn on CPU, nothing synced, no graph split"
    FRONTEND = "has its own meaning on the lazy device (a frontend handler)"


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """How one op is handled. `lift_scalars`: its Scalar arguments enter the
    graph as 0-d inputs, so a changed learning rate or momentum does not
    recompile. `cpu_indices`: CPU index tensors mix with device tensors, as in
    eager torch. `guard`: a check of its arguments (jax arrays) before lowering,
    which may send one call to eager CPU by raising NeedsEager. `checked_scalars`:
    the Scalar arguments eager's kernel converts to the type it computes in with
    c10's checked_convert, which raises where the value does not fit (the
    frontend raises the same at record time); `fill`: the kernel is fill_, which
    converts a float16 / bfloat16 value unchecked for a one-element tensor
    (ATen's scalar_fill). `implementation`: OWN_DECOMPOSITION's function of the
    op that returns its replacement; FRONTEND's handler. `meta`: xlakit's own
    shape and dtype rule (a function of meta tensors returning meta tensors),
    used at record time instead of torch's meta kernel where that refuses what
    eager CPU computes (`_grouped_mm`'s is CUDA-bound: bfloat16 only)."""

    handling: Handling = Handling.LOWERED
    reason: str = ""
    lift_scalars: bool = False
    cpu_indices: bool = False
    guard: Callable | None = None
    checked_scalars: tuple[str, ...] = ()
    fill: bool = False
    implementation: Callable | None = None
    meta: Callable | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Lowering:
    """The JAX function of an op (see the package docstring for `promote` and `opmath_scalar`)."""

    fn: Callable
    promote: bool = False
    opmath_scalar: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """What one key registers. None: the packet's key decides (or the default)."""

    policy: Policy | None = None
    lowering: Lowering | None = None


TABLE: dict[str, Entry] = {}

RANDOM_REASON = ("random: a key fixed at trace time would make a cached executable repeat its draws; "
                 "torch's CPU generator draws them")


def _register(names, *, policy: Policy | None = None, lowering: Lowering | None = None) -> None:
    for name in names:
        entry = TABLE.get(name, Entry())
        if (policy is not None and entry.policy is not None) or (lowering is not None and entry.lowering is not None):
            raise ImportError(f"xlakit internal error: {name} is registered twice")
        TABLE[name] = Entry(policy or entry.policy, lowering or entry.lowering)


def lowers(*names: str, promote: bool = False, opmath_scalar: str = "", **policy):
    """Register the decorated function as the lowering of `names`; `policy`: the
    flags of `Policy` that go with it (lift_scalars=True, guard=check, meta=rule, ...)."""
    def register(fn):
        _register(names, policy=Policy(**policy) if policy else None,
                  lowering=Lowering(fn, promote, opmath_scalar))
        return fn
    return register


def decomposes(*names: str, reason: str):
    """Register the decorated function (of the op, returning its replacement) as
    xlakit's own decomposition of `names`, applied at record time."""
    def register(fn):
        _register(names, policy=Policy(Handling.OWN_DECOMPOSITION, reason, implementation=fn))
        return fn
    return register


def handles(*names: str, reason: str, meta: Callable | None = None):
    """Register the decorated function as the front's own handler of `names`
    (`meta`: the shape rule of the nodes it records, Policy.meta)."""
    def register(fn):
        _register(names, policy=Policy(Handling.FRONTEND, reason, implementation=fn, meta=meta))
        return fn
    return register


def handled_as(handling: Handling, *names: str, reason: str) -> None:
    """Register `names` as handled without a function of xlakit's: PyTorch's
    decomposition, eager CPU or a random draw."""
    _register(names, policy=Policy(handling, reason))


_DEFAULT = Policy()
_RANDOM = Policy(Handling.RANDOM, RANDOM_REASON)
_POLICIES: dict[int, Policy] = PROCESS.memo(  # id(op) -> its policy (ops are process-wide singletons)
    "lowerings.registry: policies", 1 << 14, "per op overload, its table row, found by name once")


def key(op) -> str:
    """The table key of this overload: 'aten::copy.default'."""
    return f"{op._schema.name}.{op._overloadname}"


def _registered(op, part: str):
    """The overload's registered `part` ('policy' or 'lowering'), else its packet's, or None."""
    for name in (key(op), op._schema.name):
        entry = TABLE.get(name)
        if entry is not None and getattr(entry, part) is not None:
            return getattr(entry, part)
    return None


def policy(op) -> Policy:
    """The registered policy of one op overload (memoized)."""
    found = _POLICIES.get(id(op))
    if found is None:
        found = _registered(op, "policy")
        if found is None:
            found = _RANDOM if any("Generator" in str(a.type) for a in op._schema.arguments) else _DEFAULT
        _POLICIES[id(op)] = found
    return found


def find(op) -> Lowering | None:
    """The lowering of one op overload, or None."""
    return _registered(op, "lowering")


def has_lowering(op) -> bool:
    """Whether a node of `op` lowers: its policy (lowered, or recorded by a
    frontend handler: _to_copy's cast, slice_copy) and a registered lowering."""
    return policy(op).handling in (Handling.LOWERED, Handling.FRONTEND) and find(op) is not None


def decomposition(op):
    """The function the frontend calls instead of recording `op` (its policy
    says which), or None. An op with no lowering takes PyTorch's decomposition
    into Core ATen ops, or its composite kernel, where there is one."""
    found = policy(op)
    if found.handling is Handling.OWN_DECOMPOSITION:
        return found.implementation(op)
    if found.handling is Handling.DECOMPOSED:
        return torch._decomp.decomposition_table[op]
    if found.handling is Handling.LOWERED and find(op) is None:
        if op in _core_aten_decompositions():
            return _core_aten_decompositions()[op]
        # A composite op reaches xlakit where torch does not expand it first
        # (under inference_mode since torch 2.13, e.g. flatten): its own kernel
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
            return op.decompose
    return None


@functools.cache
def _core_aten_decompositions():
    """PyTorch's decompositions that end in Core ATen ops (its full table also
    holds references that end in prims, which xlakit does not lower). A lazy
    table: its `get` does not load entries, `[]` does."""
    return torch._decomp.core_aten_decompositions()
