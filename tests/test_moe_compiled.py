"""tests/test_moe.py's mixture-of-experts models under torch.compile, on device-resident parameters.

transformers' experts call their own custom op, `transformers::grouped_mm_fallback`, for float32
weights ("grouped_mm"), or `bmm` ("batched_mm"); every FX graph runs as one executable whatever
the routing. The "eager" experts' `nonzero` makes Dynamo break the graph, and both Dynamo and
xlakit say so. (Dynamo's frames and FX graphs are torch's: the Colab column, torch 2.9.0 as
`make test`'s, leaves this module to it, as it does the other torch.compile modules.)
"""
import pytest
import torch

pytest.importorskip("transformers")

from conftest import assert_same  # noqa: E402
from test_compiled_device import _failures, dynamo_log, fresh_dynamo  # noqa: E402, F401
from test_moe import _pair  # noqa: E402
from test_real_models import _FALLBACK, EPS, LR, STEPS, TOL, fallback_warnings  # noqa: E402, F401

import xlakit  # noqa: E402

COMPILED = ["grouped_mm", "batched_mm"]


def _graphs_ran_whole(graphs) -> bool:
    """Every FX graph became one executable, with no eager fallback, and replays it."""
    return bool(graphs) and all(g.executables == 1 and not g.splits and g.replays for g in graphs)


@pytest.mark.parametrize("implementation", COMPILED)
def test_compiled_moe_layer_matches_eager_whatever_the_routing(dev, fallback_warnings, implementation):
    model, lazy, _ = _pair("mixtral", implementation)
    eager, layer = model.model.layers[0].mlp, lazy.model.layers[0].mlp  # router, top-2, experts
    compiled = torch.compile(layer, backend="xlakit")
    torch.manual_seed(1)
    with dynamo_log() as log, xlakit.integrations.dynamo.compiled_graphs() as graphs, torch.no_grad():
        for _ in range(STEPS):
            x = torch.randn(2, 8, 64)  # a new routing at each call
            before = len(xlakit.steps())
            got = compiled(x.to(dev))
            records = xlakit.steps()[before:]
            assert_same(got, eager(x), **TOL)
    assert sum(log.frames.values()) == 1 and log.xlakit_frames() == {} and not _failures(log), log.frames
    assert len(graphs) == 1 and _graphs_ran_whole(graphs), graphs
    assert [(r.trigger, r.cache) for r in records] == [("compiled", "hit")]  # the last call: one executable
    assert not [w for w in fallback_warnings if _FALLBACK.search(str(w.message))]


@pytest.mark.parametrize("implementation", COMPILED)
def test_compiled_moe_training_step_matches_eager(dev, fallback_warnings, implementation):
    """Over 20 s: Dynamo traces Mixtral's training step (split by transformers' own breaks), each graph compiled."""
    # the causal-LM loss plus the router's load-balancing loss, backward, AdamW
    model, lazy, batch = _pair("mixtral", implementation)
    model.train(), lazy.train()
    optimizers = [torch.optim.AdamW(m.parameters(), lr=LR, eps=EPS) for m in (model, lazy)]  # train()'s

    def step(model, optimizer, batch):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    compiled = torch.compile(step, backend="xlakit")
    frames = []
    with dynamo_log() as log, xlakit.integrations.dynamo.compiled_graphs() as graphs:
        for _ in range(STEPS):
            got = compiled(lazy, optimizers[1], {k: v.to(dev) for k, v in batch.items()})
            assert_same(got.detach(), step(model, optimizers[0], batch).detach(), **TOL)
            frames.append(sum(log.frames.values()))
    for (n, p), q in zip(lazy.named_parameters(), model.parameters()):
        assert_same(p, q.detach(), **TOL, msg=lambda m, n=n: f"{n}: {m}")
    assert log.xlakit_frames() == {} and not _failures(log)
    assert frames[1] == frames[-1], frames  # no recompile after the first step
    # transformers' own graph breaks (its output-capturing hooks) split the step into
    # several graphs, each one executable: forward, backward and the optimizer's among them
    assert len(graphs) >= 3 and _graphs_ran_whole(graphs), graphs
    assert not [w for w in fallback_warnings if _FALLBACK.search(str(w.message))]


def test_compiled_eager_experts_break_the_graph_at_the_routing_and_say_so(dev, fallback_warnings):
    # the "eager" experts' `nonzero` per expert has as many rows as tokens chose it: Dynamo
    # cannot trace a data-dependent shape, breaks the graph there and logs why; the op then
    # runs between the graphs, where xlakit warns that it runs eagerly on CPU
    model, lazy, _ = _pair("mixtral", "eager")
    eager, layer = model.model.layers[0].mlp, lazy.model.layers[0].mlp
    compiled = torch.compile(layer, backend="xlakit")
    torch.manual_seed(1)
    with dynamo_log() as log, xlakit.integrations.dynamo.compiled_graphs() as graphs, torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 8, 64)
            assert_same(compiled(x.to(dev)), eager(x), **TOL)
    breaks = [m for m in log.messages if m.startswith("Graph break in user code") and "modeling_mixtral.py" in m]
    assert any("Dynamic shape operator" in m and "aten.nonzero" in m for m in breaks), breaks
    reasons = {m.group(1): str(w.message) for w in fallback_warnings if (m := _FALLBACK.search(str(w.message)))}
    assert "modeling_mixtral.py" in reasons.pop("aten.nonzero.default")
    # torch 2.13 writes one_hot's range checks into the compiled graph as `_assert_async`:
    # in-graph checks (lowerings/asserts.py), no other op runs eagerly
    assert not reasons, reasons
    assert graphs and log.xlakit_frames() == {} and not _failures(log)
