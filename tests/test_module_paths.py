"""What the graph view groups and links by: each node's module path (forward,
backward and optimizer ops of real transformers models) and the optimized HLO
instructions it became. Both are metadata: neither may change a key."""
import os
import textwrap

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import xlakit  # noqa: E402

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def train_step(model, batch):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):  # the second step has the optimizer state
        opt.zero_grad()
        model(**batch).loss.backward()
        opt.step()
        xlakit.mark_step()
    return xlakit.last_step().graph


def llama(dev):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    ids = torch.randint(0, 64, (2, 8)).to(dev)
    return transformers.LlamaForCausalLM(cfg).to(dev), dict(input_ids=ids, labels=ids)


def gpt2(dev):
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    ids = torch.randint(0, 64, (2, 8)).to(dev)
    return transformers.GPT2LMHeadModel(cfg).to(dev), dict(input_ids=ids, labels=ids)


def ops_in(graph, module):
    return [n.op for n in graph.nodes if n.module == module]


@pytest.mark.parametrize("build, attention, projection", [
    (llama, "model.layers.1.self_attn", "model.layers.1.self_attn.q_proj"),
    (gpt2, "transformer.h.1.attn", "transformer.h.1.attn.c_attn"),
])
def test_every_op_is_named_by_the_module_that_recorded_it(dev, build, attention, projection):
    torch.manual_seed(0)
    graph = train_step(*build(dev))
    modules = {n.module for n in graph.nodes}
    # forward: each projection's matmul in its own module, the attention's softmax in the attention
    assert any("mm" in op for op in ops_in(graph, projection))
    assert any(op.endswith("softmax.default") for op in ops_in(graph, attention))
    # backward: under the forward module it differentiates
    assert "aten._softmax_backward_data.default" in ops_in(graph, f"backward.{attention}")
    assert any(op == "aten.mm.default" for op in ops_in(graph, f"backward.{projection}"))
    # the optimizer's step, and nothing unnamed but the loss at the top level
    assert len(ops_in(graph, "optimizer")) > len(graph.nodes) // 5
    assert {m for m in modules if not m.startswith(("model", "transformer", "lm_head", "backward", "optimizer"))} \
        <= {""}
    assert len(ops_in(graph, "")) < 20


def test_a_module_that_raises_leaves_no_path_behind(dev):
    class Boom(torch.nn.Module):
        def forward(self, x):
            x = x * 2
            raise ValueError("boom")

    outer = torch.nn.Sequential(torch.nn.Linear(3, 3), Boom()).to(dev)
    with pytest.raises(ValueError):
        outer(torch.ones(2, 3, device=dev))
    y = torch.ones(3, device=dev) + 1
    xlakit.mark_step()
    assert {n.module for n in xlakit.last_step().graph.nodes} == {""}
    del y


def test_an_optimizer_step_that_raises_is_forgotten_at_the_step_marker(dev):
    weight = torch.nn.Parameter(torch.ones(3, device=dev))
    opt = torch.optim.SGD([weight], lr=0.1)
    weight.grad = torch.ones(3, device=dev)
    opt.register_step_post_hook(lambda *args: (_ for _ in ()).throw(RuntimeError("post hook")))
    with pytest.raises(RuntimeError):
        opt.step()
    xlakit.mark_step()
    y = torch.ones(3, device=dev) * 3
    xlakit.mark_step()
    assert {n.module for n in xlakit.last_step().graph.nodes} == {""}
    del y


def test_a_module_called_outside_the_tree_is_named_by_its_type(dev):
    helper = torch.nn.Linear(2, 2).to(dev)
    cpu_helper = torch.nn.Softsign()  # holds no device tensor: no hooks, named by its caller

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

        def forward(self, x):
            return cpu_helper(helper(self.inner(x)))

    y = Outer().to(dev)(torch.ones(1, 2, device=dev))
    xlakit.mark_step()
    nodes = xlakit.last_step().graph.nodes
    assert {n.module for n in nodes} == {"inner", "Linear", ""}
    assert [n.module for n in nodes if n.op == "aten.abs.default"] == [""]
    del y


def test_module_paths_and_node_scopes_stay_out_of_the_key(dev):
    class Net(torch.nn.Module):
        def __init__(self, name):
            super().__init__()
            self.add_module(name, torch.nn.Linear(4, 4))

        def forward(self, x):
            return next(self.children())(x).relu()

    x = torch.randn(2, 4).to(dev)
    records = []
    for name in ("encoder", "decoder"):  # the same computation under other module names
        net = Net(name).to(dev)
        with torch.no_grad():
            y = net(x)
        xlakit.mark_step()
        records.append(xlakit.last_step())
    first, second = records
    assert second.cache == "hit" and second.key == first.key
    assert second.metadata_digest != first.metadata_digest
    assert {n.module for n in first.graph.nodes} == {"", "encoder"}  # relu runs in the outer module: ""
    assert {n.module for n in second.graph.nodes} == {"", "decoder"}
    assert [n.hlo_ops for n in second.graph.nodes] == [n.hlo_ops for n in first.graph.nodes]
    del y


def test_each_node_names_the_optimized_hlo_instructions_it_became(dev):
    x = torch.randn(4, 8).to(dev)
    w = torch.randn(8, 3).to(dev)
    y = (x @ w).tanh().sum()
    xlakit.mark_step()
    record = xlakit.last_step()
    by_op = {n.op: n.hlo_ops for n in record.graph.nodes}
    assert any(by_op["aten.mm.default"]) and any(by_op["aten.tanh.default"])
    instructions = {line.split(" = ")[0].split("%")[-1] for line in record.hlo.splitlines() if " = " in line}
    for node in record.graph.nodes:
        assert set(node.hlo_ops) <= instructions, node
    del y


PROGRAM = textwrap.dedent("""
    import torch, xlakit
    x = torch.arange(6.0).reshape(2, 3).to(xlakit.device())
    y = (x @ x.T).sin() * 3
    xlakit.mark_step()
    record = xlakit.last_step()
    print(record.cache, sum(bool(n.hlo_ops) for n in record.graph.nodes), len(record.graph.nodes))
""")


def test_node_scopes_keep_the_disk_cache_hitting_across_processes(new_python, tmp_path):
    env = {**os.environ, "XLAKIT_CACHE_DIR": str(tmp_path)}
    runs = [new_python("-c", PROGRAM, env=env, check=True).stdout.split() for _ in range(2)]
    assert [r[0] for r in runs] == ["miss", "persistent_hit"]
    # the executable loaded from disk still names each node's instructions
    assert runs[1][1:] == runs[0][1:] and int(runs[1][1]) >= 2
