"""Programs that tests and bench/render.py both run, each returning its last step's record."""
import torch

import xlakit
from xlakit.core.record import GraphInfo, NodeInfo, Output, ParamInfo


def llama_record(layers: int, steps: int = 2):
    """`steps` AdamW steps of a tiny transformers Llama with `layers` layers."""
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    dev = xlakit.device()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(dev)
    ids = torch.randint(0, 64, (2, 8)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        xlakit.mark_step()
    return xlakit.last_step()


def chain_record(ops: int):
    """One step of `ops` pointwise ops in a chain, outside any module."""
    x = torch.ones(8).to(xlakit.device())
    for _ in range(ops // 2):
        x = x * 1.0001
        x = x + 0.5
    xlakit.mark_step()
    return xlakit.last_step()


def module_chain(modules: list[str]) -> GraphInfo:
    """A graph (no step run) of one add per entry of `modules`, in a chain, each recorded in that module."""
    nodes = [NodeInfo("aten.add.Tensor", (0 if i == 0 else Output(i - 1, 0), 0), ("f32[8]",), None, module=m)
             for i, m in enumerate(modules)]
    return GraphInfo(tuple(nodes), (ParamInfo("f32[8]", "w", False),), (Output(len(nodes) - 1, 0),))


# 20,000-node graphs of the shapes a view must fold: a flat nn.Sequential's 5000 modules in the root,
# 6 levels of 4 submodules, no modules at all
SHAPES = {"flat": [str(i // 4) for i in range(20_000)],
          "deep": [".".join(f"b{(i >> s) & 3}" for s in range(12, 0, -2)) for i in range(20_000)],
          "no modules": [""] * 20_000}


def donating_then_plain(t0, t1):
    """pytorch/xla #8464's scenario on `t0`, `t1` (both computed): t1 += t0 at a step marker
    (t1's buffer is donated), then t2 = t1 + t0 (nothing to donate). Returns t2 and the two
    steps' records."""
    t1.add_(t0)
    xlakit.mark_step()
    donating = xlakit.last_step()
    t2 = t1 + t0
    xlakit.mark_step()
    return t2, donating, xlakit.last_step()


def sgd_steps(model, x, steps: int, step_marker):
    """`steps` SGD steps (lr 0.1) on the mean square of model(x), `step_marker()` after each
    (xlakit's or torch_xla's); the losses, and what each marker returned."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, marked = [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        marked.append(step_marker())
        losses.append(loss.item())
    return losses, marked
