"""Parameters and buffers shared by several modules stay shared on the device
(GPT-2's LM head is its token embedding): one object, the whole gradient."""
import copy

import pytest
import torch
import torch.nn as nn
from conftest import assert_same

import xlakit


class TiedLM(nn.Module):
    """A token embedding reused as the output layer, a buffer registered twice,
    and one block used at two depths."""

    def __init__(self, device=None):
        super().__init__()
        self.embed = nn.Embedding(11, 6, device=device)
        self.block = nn.Linear(6, 6, device=device)
        self.layers = nn.ModuleList([self.block, nn.Linear(6, 6, device=device), self.block])
        self.head = nn.Linear(6, 11, bias=False, device=device)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.full((6,), 0.5, device=device))
        self.layers[1].register_buffer("scale", self.scale)

    def forward(self, ids):
        h = self.embed(ids) * self.scale
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return self.head(h)


def shared_names(model):
    return [n for n, _ in model.named_parameters(remove_duplicate=False)]


def assert_tied(model, dev):
    assert model.head.weight is model.embed.weight
    assert model.layers[0] is model.layers[2]
    assert model.layers[1].scale is model.scale
    assert model.embed.weight.device == model.scale.device == dev
    assert len(list(model.parameters())) == 5  # embed, block w+b, layers.1 w+b
    assert len(shared_names(model)) == 10  # every place a parameter stands


MOVES = {
    "to": lambda m, dev: m.to(dev),
    "to_dtype": lambda m, dev: m.to(device=dev, dtype=torch.float32),
    "to_empty_then_load": lambda m, dev: m.to_empty(device=dev).load_state_dict(
        copy.deepcopy(m).state_dict()) and m,
    "load_state_dict_assign": lambda m, dev: m.load_state_dict(
        {k: v.to(dev) for k, v in m.state_dict().items()}, assign=True) and m,
}


@pytest.mark.parametrize("move", sorted(MOVES))
def test_moves_keep_shared_tensors_shared(dev, move):
    torch.manual_seed(0)
    model = TiedLM()
    before = shared_names(model)
    MOVES[move](model, dev)
    assert shared_names(model) == before
    assert_tied(model, dev)


def test_to_empty_keeps_sharing(dev):
    with torch.device("meta"):
        model = TiedLM()
    model.to_empty(device=dev)
    assert_tied(model, dev)


def test_skip_init_keeps_sharing(dev):
    model = torch.nn.utils.skip_init(TiedLM, device=dev)
    assert_tied(model, dev)


def test_a_shared_tensor_is_uploaded_once(dev):
    model = TiedLM()
    model.to(dev)
    value = xlakit.front.recorder.unwrap(model.head.weight)._state
    assert value is xlakit.front.recorder.unwrap(model.embed.weight)._state


def test_tied_training_matches_eager(dev):
    torch.manual_seed(0)
    model = TiedLM()
    lazy = copy.deepcopy(model).to(dev)
    assert_tied(lazy, dev)
    ids, target = torch.randint(0, 11, (4, 5)), torch.randint(0, 11, (4, 5))
    runs = []
    for m, d in ((model, "cpu"), (lazy, dev)):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(m(ids.to(d)).flatten(0, 1), target.to(d).flatten())
            loss.backward()
            opt.step()
            xlakit.mark_step()
            losses.append(loss.detach())
        runs.append(losses)
    for got, want in zip(runs[1], runs[0]):
        assert_same(got, want, rtol=1e-5, atol=1e-6)
    for (name, got), want in zip(lazy.state_dict().items(), model.state_dict().values()):
        assert_same(got, want, rtol=1e-5, atol=1e-6)
    assert_same(lazy.embed.weight.grad, model.embed.weight.grad, rtol=1e-5, atol=1e-6)


def test_vector_to_parameters_keeps_sharing(dev):
    torch.manual_seed(0)
    model = TiedLM()
    lazy = copy.deepcopy(model).to(dev)
    vector = torch.nn.utils.parameters_to_vector(model.parameters()) * 2
    torch.nn.utils.vector_to_parameters(vector, model.parameters())
    torch.nn.utils.vector_to_parameters(vector.to(dev), lazy.parameters())
    assert_tied(lazy, dev)
    for got, want in zip(lazy.parameters(), model.parameters()):
        assert_same(got.detach(), want.detach())
