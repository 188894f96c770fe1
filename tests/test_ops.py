"""The op table (xlakit/ops.py): every entry names a real aten op, and the
frontend and lowering implement exactly what it names."""
import torch

from xlakit import lowering, ops
from xlakit.ops import Handling

aten = torch.ops.aten


def _resolve(name: str):
    namespace, rest = name.split("::")
    packet_name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), packet_name)
    return packet, overload


def test_every_entry_names_an_existing_op_and_overload():
    for name, policy in ops.TABLE.items():
        packet, overload = _resolve(name)
        assert packet.overloads(), name
        if overload:
            assert overload in packet.overloads(), name
        if policy.handling in (Handling.EAGER, Handling.OWN_LOWERING, Handling.OWN_DECOMPOSITION,
                               Handling.DECOMPOSED, Handling.RANDOM_LIKE, Handling.FRONTEND):
            assert policy.reason, name


def test_policy_of_overloads_and_defaults():
    assert ops.policy(aten.add.Tensor).lift_scalars and ops.policy(aten.add.Scalar).lift_scalars
    assert ops.policy(aten.copy.default).handling is Handling.FRONTEND
    assert ops.policy(aten.copy.out).handling is Handling.LOWERED  # the overload-specific entry only
    assert ops.policy(aten.bernoulli.p).handling is Handling.RANDOM  # a Generator argument
    assert ops.policy(aten.sin.default) == ops.Policy()
    assert ops.policy(aten.sin.default) is ops.policy(aten.sin.default)


def test_lowering_follows_the_table():
    assert lowering.has_lowering(aten.addcmul.default)  # own lowering
    assert not lowering.has_lowering(aten.embedding_bag.default)  # torchax's is wrong
    assert not lowering.has_lowering(aten.rand.default)
    assert lowering.decomposition(aten.native_layer_norm_backward.default) is not None
    assert lowering.decomposition(aten.sin.default) is None
