"""The op registry (xlakit/lowerings/registry.py): every entry names a real aten op, and an
op's policy and lowering are found by its overload, then its packet."""
import torch
import torch._decomp

from xlakit import lowerings
from xlakit.lowerings import registry as ops
from xlakit.lowerings.registry import Handling

aten = torch.ops.aten


def _resolve(name: str):
    namespace, rest = name.split("::")
    packet_name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), packet_name)
    return packet, overload


def test_every_entry_names_an_existing_op_and_overload():
    for name, entry in ops.TABLE.items():
        policy = entry.policy or ops.Policy()
        packet, overload = _resolve(name)
        assert packet.overloads(), name
        if overload:
            assert overload in packet.overloads(), name
        if policy.handling in (Handling.EAGER, Handling.OWN_DECOMPOSITION,
                               Handling.DECOMPOSED, Handling.RANDOM_LIKE, Handling.FRONTEND):
            assert policy.reason, name


def test_policy_of_overloads_and_defaults():
    assert ops.policy(aten.add.Tensor).lift_scalars and ops.policy(aten.add.Scalar).lift_scalars
    assert ops.policy(aten.copy.default).handling is Handling.FRONTEND
    assert ops.policy(aten.copy.out).handling is Handling.LOWERED  # the overload-specific entry only
    assert ops.policy(aten.bernoulli.p).handling is Handling.RANDOM  # a Generator argument
    assert ops.policy(aten.sin.default) == ops.Policy()
    assert ops.policy(aten.sin.default) is ops.policy(aten.sin.default)


def test_every_lowering_names_an_existing_op_and_overload():
    for name in lowerings.TABLE:
        packet, overload = _resolve(name)
        assert packet.overloads(), name
        if overload:
            assert overload in packet.overloads(), name


def test_lowering_follows_the_table():
    assert ops.has_lowering(aten.addcmul.default)  # in xlakit's lowering table
    assert not ops.has_lowering(aten.rand.default)  # random: torch's generator draws
    assert ops.decomposition(aten.sin.default) is None
    # an op the lowering table lacks takes PyTorch's decomposition into Core ATen ops, if it has one
    core = torch._decomp.core_aten_decompositions()
    missing = [op for op in core if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten"
               and ops.policy(op).handling is Handling.LOWERED and lowerings.find(op) is None]
    assert missing and all(ops.decomposition(op) is not None for op in missing)
