"""tests/spmd_cases.py's `mlp_for_torch_xla` program on torch_xla's SPMD, 8 CPU devices.

Run by tests/test_spmd.py in a process of its own (PJRT_DEVICE=CPU
CPU_NUM_DEVICES=8, SPMD switched on before any tensor exists); prints one JSON
line: losses, parameters, compiles, and per tensor torch_xla's sharding spec and
the piece each device holds.
"""
import json

import numpy as np
import torch
import torch_xla
import torch_xla.debug.metrics as met
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

import programs

xr.use_spmd()
dev = torch_xla.device()
mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8)).to(dev)
x = torch.randn(8, 16).to(dev)
for t, spec in ((model[0].weight, ("model", None)), (model[2].weight, (None, "model")), (x, ("data", None))):
    xs.mark_sharding(t, mesh, spec)
losses, _ = programs.sgd_steps(model, x, 3, torch_xla.sync)
tensors = {"0.weight": model[0].weight, "0.bias": model[0].bias, "2.weight": model[2].weight, "x": x}
shards, specs = {}, {}
for name, t in tensors.items():
    specs[name] = torch_xla._XLAC._get_xla_sharding_spec(t) or "replicated (no sharding)"
    sharded = xs.wrap_if_sharded(t)
    pieces = sharded.local_shards if hasattr(sharded, "local_shards") else []
    shards[name] = {int(s.shard_device.split(":")[1]):
                    [[0, n] for n in t.shape] if s.indices is Ellipsis else [[sl.start, sl.stop] for sl in s.indices]
                    for s in pieces}
print(json.dumps({"losses": losses, "params": {n: p.detach().cpu().tolist() for n, p in model.named_parameters()},
                  "compiles": met.counter_value("UncachedCompile"), "shards": shards, "specs": specs}))
