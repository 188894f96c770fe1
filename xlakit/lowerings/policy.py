"""The op table's policy: for each aten op, how xlakit handles it, and why.

One table, read by the frontend at record time and by the lowering at compile
time. An op not named here is lowered by xlakit's lowering table
(xlakit/lowerings: aten -> JAX) if it has an entry there, replaced by PyTorch's
decomposition if it has one, and otherwise runs eagerly on CPU ("no XLA
lowering"); an op with a Generator argument is random. The implementations
the table points at live where they run: own decompositions and guards in
lowering.py (keyed by op name),
the frontend's own handlers in frontend.py; both check on import that they
implement exactly what the table names.

Keys are `op._schema.name` ("aten::norm": every overload), or that name plus
the overload ("aten::copy.default": this overload only, which wins).
"""
from __future__ import annotations

import dataclasses
import enum

from ..core.state import PROCESS


class Handling(enum.Enum):
    LOWERED = "lowered by xlakit's lowering table (or, where it has no entry, PyTorch's decomposition)"
    DECOMPOSED = "replaced at record time by PyTorch's decomposition"
    OWN_DECOMPOSITION = "replaced at record time by xlakit's own decomposition (lowering.py)"
    EAGER = "runs eagerly on CPU"
    RANDOM = "random: drawn eagerly by torch's CPU generator, so torch.manual_seed holds"
    RANDOM_LIKE = "random from the input's shape alone: drawn on CPU, nothing synced, no graph split"
    FRONTEND = "has its own meaning on the lazy device (a frontend handler)"


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """How one op is handled. `lift_scalars`: its Scalar arguments enter the
    graph as 0-d inputs, so a changed learning rate or momentum does not
    recompile. `cpu_indices`: CPU index tensors mix with device tensors, as in
    eager torch. `guard`: a check of its arguments before lowering (lowering.py)
    may send one call to eager CPU. `checked_scalars`: the Scalar arguments
    eager's kernel converts to the type it computes in with c10's
    checked_convert, which raises where the value does not fit (the frontend
    raises the same at record time); `fill`: the kernel is fill_, which
    converts a float16 / bfloat16 value unchecked for a one-element tensor
    (ATen's scalar_fill)."""

    handling: Handling = Handling.LOWERED
    reason: str = ""
    lift_scalars: bool = False
    cpu_indices: bool = False
    guard: bool = False
    checked_scalars: tuple[str, ...] = ()
    fill: bool = False

    @property
    def recorded(self) -> bool:
        """Whether the op becomes a node of the IR (if the lowering can take it)."""
        return self.handling is Handling.LOWERED


H = Handling
_LIFT = Policy(lift_scalars=True)
_ALPHA = Policy(lift_scalars=True, checked_scalars=("alpha",))
_VALUE = Policy(lift_scalars=True, checked_scalars=("value",))
_FILLED = Policy(checked_scalars=("fill_value",), fill=True)
_RANDOM = Policy(H.RANDOM, "random: a key fixed at trace time would make a cached executable repeat its "
                           "draws; torch's CPU generator draws them")
_RANDOM_LIKE = Policy(H.RANDOM_LIKE, "reads only its input's shape and dtype")
_BATCH_NORM = "PyTorch's decomposition, with eval-mode statistics as eager CPU returns them"
_ALIAS = "values are immutable: a new tensor sharing the value, no node, no copy"

TABLE: dict[str, Policy] = {
    # -- arithmetic: scalars lifted to 0-d inputs ------------------------------
    "aten::add": _ALPHA, "aten::sub": _ALPHA, "aten::rsub": _ALPHA, "aten::mul": _LIFT, "aten::div": _LIFT,
    "aten::lerp": Policy(lift_scalars=True, checked_scalars=("weight",)), "aten::where": _LIFT,
    "aten::masked_fill": Policy(lift_scalars=True, checked_scalars=("value",)),
    "aten::fill": Policy(lift_scalars=True, checked_scalars=("value",), fill=True),
    "aten::clamp": Policy(lift_scalars=True, checked_scalars=("min", "max")),
    "aten::addcmul": _VALUE, "aten::addcdiv": _VALUE,
    # -- Scalars written into the tensor, checked as eager checks them ---------
    "aten::clamp_min": Policy(checked_scalars=("min",)), "aten::clamp_max": Policy(checked_scalars=("max",)),
    "aten::hardtanh": Policy(checked_scalars=("min_val", "max_val")),
    "aten::threshold": Policy(checked_scalars=("threshold", "value")),
    "aten::pow.Tensor_Scalar": Policy(checked_scalars=("exponent",)),
    "aten::index_fill": Policy(checked_scalars=("value",)), "aten::scatter": Policy(checked_scalars=("value",)),
    "aten::full": _FILLED, "aten::full_like": _FILLED, "aten::new_full": _FILLED,
    "aten::scalar_tensor": Policy(checked_scalars=("s",), fill=True),
    # -- CPU index tensors mix with device tensors ------------------------------
    "aten::index": Policy(cpu_indices=True), "aten::index_put": Policy(cpu_indices=True),
    "aten::_index_put_impl": Policy(cpu_indices=True),
    # -- guarded: arguments XLA would clamp where eager torch raises ------------
    "aten::as_strided": Policy(guard=True), "aten::as_strided_copy": Policy(guard=True),
    "aten::as_strided_scatter": Policy(guard=True),
    # -- PyTorch's decompositions at record time ---------------------------------
    "aten::native_batch_norm": Policy(H.OWN_DECOMPOSITION, _BATCH_NORM),
    "aten::_native_batch_norm_legit": Policy(H.OWN_DECOMPOSITION, _BATCH_NORM),
    "aten::_native_batch_norm_legit_functional": Policy(H.OWN_DECOMPOSITION, _BATCH_NORM),
    "aten::_native_batch_norm_legit_no_training": Policy(H.DECOMPOSED, _BATCH_NORM),
    "aten::native_batch_norm_backward": Policy(H.DECOMPOSED, _BATCH_NORM),
    # -- own decompositions ------------------------------------------------------
    "aten::allclose": Policy(H.OWN_DECOMPOSITION, "returns a Python bool and its meta kernel calls .item(): "
                             "torch's isclose in lowered ops, then one read of the bool"),
    "aten::_weight_norm_interface_backward": Policy(
        H.OWN_DECOMPOSITION, "no lowering and no meta kernel: eager CPU's formula in aten ops"),
    # -- eager on CPU ------------------------------------------------------------
    "aten::_linalg_check_errors": Policy(H.EAGER, "reads LAPACK's info and raises torch's own error (linalg.inv, "
                                         "cholesky, solve): a read of the value, as in eager"),
    "aten::_embedding_bag_forward_only": Policy(
        H.EAGER, "eager CPU returns an empty offset2bag where the meta kernel says (n,): only a fallback at "
                 "record time takes eager's shapes"),
    # -- random --------------------------------------------------------------------
    "aten::rand": _RANDOM, "aten::randn": _RANDOM, "aten::randint": _RANDOM, "aten::randperm": _RANDOM,
    "aten::rand_like": _RANDOM_LIKE, "aten::randn_like": _RANDOM_LIKE, "aten::randint_like": _RANDOM_LIKE,
    # -- the frontend's own handlers (these overloads only) -------------------------
    "aten::_to_copy.default": Policy(H.FRONTEND, "a copy to the host is a sync; a cast is recorded"),
    "aten::copy.default": Policy(H.FRONTEND, "the source, cast and expanded: an alias"),
    "aten::detach.default": Policy(H.FRONTEND, _ALIAS),
    "aten::alias.default": Policy(H.FRONTEND, _ALIAS),
    "aten::detach_copy.default": Policy(H.FRONTEND, _ALIAS),
    "aten::alias_copy.default": Policy(H.FRONTEND, _ALIAS),
    "aten::lift_fresh.default": Policy(H.FRONTEND, _ALIAS),
    "aten::clone.default": Policy(H.FRONTEND, _ALIAS),
    "aten::_local_scalar_dense.default": Policy(H.FRONTEND, "a read of the value: a partial sync"),
    "aten::slice_copy.Tensor": Policy(H.FRONTEND, "a slice of a pending cat is taken from the cat's input"),
    "aten::native_dropout.default": Policy(H.FRONTEND, "eager CPU's dropout: the noise drawn and scaled on the "
                                           "host by torch's CPU generator, then one multiply in the graph"),
}

_DEFAULT = Policy()
_POLICIES: dict[int, Policy] = PROCESS.memo(  # id(op) -> its policy (ops are process-wide singletons)
    "lowerings.policy: policies", 1 << 14, "per op overload, its table row, found by name once")


def key(op) -> str:
    """The table key of this overload: 'aten::copy.default'."""
    return f"{op._schema.name}.{op._overloadname}"


def policy(op) -> Policy:
    """The table's policy for one op overload (memoized)."""
    found = _POLICIES.get(id(op))
    if found is None:
        found = TABLE.get(key(op)) or TABLE.get(op._schema.name)
        if found is None:
            found = _RANDOM if any("Generator" in str(a.type) for a in op._schema.arguments) else _DEFAULT
        _POLICIES[id(op)] = found
    return found


def named(handling: Handling) -> frozenset[str]:
    """The table's keys with this handling."""
    return frozenset(name for name, p in TABLE.items() if p.handling is handling)


def guarded() -> frozenset[str]:
    return frozenset(name for name, p in TABLE.items() if p.guard)


# -- state: lowerings that failed in this process ------------------------------------
# ids of ops whose lowering failed; the engine, which handles the failure, adds
# them, and the frontend then runs later calls eagerly at once.
FAILED: set[int] = PROCESS.seen("lowerings.policy: failed lowerings", 1 << 12,
                                "ops whose lowering failed here run eagerly at record time, not again at the sync")


def remember_failure(op) -> None:
    FAILED.add(id(op))


class NeedsEager(Exception):
    """A verdict at run time: eager torch, not XLA, must compute this call
    (data-dependent output shape, an argument XLA would treat differently)."""
