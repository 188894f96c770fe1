"""Mixture-of-experts transformers models (Mixtral, Qwen2-MoE, OLMoE) on the lazy device,
for each of transformers' experts implementations.

"grouped_mm" (transformers' default: tokens sorted by expert, `torch._grouped_mm`, a ragged
dot here) and "batched_mm" (each token's expert weights gathered, `bmm`) have static shapes:
they train eager-equal with the router's load-balancing loss, compile twice and never fall
back. "eager" loops over the experts a batch routes to, with `nonzero` per expert: its
shapes depend on the routing, so it falls back and recompiles as the routing changes.

Under torch.compile on device-resident parameters: transformers' experts call their own
custom op, `transformers::grouped_mm_fallback`, for float32 weights ("grouped_mm"), or
`bmm` ("batched_mm"); every FX graph runs as one executable whatever the routing. The
"eager" experts' `nonzero` makes Dynamo break the graph, and both Dynamo and xlakit say so.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded

import copy  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

transformers = pytest.importorskip("transformers")

from conftest import assert_same  # noqa: E402
from test_compiled_device import _failures, dynamo_log, fresh_dynamo  # noqa: E402, F401
from test_real_models import (_FALLBACK, EPS, LR, STEPS, TOL, Steps, assert_amp_equal, fallback_warnings,  # noqa: E402, F401
                              train, train_amp_both)

import xlakit  # noqa: E402

VOCAB = 64
# one layer: a second routes the same way again, and doubles every graph XLA compiles
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, num_experts_per_tok=2,
              output_router_logits=True)  # the router's load-balancing loss is in the loss


def mixtral(**kwargs):
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(num_local_experts=4, **{**COMMON, **kwargs}))


def qwen2_moe(**kwargs):
    # a shared expert beside the routed ones
    return transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=64, **{**COMMON, **kwargs}))


def olmoe(**kwargs):
    return transformers.OlmoeForCausalLM(transformers.OlmoeConfig(num_experts=4, **{**COMMON, **kwargs}))


MODELS = {"mixtral": mixtral, "qwen2_moe": qwen2_moe, "olmoe": olmoe}


def train_both(model, lazy, batch, dev, steps=STEPS):
    """test_real_models' loop: (the device's records per step, its losses, eager's losses)."""
    xlakit.mark_step()
    xlakit.reset_metrics()
    step = Steps()
    lazy_losses = train(lazy, {k: v.to(dev) for k, v in batch.items()}, step, steps=steps)
    return step, lazy_losses, train(model, batch, lambda: None, steps=steps)


def _pair(name, implementation, seed=0, **config):
    """(eager model, its copy on the device, a batch)."""
    torch.manual_seed(seed)
    model = MODELS[name](experts_implementation=implementation, **config)
    assert model.config._experts_implementation == implementation
    ids = torch.randint(0, VOCAB, (2, 8))
    return model, copy.deepcopy(model).to(xlakit.device()), dict(input_ids=ids, labels=ids)


@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm"])
@pytest.mark.parametrize("name", list(MODELS))
def test_training_matches_eager(dev, fallback_warnings, name, implementation):
    model, lazy, batch = _pair(name, implementation)
    model.train(), lazy.train()
    step, lazy_losses, eager_losses = train_both(model, lazy, batch, dev)
    for got, want in zip(lazy_losses, eager_losses):
        assert_same(got, want, **TOL)
    for (n, p), q in zip(lazy.named_parameters(), model.parameters()):
        assert_same(p, q.detach(), **TOL, msg=lambda m, n=n: f"{n}: {m}")
    # one executable per step, compiled for the first two steps only (the first also
    # creates the optimizer state), whatever the routing
    assert [[r.trigger for r in records] for records in step.per_step] == [["mark_step"]] * STEPS
    assert [records[0].cache for records in step.per_step[2:]] == ["hit"] * (STEPS - 2)
    assert not [w for w in fallback_warnings if _FALLBACK.search(str(w.message))]
    assert xlakit.metrics()["fallbacks"] == 0


def test_eager_experts_loop_falls_back_and_recompiles_with_the_routing(dev, fallback_warnings):
    """Over 20 s on busy cores (21 s in CI): each new routing of the experts loop compiles its graphs anew."""
    # transformers' "eager" experts: `torch.where(expert_mask[e])` per routed expert has as
    # many rows as tokens chose e, so nonzero runs on the CPU, and the graphs after it have
    # the routing's shapes: a new routing compiles anew. Values are still eager's.
    # two layers: the second's router reads what the first's experts made of the routing, so
    # graphs between its fallbacks have the new routing's shapes (with one, only the marker's)
    model, lazy, batch = _pair("mixtral", "eager", num_hidden_layers=2)
    model.train(), lazy.train()
    step, lazy_losses, eager_losses = train_both(model, lazy, batch, dev, steps=2)
    for got, want in zip(lazy_losses, eager_losses):
        assert_same(got, want, **TOL)
    for p, q in zip(lazy.parameters(), model.parameters()):
        assert_same(p, q.detach(), **TOL)
    reasons = {m.group(1): str(w.message) for w in fallback_warnings if (m := _FALLBACK.search(str(w.message)))}
    assert list(reasons) == ["aten.nonzero.default"]
    assert "output shape depends on the data" in reasons["aten.nonzero.default"]
    assert "modeling_mixtral.py" in reasons["aten.nonzero.default"]
    first, second = step.per_step
    # one graph split per expert; the loop's `.item()` of what nonzero gave (an upload) is read on the host
    assert {str(r.trigger) for r in second} == {"fallback", "mark_step"}
    # the routing moved: besides the step marker's graph (the first step's also made the optimizer
    # state), graphs between the fallbacks have new shapes
    new = [r for r in second if r.key not in {r.key for r in first}]
    assert len(new) >= 2 and str(new[-1].trigger) == "mark_step", [(str(r.trigger), r.why) for r in new]


GREEDY_TOKENS = 6


@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_generate_with_static_cache_gives_eagers_tokens(dev, name):
    # weights wide enough that the tokens vary (tests/test_generation.py's GPT-2 too); the
    # router's aux loss is for training (transformers' generate() cannot compute it)
    model, lazy, _ = _pair(name, "grouped_mm", initializer_range=0.2, output_router_logits=False)
    model.eval(), lazy.eval()
    prompt = torch.tensor([[1, 5, 7, 9, 3]])
    settings = dict(max_new_tokens=GREEDY_TOKENS, do_sample=False, pad_token_id=0, cache_implementation="static")
    want = model.generate(prompt, **settings)
    with xlakit.capture() as steps:
        got = lazy.generate(prompt.to(dev), **settings).cpu()
    assert got.tolist() == want.tolist()
    assert len(set(got[0, prompt.shape[1]:].tolist())) > 1
    # as tests/test_generation.py's GPT-2: generate's checks, prefill, the first, later and
    # last decode steps, and the result; the experts add none
    assert len({r.key for r in steps}) <= 9
    assert xlakit.metrics()["fallbacks"] == 0


def test_autocast_bfloat16_forward_equals_eager(dev):
    # bf16 autocast: the router's softmax and top-k run in float32 (transformers casts),
    # the experts' grouped products in bfloat16, as eager autocast's
    model, lazy, batch = _pair("mixtral", "grouped_mm")
    model.eval(), lazy.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(**batch)
        got = lazy(**{k: v.to(dev) for k, v in batch.items()})
    assert want.logits.dtype == torch.bfloat16 and want.loss.dtype == torch.float32
    # test_real_models' bf16 bar: a logit within 1.6% of the largest
    assert_same(got.logits, want.logits, rtol=1.6e-2, atol=1.6e-2 * want.logits.abs().max().item())
    assert_same(got.loss, want.loss, rtol=2e-4, atol=1e-3)
    assert xlakit.metrics()["fallbacks"] == 0


def test_autocast_bfloat16_training_matches_eager_amp(dev):
    # bf16 AMP training of a MoE model: the router's aux loss and the experts' ragged dots
    # under autocast, backward and AdamW outside, as test_real_models' Llama
    model, _, batch = _pair("mixtral", "grouped_mm")
    model.train()
    xlakit.reset_metrics()
    assert_amp_equal(train_amp_both(model, batch, dev))


# -- torch.compile on device-resident parameters ---------------------------------------
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
