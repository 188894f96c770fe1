"""One process of a 2-process xlakit run on JAX's distributed runtime (localhost, 4 CPU
devices each, gloo collectives): a data-parallel training step over all 8 devices,
beside the same steps in eager torch. Run by tests/test_spmd.py:
`python spmd_multiprocess.py PROCESS_ID PORT`; prints one JSON line.
"""
import copy
import json
import sys

import jax

process_id, port = int(sys.argv[1]), int(sys.argv[2])
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_num_cpu_devices", 4)
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                           coordinator_bind_address=f"127.0.0.1:{port}",  # loopback only
                           initialization_timeout=120)

import torch  # noqa: E402

import xlakit  # noqa: E402

dev = xlakit.device()
mesh = xlakit.Mesh((8,), ("data",))  # all 8 devices, 4 in each process
torch.manual_seed(0)  # every process builds the same model and global batch
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
eager = copy.deepcopy(model)
x, y = torch.randn(16, 16), torch.randn(16, 4)
model.to(dev)
xd = xlakit.mark_sharding(x.to(dev), mesh, ("data", None))  # this process keeps its 4 devices' rows
yd = xlakit.mark_sharding(y.to(dev), mesh, ("data", None))
opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, eager)]
losses, eager_losses = [], []
for _ in range(3):
    for m, opt, a, b, out in ((model, opts[0], xd, yd, losses), (eager, opts[1], x, y, eager_losses)):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(a), b)
        loss.backward()
        opt.step()
        if m is model:
            xlakit.mark_step()
        out.append(loss.item())
records = xlakit.steps()
# a value split over both processes' devices, read back whole
split = xlakit.mark_sharding(model[0].weight * 1, mesh, ("data", None)).cpu()
print(json.dumps({
    "process": jax.process_index(), "local_devices": [d.id for d in jax.local_devices()],
    "losses": losses, "eager_losses": eager_losses,
    "params_equal": all(torch.allclose(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)
                        for p, q in zip(model.parameters(), eager.parameters())),
    "gathered_equal": torch.allclose(split, eager[0].weight.detach(), rtol=1e-5, atol=1e-6),
    "records": [{"cache": r.cache.value, "devices": r.memory.devices if r.memory else None,
                 "collectives": sorted({c.op for c in r.collectives}), "donated": len(r.donated),
                 "mesh": list(r.shardings.mesh.shape)} for r in records],
}), flush=True)
