"""Mixture-of-experts transformers models (Mixtral, Qwen2-MoE, OLMoE) on the lazy device,
for each of transformers' experts implementations.

"grouped_mm" (transformers' default: tokens sorted by expert, `torch._grouped_mm`, a ragged
dot here) and "batched_mm" (each token's expert weights gathered, `bmm`) have static shapes:
they train eager-equal with the router's load-balancing loss, compile twice and never fall
back. "eager" loops over the experts a batch routes to, with `nonzero` per expert: its
shapes depend on the routing, so it falls back and recompiles as the routing changes.

Under torch.compile: tests/test_moe_compiled.py.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded

import copy  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

transformers = pytest.importorskip("transformers")

from conftest import assert_same  # noqa: E402
from test_real_models import (_FALLBACK, STEPS, TOL, Steps, assert_amp_equal, fallback_warnings,  # noqa: E402, F401
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


# "batched_mm" is one function of transformers' for every model (integrations/moe.py, through
# `use_experts_implementation`): one model trains with it; each model's own parts (its router, Qwen2-MoE's
# shared expert) train with the default "grouped_mm"
@pytest.mark.parametrize("name, implementation", [(name, "grouped_mm") for name in MODELS] + [("mixtral", "batched_mm")])
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
