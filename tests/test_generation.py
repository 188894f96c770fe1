"""transformers' greedy generate() of a small GPT-2 on the lazy device: eager's
tokens, and a bounded number of executables with a static cache."""
import copy

import pytest
import torch

import xlakit

transformers = pytest.importorskip("transformers")

PROMPT = [[1, 5, 7, 9, 3]]

# Executables of one greedy generate() with cache_implementation="static",
# whatever the number of new tokens (3 or more):
#   1  generate's own check before the loop of the mask it made on the device
#      (ones_like: a fill): (attention_mask == 1).all() before dropping an all-ones
#      mask. Its three others read only what the host uploaded, and are answered on
#      the host (front/host_reads.py): isin(eos, pad).any() and (eos < 0).any() in
#      _prepare_special_tokens, (input_ids < 0).any() in _get_logits_processor
#   1  prefill, with the first token's stop check (`bool(unfinished.max() == 0)`)
#   1  the first decode step: it reads the prompt's position_ids ([1, 5]),
#      later steps the previous step's ([1, 1])
#   1  every later decode step, but the last
#   1  the last decode step: MaxLengthCriteria fills its `done` tensor with the
#      Python bool `cur_len >= max_length`, a constant that is True only here
#   1  reading the result: prompt and new tokens concatenated (.cpu())
STATIC_EXECUTABLES = 6


@pytest.fixture(scope="module")
def gpt2():
    """(model on the lazy device, its eager copy on CPU)."""
    # initial weights wide enough that the tokens vary (at the default 0.02 a
    # random GPT-2 repeats the prompt's last token)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64,
                                     bos_token_id=99, eos_token_id=99, initializer_range=0.2)
    torch.manual_seed(0)
    eager = transformers.GPT2LMHeadModel(config).eval()
    return copy.deepcopy(eager).to(xlakit.device()), eager


def _generate(model, tokens, cache):
    kwargs = {"cache_implementation": cache} if cache else {}
    ids = torch.tensor(PROMPT, device=next(model.parameters()).device)
    start = xlakit.last_step().index + 1 if xlakit.last_step() else 0
    out = model.generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0, **kwargs).cpu()
    return out, [r for r in xlakit.steps() if r.index >= start]


@pytest.mark.parametrize("cache", [None, "static"])
def test_greedy_tokens_equal_eager(gpt2, cache):
    lazy, eager = gpt2
    tokens, _ = _generate(lazy, 6, cache)
    want, _ = _generate(eager, 6, cache)
    assert tokens.shape == (1, len(PROMPT[0]) + 6)
    assert tokens.tolist() == want.tolist()
    assert len(set(tokens[0, len(PROMPT[0]):].tolist())) > 1


def test_static_cache_executables_do_not_grow_with_new_tokens(gpt2):
    lazy, _ = gpt2
    counts = {}
    for tokens in (4, 8):
        _, records = _generate(lazy, tokens, "static")
        assert len(records) == 1 + tokens + 1  # the mask's check, one stop check per token, the result
        counts[tokens] = len({r.key for r in records})
    assert counts == {4: STATIC_EXECUTABLES, 8: STATIC_EXECUTABLES}


@pytest.mark.parametrize("cache", [None, "static"])
def test_a_second_generate_compiles_nothing(gpt2, cache):
    lazy, _ = gpt2
    _generate(lazy, 5, cache)
    compiles = xlakit.metrics()["compiles"]
    _, records = _generate(lazy, 5, cache)
    assert xlakit.metrics()["compiles"] == compiles
    assert {r.cache for r in records} == {"hit"}

