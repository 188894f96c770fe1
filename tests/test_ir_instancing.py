"""The engine's cheap bookkeeping, checked against what it stands for: `instantiate` wires a
compiled graph again exactly as its wiring says (its first roots the nodes of it made whole), and the registry of live tensors forgets each
tensor once, when it dies, whatever re-registered it."""
import gc
import random

import torch

from xlakit.core.ir import Aval, DeviceData, Graph, Node, instantiate, recording_mark
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
        nodes = instantiate(graph, operands).expand()
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
        seqs = [n.seq for n in nodes]
        assert seqs == list(range(seqs[0], seqs[0] + len(nodes)))  # new nodes, in graph order, as recorded one by one


def test_an_instances_roots_keep_their_identity_when_it_is_made_whole():
    """The roots made first are the nodes the expanded graph reads (a walk from any of them
    finds the others, results and all); a root that died is made again; no seq is skipped."""
    rng = random.Random(1)
    for _ in range(200):
        graph = random_graph(rng)
        operands = [DeviceData(None, F32) for _ in graph.params]
        mark = recording_mark()
        instance = instantiate(graph, operands)
        assert recording_mark() == mark + len(graph.nodes) and instance.first_seq == mark
        positions = rng.sample(range(len(graph.nodes)), rng.randint(1, len(graph.nodes)))
        roots = {p: instance.root(p) for p in positions}
        assert all(instance.root(p) is node for p, node in roots.items())
        died = positions[0]
        if len(positions) > 1:
            del roots[died]
        entries = instance.entries()
        assert [e if e is instance else e.seq - mark for e in entries] == \
            [p if p in roots else instance for p in range(len(graph.nodes))]
        kept, reader = rng.choice(list(roots.items()))
        assert instance.nodes is None
        reader.operands  # reading one root's operands makes them all
        nodes = instance.nodes
        assert all(nodes[p] is node and node.instance is None for p, node in roots.items())
        assert [n.seq - mark for n in nodes] == list(range(len(graph.nodes)))
        fresh = instantiate(graph, operands).expand()
        assert [[_wire(o, nodes) for o in n.operands] for n in nodes] == \
            [[_wire(o, fresh) for o in n.operands] for n in fresh]
        assert instance.root(kept) is nodes[kept]


def _wire(operand, nodes):
    return operand if isinstance(operand, DeviceData) else (next(k for k, n in enumerate(nodes) if n is operand[0]),
                                                            operand[1])


def _registry_sizes(engine):
    return len(engine._tensors), len(engine._refs)


def test_a_tensor_registered_again_is_forgotten_once_when_it_dies(dev):
    engine = executor.current()
    gc.collect()
    before = _registry_sizes(engine)
    keep = torch.ones(3, device=dev)
    t = torch.zeros(3, device=dev)
    for k in range(50):  # each write below functionalization registers t's LazyTensor again
        inner = recorder.unwrap(t)
        engine.register(inner, recorder.unwrap(keep * k)._state)
    assert _registry_sizes(engine) == (before[0] + 2, before[1] + 2)  # t and keep, each once
    churn = [torch.full((3,), float(k), device=dev) + 1 for k in range(200)]
    del churn, inner, t
    gc.collect()
    assert _registry_sizes(engine) == (before[0] + 1, before[1] + 1)  # `keep` alone
    torch.testing.assert_close(keep.cpu(), torch.ones(3))
    del keep
    gc.collect()
    assert _registry_sizes(engine) == before
