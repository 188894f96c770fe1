"""The step views over the real torch_xla executor (torch_xla 2.9 on CPU)."""
import pytest
import torch

torch_xla = pytest.importorskip("torch_xla")

from xlakit.integrations import torch_xla as adapter  # noqa: E402
from xlakit.notebook import render  # noqa: E402


def test_step_record_from_torch_xla_counters_and_ir():
    dev = torch_xla.device()
    a = torch.arange(6.0).to(dev)
    b = (a * 2 + 1).sum()
    first = adapter.step()
    assert first.backend == "torch_xla" and first.cache == "miss"
    assert first.num_nodes >= 3 and any(n.op == "aten::mul" for n in first.graph.nodes)
    assert "graph hash" in first.components and first.components["XLA_HLO_DEBUG"] in ("unset", "0", "1")
    assert b.cpu().item() == 36.0
    c = torch.arange(6.0).to(dev)
    d = (c * 2 + 1).sum()
    second = adapter.step()
    assert second.cache == "hit" and second.key == first.key
    text = render.text(second)
    assert "(torch_xla)" in text and "in torch_xla's key" in text
    # torch_xla counts aliased buffers when it compiles: on a hit they are unknown, not none
    assert second.components["donor count"] == "unknown"
    assert "donation: unknown: torch_xla counts the buffers it aliases when it compiles" in text
    del d


def test_magic_with_torch_xla_backend():
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    ip = InteractiveShell.instance()
    ip.run_cell("%load_ext xlakit")
    ip.run_cell("import torch, torch_xla\ntdev = torch_xla.device()")
    with capture_output() as out:
        ip.run_cell("%%xla_step --backend torch_xla --name tx\nu = torch.ones(4).to(tdev)\n"
                    "print(u.sum().item())\nv = u.exp()")
    # a view's widget is an output of its own, before its text
    texts = [o.data["text/plain"] for o in out.outputs if "application/vnd.jupyter.widget-view+json" not in o.data]
    assert len(texts) == 1 and "(torch_xla)" in texts[0]
    assert "1 implicit execution(s)" in texts[0]


def test_without_torch_xla_the_error_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_torch_xla(name, *args, **kwargs):
        if name.startswith("torch_xla"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch_xla)
    with pytest.raises(ImportError, match=r"pip install 'xlakit\[torch_xla\]'"):
        adapter.step()


def test_torch_xla_inplace_updates_through_xlakits_functionalization_match_eager():
    # xlakit replaces the functionalization kernels of addcmul_/addcdiv_/lerp_ for
    # every device, torch_xla's included (it aliases in-place updates by them)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    runs = {}
    for name, dev in (("eager", "cpu"), ("torch_xla", torch_xla.device())):
        m = torch.nn.Linear(8, 8).to(dev)
        m.load_state_dict(model.state_dict())
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        for _ in range(3):
            opt.zero_grad()
            m(x.to(dev)).square().sum().backward()
            opt.step()
            if name == "torch_xla":
                torch_xla.sync()
        runs[name] = m.weight.detach().cpu()
    torch.testing.assert_close(runs["torch_xla"], runs["eager"], rtol=1e-5, atol=1e-6)


def test_torch_xla_steps_inside_a_profile_block_say_they_cannot_be_profiled():
    import xlakit

    dev = torch_xla.device()
    with pytest.warns(UserWarning, match="torch_xla's executor ran this step"):
        with xlakit.profile() as steps:
            a = torch.arange(4.0).to(dev) * 3
            adapter.step()
    assert [r.backend for r in steps] == ["torch_xla"] and steps[0].profile is None
    assert a.cpu().tolist() == [0.0, 3.0, 6.0, 9.0]


def test_torch_xla_steps_count_matmul_flops_as_xlakits_own_steps_do():
    # torch_xla's IR names its matmuls "aten::mm" and orders addmm's operands (input, weight,
    # bias): the Cost panel must count them by 2·m·n·k as for xlakit's graph of the same step
    import xlakit
    from xlakit.analysis import flops

    tdev = torch_xla.device()  # before any backward()

    def one_sgd_step(dev, sync):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(32, 4).to(dev), torch.randn(32, 1).to(dev)
        sync()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        return sync()

    def matmuls(record):
        return {op: (count, est) for op, count, est in flops.by_op(record.graph) if op in ("mm", "addmm")}

    ours = one_sgd_step(xlakit.device(), lambda: (xlakit.mark_step(), xlakit.last_step())[1])
    theirs = one_sgd_step(tdev, adapter.step)
    forward = 2 * 32 * 4 * 16 + 2 * 32 * 16 * 1
    backward = 2 * 32 * 16 * 1 + 2 * 4 * 32 * 16 + 2 * 16 * 32 * 1   # input grad of layer 2, weight grads
    assert matmuls(theirs) == matmuls(ours) == {"addmm": (2, forward), "mm": (3, backward)}
    assert flops.by_module(theirs.graph).flops > forward + backward   # the Cost panel's total


def test_the_same_training_step_has_the_same_graph_hash_at_every_step():
    # the hash depends on the order of the tensors: the view takes them in torch_xla's
    # order (by tensor id), not in the garbage collector's, which changes between steps
    tdev = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(tdev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 4).to(tdev), torch.randn(32, 1).to(tdev)
    records = []
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        records.append(adapter.step())
    assert [r.cache for r in records[1:]] == ["hit", "hit"]
    assert records[0].key == records[1].key == records[2].key
