"""The refactor safety net's programs (tests/net/snapshot.py runs them): small, deterministic.

Each is a function of no arguments whose step records (xlakit.capture()) are the snapshot;
tests/net/snapshot.py runs them. They are the suite's own programs where it has them
(tests/parity.py's seed scenarios, tests/programs.py's SGD and Llama steps,
tests/spmd_cases.py's data-parallel MLP), so the net holds what the suite already checks
for values: here only what each step compiled, keyed and donated is kept.
"""
import torch
import torch.nn.functional as F

import parity
import programs
import xlakit


def _seed(name):
    def run():
        parity.SCENARIOS[name](parity.Xlakit())
    run.__name__ = f"seed_{name}"
    return run


# The DESIGN's scenarios (donors in the key, save and partial syncs never donate, metadata
# out of the key, a lifted learning rate, views, operand wiring). Its training loop is the
# MLP program's ground, run there as programs.sgd_steps.
SEEDS = [_seed(name) for name in parity.SCENARIOS if name != "training_loop"]


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def mlp_sgd():
    """Three SGD steps of a two-layer MLP, a step marker after each."""
    dev = xlakit.device()
    model = _mlp().to(dev)
    x = torch.randn(6, 4).to(dev)
    programs.sgd_steps(model, x, 3, xlakit.mark_step)


def llama_adamw():
    """Three AdamW steps of a 2-layer transformers Llama (hidden 32, vocab 64)."""
    programs.llama_record(layers=2, steps=3)


def compiled_sgd():
    """Three calls of a whole SGD step under torch.compile(backend="xlakit")."""
    dev = xlakit.device()
    model = _mlp().to(dev)
    x, y = torch.randn(6, 4).to(dev), torch.randn(6, 2).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xlakit.mark_step()

    def step():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    compiled = torch.compile(step, backend="xlakit")
    for _ in range(3):
        compiled()
        xlakit.mark_step()


def sharded_adamw():
    """tests/spmd_cases.py's data-parallel MLP: four AdamW steps, the batch split over 8 devices."""
    import spmd_cases

    spmd_cases.mlp_data_parallel()


# name -> (program, host devices its process starts with)
PROGRAMS = {f.__name__: (f, 1) for f in (*SEEDS, mlp_sgd, llama_adamw, compiled_sgd)}
PROGRAMS["sharded_adamw"] = (sharded_adamw, 8)


def groups() -> list[list[str]]:
    """The programs by the device count their process starts with (JAX reads it once)."""
    by_devices = {}
    for name, (_, devices) in PROGRAMS.items():
        by_devices.setdefault(devices, []).append(name)
    return list(by_devices.values())
