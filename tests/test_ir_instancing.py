"""The engine's cheap bookkeeping, checked against what it stands for: `instantiate` wires a
compiled graph again exactly as its wiring says, and the registry of live tensors forgets each
tensor once, when it dies, whatever re-registered it."""
import gc
import random

import torch

from xlakit.core.ir import Aval, DeviceData, Graph, Node, instantiate
from xlakit.engine import executor
from xlakit.front import recorder

F32 = Aval((3,), torch.float32)


def random_graph(rng: random.Random) -> Graph:
    """Nodes of one to three outputs, each operand a param (some read twice, some never) or any
    earlier node's output (some read by many nodes, some by none)."""
    params = [DeviceData(None, F32) for _ in range(rng.randint(1, 4))]
    nodes, wiring = [], []
    for k in range(rng.randint(1, 30)):
        outputs = rng.randint(1, 3)
        nodes.append(Node(f"op{k}", (), None, (F32,) * outputs, None, b""))
        choices = [p for p in range(len(params))] + [(n, i) for n in range(k) for i in range(len(nodes[n].avals))]
        wiring.append(tuple(rng.choice(choices) for _ in range(rng.randint(0, 4))))
    roots = [(len(nodes) - 1, 0)]
    return Graph(nodes, params, roots, wiring)


def test_instantiate_reads_what_the_wiring_says_and_makes_one_pair_per_output():
    rng = random.Random(0)
    for _ in range(300):
        graph = random_graph(rng)
        operands = [DeviceData(None, F32) for _ in graph.params]
        nodes = instantiate(graph, operands)
        assert [n.op for n in nodes] == [n.op for n in graph.nodes]
        pairs = {}
        for node, wires in zip(nodes, graph.wiring):
            assert len(node.operands) == len(wires)
            for operand, w in zip(node.operands, wires):
                if isinstance(w, int):
                    assert operand is operands[w]
                else:
                    assert operand == (nodes[w[0]], w[1]) and operand[0] is nodes[w[0]]
                    assert pairs.setdefault(w, operand) is operand  # shared by every reader
        assert len({n.seq for n in nodes}) == len(nodes)  # new nodes, each its own place in the program


def _registry_sizes(engine):
    return len(engine._tensors), len(engine._refs), len(engine._ref_keys)


def test_a_tensor_registered_again_is_forgotten_once_when_it_dies(dev):
    engine = executor.current()
    gc.collect()
    before = _registry_sizes(engine)
    keep = torch.ones(3, device=dev)
    t = torch.zeros(3, device=dev)
    for k in range(50):  # each write below functionalization registers t's LazyTensor again
        inner = recorder.unwrap(t)
        engine.register(inner, recorder.unwrap(keep * k)._state)
    assert _registry_sizes(engine)[1] == _registry_sizes(engine)[2]  # the dropped references left nothing behind
    churn = [torch.full((3,), float(k), device=dev) + 1 for k in range(200)]
    del churn, inner, t
    gc.collect()
    assert _registry_sizes(engine) == (before[0] + 1, before[1] + 1, before[2] + 1)  # `keep` alone
    torch.testing.assert_close(keep.cpu(), torch.ones(3))
    del keep
    gc.collect()
    assert _registry_sizes(engine) == before
