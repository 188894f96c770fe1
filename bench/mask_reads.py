"""A transformers training step with an attention mask: executions per step and step time with
the host's copies of uploads (front/host_reads.py answers transformers' Python reads of the mask)
and without them (`config.host_copy_bytes = 0`: each read is an execution), one process,
alternated round by round. Also what an upload and a read of the mask cost each way.

    python bench/mask_reads.py [--quick]
"""
from __future__ import annotations

import argparse
import copy
import os
import timeit

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.masking_utils import fast_all  # noqa: E402

import xlakit  # noqa: E402
from timing import median_seconds  # noqa: E402
from xlakit.config import config  # noqa: E402

transformers.logging.set_verbosity_error()
ON = config.host_copy_bytes


def models(quick: bool):
    layers, hidden = (1, 32) if quick else (4, 256)
    yield "GPT-2", transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=1024, n_positions=128, n_embd=hidden, n_layer=layers, n_head=4, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0))
    yield "Llama", transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=1024, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128))


def step_of(model, batch):
    dev = xlakit.device()
    lazy = copy.deepcopy(model).to(dev)
    opt = torch.optim.AdamW(lazy.parameters(), lr=1e-3)

    def step():
        opt.zero_grad()
        lazy(**{k: v.to(dev) for k, v in batch.items()}).loss.backward()
        opt.step()
        xlakit.mark_step()
    return step


def executions_per_step(step) -> float:
    before = xlakit.metrics()["executions"]
    for _ in range(3):
        step()
    return (xlakit.metrics()["executions"] - before) / 3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny models, few steps (a smoke run)")
    quick = parser.parse_args().quick
    batch, length = (2, 16) if quick else (8, 128)
    torch.manual_seed(0)
    ids = torch.randint(1, 1024, (batch, length))
    mask = torch.ones_like(ids)
    mask[0, -length // 4:] = 0
    inputs = dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    print(f"batch {batch} x {length}, padded mask; torch {torch.__version__}, transformers {transformers.__version__}")
    print("| model | host copies | executions / step | ms / step, each round's median |\n|---|---|---|---|")
    for name, model in models(quick):
        times = {ON: [], 0: []}
        steps = {}
        for limit in (ON, 0):
            config.host_copy_bytes = limit
            steps[limit] = step_of(model, inputs)
            counts = executions_per_step(steps[limit])
            times[limit].append(counts)
        for _ in range(3):  # rounds alternated, so the machine's load falls on both alike
            for limit in (ON, 0):
                config.host_copy_bytes = limit
                times[limit].append(median_seconds(steps[limit], lambda: None, repeats=3 if quick else 5, warmup=1))
        for limit in (ON, 0):
            rounds = ", ".join(f"{1e3 * t:.0f}" for t in times[limit][1:])
            print(f"| {name} | {'on' if limit else 'off'} | {times[limit][0]:.0f} | {rounds} |")
    print("\n| mask | host copies | upload µs | `fast_all(mask.bool())` µs |\n|---|---|---|---|")
    dev = xlakit.device()
    for shape in [(2, 16), (8, 1024), (64, 2048)]:
        mask = torch.ones(shape, dtype=torch.long)
        mask[0, -3:] = 0
        for limit in (ON, 0):
            config.host_copy_bytes = limit
            m = mask.to(dev)
            read = lambda: bool(fast_all(m.bool()))  # noqa: E731
            read()
            up, rd = (min(timeit.repeat(f, number=20, repeat=5)) / 20 * 1e6 for f in (lambda: mask.to(dev), read))
            print(f"| {shape[0]} x {shape[1]} int64 | {'on' if limit else 'off'} | {up:.0f} | {rd:.0f} |")
    config.host_copy_bytes = ON


if __name__ == "__main__":
    main()
