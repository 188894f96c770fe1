"""The op registry (xlakit/lowerings/registry.py): every entry names a real op, and an
op's policy and lowering are found by its overload, then its packet."""
import torch
import torch._decomp

from xlakit import lowerings
from xlakit.lowerings import registry
from xlakit.lowerings.registry import Handling

aten = torch.ops.aten

try:  # defines the transformers:: ops xlakit lowers (lowerings/grouped_mm.py)
    import transformers.integrations.moe  # noqa: F401
    _ABSENT = ()
except ImportError:
    _ABSENT = ("transformers::",)  # a library not installed: its ops do not exist


def _resolve(name: str):
    namespace, rest = name.split("::")
    packet_name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), packet_name)
    return packet, overload


def test_every_entry_names_an_existing_op_and_overload():
    for name, entry in registry.TABLE.items():
        if name.startswith(_ABSENT):
            continue
        policy = entry.policy or registry.Policy()
        packet, overload = _resolve(name)
        assert packet.overloads(), name
        if overload:
            assert overload in packet.overloads(), name
        if policy.handling in (Handling.EAGER, Handling.OWN_DECOMPOSITION,
                               Handling.DECOMPOSED, Handling.RANDOM_LIKE, Handling.FRONTEND):
            assert policy.reason, name


def test_policy_of_overloads_and_defaults():
    assert registry.policy(aten.add.Tensor).lift_scalars and registry.policy(aten.add.Scalar).lift_scalars
    assert registry.policy(aten.copy.default).handling is Handling.FRONTEND
    assert registry.policy(aten.copy.out).handling is Handling.LOWERED  # the overload-specific entry only
    assert registry.policy(aten.bernoulli.p).handling is Handling.RANDOM  # a Generator argument
    assert registry.policy(aten.sin.default) == registry.Policy()
    assert registry.policy(aten.sin.default) is registry.policy(aten.sin.default)


def test_every_lowering_names_an_existing_op_and_overload():
    for name in lowerings.TABLE:
        if name.startswith(_ABSENT):
            continue
        packet, overload = _resolve(name)
        assert packet.overloads(), name
        if overload:
            assert overload in packet.overloads(), name


def test_lowering_follows_the_table():
    assert registry.has_lowering(aten.addcmul.default)  # in xlakit's lowering table
    assert not registry.has_lowering(aten.rand.default)  # random: torch's generator draws
    assert registry.decomposition(aten.sin.default) is None
    # an op the lowering table lacks takes PyTorch's decomposition into Core ATen ops, if it has one
    core = torch._decomp.core_aten_decompositions()
    missing = [op for op in core if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten"
               and registry.policy(op).handling is Handling.LOWERED and lowerings.find(op) is None]
    assert missing and all(registry.decomposition(op) is not None for op in missing)
