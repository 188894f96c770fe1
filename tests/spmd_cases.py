"""Sharded programs on 8 CPU host devices, each equal to eager torch.

Not a test module: tests/test_spmd.py runs each function in a worker process
whose JAX starts with 8 host devices (XLA_FLAGS must be set before JAX starts,
and the rest of the suite keeps one device). A case raises on failure and may
return plain data for the test to check or report.
"""
from __future__ import annotations

import copy

import jax
import torch
import torch.nn.functional as F

import programs
import xlakit
from xlakit.analysis import flops
from xlakit.engine import executor
from xlakit.front import recorder
from xlakit.notebook import panels, render, sharding_view

TOL = dict(rtol=2e-4, atol=2e-5)  # tests/test_real_models.py's: sharded sums add in another order
LR, EPS = 1e-3, 1e-6              # and its AdamW settings (why: see there)


def _dev():
    assert len(jax.devices()) == 8, jax.devices()
    dev = xlakit.device()
    xlakit.mark_step()
    return dev


def _mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def _hf_loss(model, batch):
    return model(**batch).loss


def _train(model, batch, loss_fn, steps, shard=lambda model, batch: None):
    """AdamW steps of a copy of `model` in eager torch and of one on xlakit,
    `shard` laying the lazy model and batch out; returns (eager losses, lazy
    losses, eager model, lazy model, the step markers' records)."""
    dev = _dev()
    eager = copy.deepcopy(model)
    lazy = copy.deepcopy(model).to(dev)
    to_dev = (lambda b: tuple(t.to(dev) for t in b)) if isinstance(batch, tuple) else \
        (lambda b: {k: t.to(dev) for k, t in b.items()})
    lazy_batch = to_dev(batch)
    shard(lazy, lazy_batch)
    opts = [torch.optim.AdamW(m.parameters(), lr=LR, eps=EPS) for m in (eager, lazy)]
    eager_losses, lazy_losses, records = [], [], []
    for _ in range(steps):
        for m, opt, b, out in ((eager, opts[0], batch, eager_losses), (lazy, opts[1], lazy_batch, lazy_losses)):
            opt.zero_grad()
            loss = loss_fn(m, b)
            loss.backward()
            opt.step()
            if m is lazy:
                with xlakit.capture() as steps_run:
                    xlakit.mark_step()
                records += steps_run
            out.append(loss.item())
    return eager_losses, lazy_losses, eager, lazy, records


def _split_batch(mesh):
    def shard(model, batch):
        for t in (batch if isinstance(batch, tuple) else batch.values()):
            xlakit.mark_sharding(t, mesh, ("data",) + (None,) * (t.dim() - 1))
    return shard


def _fsdp(mesh):
    split = _split_batch(mesh)

    def shard(model, batch):
        xlakit.shard_module(model, mesh, "data")
        split(model, batch)
    return shard


def _assert_trained_alike(eager_losses, lazy_losses, eager, lazy):
    torch.testing.assert_close(lazy_losses, eager_losses, **TOL)
    for (name, p), q in zip(lazy.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), **TOL, msg=lambda m: f"{name}: {m}")


def _mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 16))
    return model, (torch.randn(32, 256), torch.randn(32, 16))


def _summary(records) -> dict:
    last = records[-1]
    return {"cache": [r.cache.value for r in records], "peak": last.memory.peak, "devices": last.memory.devices,
            "arguments": last.memory.arguments,
            "collectives": sorted({c.op for c in last.collectives}),
            "collective_bytes": sum(c.nbytes for c in last.collectives),
            "execute_ms": sorted(r.timings.execute for r in records[1:])[len(records[1:]) // 2] * 1e3}


def mlp_on_one_device() -> dict:
    model, batch = _mlp()
    eager_losses, lazy_losses, eager, lazy, records = _train(model, batch, _mse, 4)
    _assert_trained_alike(eager_losses, lazy_losses, eager, lazy)
    assert all(r.shardings is None and r.collectives == () for r in records)
    assert {p.sharding for r in records for p in r.graph.params} == {"one device"}
    return _summary(records)


def _mlp_trained_on_8_devices(placement) -> tuple:
    """The MLP trained 4 steps with `placement(mesh)` on an 8-device mesh, as eager;
    the last two steps hit the cache. Returns the lazy model and the records."""
    mesh = xlakit.Mesh((8,), ("data",))
    model, batch = _mlp()
    eager_losses, lazy_losses, eager, lazy, records = _train(model, batch, _mse, 4, placement(mesh))
    _assert_trained_alike(eager_losses, lazy_losses, eager, lazy)
    assert [r.cache for r in records[2:]] == ["hit", "hit"], [r.cache for r in records]
    return lazy, records


def mlp_data_parallel() -> dict:
    lazy, records = _mlp_trained_on_8_devices(_split_batch)
    last = records[-1]
    # the batch is split, the weights and their optimizer state whole on every device
    specs = {str(p.aval): p.sharding for p in last.graph.params}
    assert specs["f32[32,256]"] == "('data', None)" and specs["f32[256,256]"] == "replicated", specs
    # gradients are summed over the devices: the partitioner inserted all-reduces
    assert "all-reduce" in {c.op for c in last.collectives}, last.collectives
    assert last.memory.devices == 8 and last.shardings.mesh.shape == (8,)
    # every parameter and both AdamW moments are updated in place, sharded as they were
    assert len(last.donated) == 3 * len(list(lazy.parameters())), last.donated
    _assert_donors_keep_their_sharding(last)
    return _summary(records)


def _assert_donors_keep_their_sharding(record):
    """A donated buffer comes back as it went in (the outputs paired with donors
    come first, in donor order): the next step's inputs are laid out as this step's."""
    donors = sorted(d.index for d in record.donated)
    assert donors
    for output, index in zip(record.shardings.outputs, donors):
        assert output.spec == record.shardings.inputs[index].spec, (output, record.shardings.inputs[index])


def mlp_weight_sharded() -> dict:
    _, records = _mlp_trained_on_8_devices(_fsdp)
    last = records[-1]
    big = [p for p in last.graph.params if p.aval == "f32[256,256]"]
    assert len(big) == 6 and {p.sharding for p in big} == {"('data', None)"}, big  # 2 weights, 2 moments each
    _assert_donors_keep_their_sharding(last)
    # weights are gathered where they are used
    assert "all-gather" in {c.op for c in last.collectives}, last.collectives
    return _summary(records)


def _gpt2():
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    ids = torch.randint(0, 64, (8, 8))
    return transformers.GPT2LMHeadModel(cfg), dict(input_ids=ids, labels=ids)


def _llama():
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   attention_dropout=0.0)
    ids = torch.randint(0, 64, (8, 8))
    return transformers.LlamaForCausalLM(cfg), dict(input_ids=ids, labels=ids)


def transformer(name: str, layout: str) -> dict:
    """A transformers model (tiny config) trained data parallel or with its weights
    split too (FSDP style), equal to eager."""
    mesh = xlakit.Mesh((8,), ("data",))
    model, batch = {"gpt2": _gpt2, "llama": _llama}[name]()
    shard = {"data": _split_batch, "fsdp": _fsdp}[layout](mesh)
    eager_losses, lazy_losses, eager, lazy, records = _train(model, batch, _hf_loss, 3, shard)
    _assert_trained_alike(eager_losses, lazy_losses, eager, lazy)
    last = records[-1]
    assert last.cache == "hit", [r.cache for r in records]
    if name == "gpt2":  # tied: the LM head is the token embedding, one Parameter, sharded once
        assert lazy.lm_head.weight is lazy.transformer.wte.weight
    split = [p.sharding for p in last.graph.params if p.aval.startswith("f32[64,32]")]
    assert split and set(split) == ({"('data', None)"} if layout == "fsdp" else {"replicated"}), split
    return _summary(records)


def sharding_only_change_is_a_miss() -> dict:
    dev = _dev()
    mesh = xlakit.Mesh((8,), ("data",))
    xlakit.clear_cache()  # the closest cached key must be this case's

    def step(w):
        return (w * 2).sum(dim=0)

    host = torch.arange(64.0).reshape(8, 8)
    records = []
    for spec in (None, ("data", None), (None, "data"), ("data", None)):
        w = xlakit.label(host.to(dev), "w")
        if spec is not None:
            xlakit.mark_sharding(w, mesh, spec)
        out = step(w)
        xlakit.mark_step()
        records.append(xlakit.last_step())
        torch.testing.assert_close(out.cpu(), host.sum(dim=0) * 2)
    one, rows, cols, rows_again = records
    for r, was, now in ((rows, "one device", "('data', None)"), (cols, "('data', None)", "(None, 'data')")):
        assert r.cache != "hit" and r.changed == ("shardings",), (r.cache, r.changed)
        assert r.why == (f"input 0 (w) sharding now {now}, was {was}",), r.why
        assert r.components["graph"] == one.components["graph"] and r.key != one.key
    # identical shardings hit, from another source line too: metadata stays out of the key
    assert rows_again.cache == "hit" and rows_again.key == rows.key
    w = xlakit.mark_sharding(host.to(dev), mesh, ("data", None))
    out = (w * 2).sum(dim=0)  # the same graph at another line
    xlakit.mark_step()
    moved = xlakit.last_step()
    assert moved.cache == "hit" and moved.key == rows.key and moved.metadata_digest != rows.metadata_digest
    # a mark on a pending value is a node of the graph; changing it is a sharding-only change too
    marked = []
    for spec in (("data", None), (None, "data")):
        w = host.to(dev)
        y = xlakit.mark_sharding(w * 3, mesh, spec)
        z = y + 1
        xlakit.mark_step()
        marked.append(xlakit.last_step())
        torch.testing.assert_close(z.cpu(), host * 3 + 1)
    assert "xlakit.mark_sharding" in [n.op for n in marked[1].graph.nodes]
    assert marked[1].changed == ("shardings",), marked[1].changed
    assert marked[1].why[0].startswith("node %1 xlakit.mark_sharding now ($0, (None, 'data')) at "), marked[1].why
    assert marked[1].why[0].endswith(", was ($0, ('data', None))"), marked[1].why
    return {"why": [rows.why[0], cols.why[0], marked[1].why[0]]}


def _scalar_vectors(dev, mesh):
    # made on the device: a read of what integer ops compute from uploads alone is answered on
    # the host (front/host_reads.py), with no partial sync to test
    t0 = xlakit.mark_sharding(torch.full((8,), 1, device=dev), mesh, ("data",))
    t1 = xlakit.mark_sharding(torch.full((8,), 2, device=dev), mesh, ("data",))
    xlakit.mark_step()
    return t0, t1


def donation_at_step_markers_only(tmp: str) -> None:
    """tests/test_hashing_donation.py's seed scenarios, with every buffer split over 8 devices."""
    dev = _dev()
    mesh = xlakit.Mesh((8,), ("data",))
    # donor indices in the key (pytorch/xla #8464)
    t0, t1 = _scalar_vectors(dev, mesh)
    t2, donating, plain = programs.donating_then_plain(t0, t1)
    assert t1.cpu().tolist() == [3] * 8 and t2.cpu().tolist() == [4] * 8
    assert [(d.shape, d.dtype) for d in donating.donated] == [((8,), "int64")] and plain.donated == ()
    assert donating.shardings.inputs[donating.donated[0].index].spec == "('data',)"
    assert donating.shardings.outputs[0].spec == "('data',)"  # updated in place, still split
    assert donating.components["donors"] != plain.components["donors"]
    # a partial sync (save, sync, .item(), .cpu()) never donates (pytorch/xla #8422)
    for partial_sync in (lambda t: xlakit.save(t, tmp), lambda t: xlakit.sync([t]),
                         lambda t: t.sum().item(), lambda t: t.cpu()):
        t0, t1 = _scalar_vectors(dev, mesh)
        t2 = t0 + t1
        t1.add_(1)
        with xlakit.capture() as partial:
            partial_sync(t1)
        with xlakit.capture() as marker:
            xlakit.mark_step()
        assert partial and all(r.donated == () and "partial sync" in r.donation_note for r in partial), partial
        assert all(r.shardings is not None for r in partial + marker)
        assert t2.cpu().tolist() == [3] * 8 and t1.cpu().tolist() == [3] * 8
        # the step marker computes t2 and donates t1's old buffer, which nothing live reads any more
        [step] = marker
        assert [d.index for d in step.donated] == [1] and step.shardings.inputs[1].spec == "('data',)", step
    assert torch.load(tmp).tolist() == [3] * 8


def reads_gather_sharded_values() -> None:
    """.item(), .cpu() and partial syncs of values split over a 2 x 4 mesh, marks
    on pending values, views and in-place ops on sharded tensors: as eager."""
    dev = _dev()
    mesh = xlakit.Mesh((2, 4), ("data", "model"))
    host = torch.arange(4 * 6 * 8, dtype=torch.float32).reshape(4, 6, 8)
    x = xlakit.mark_sharding(host.to(dev), mesh, ("data", None, "model"))
    eager = host.clone()
    y = xlakit.mark_sharding(x * 2 + 1, mesh, (None, None, ("data", "model")))
    ey = eager * 2 + 1
    with xlakit.capture() as read:
        assert y.sum().item() == ey.sum().item()  # an implicit sync; it keeps y, which pending work reads
        torch.testing.assert_close(y.cpu(), ey)
        xlakit.sync([y])
    assert len(read) == 1 and read[0].donated == (), read
    assert [t.spec for t in read[0].shardings.outputs] == ["replicated", "(None, None, ('data', 'model'))"]
    for t in (x, eager):  # in place, through views
        t[:, 0].add_(5)
        t.transpose(0, 2)[1].mul_(-1)
    xlakit.mark_step()
    torch.testing.assert_close(x.cpu(), eager)
    torch.testing.assert_close(x[1:3, :, 2:6].sum(dim=(0, 2)).cpu(), eager[1:3, :, 2:6].sum(dim=(0, 2)))
    # what the record says is where JAX put the pieces: each device's index
    array = executor.current().read(recorder.unwrap(x)._state).array
    info = xlakit.last_step().shardings
    t = next(t for t in info.inputs if t.shape == (4, 6, 8))
    _assert_blocks_match(info.mesh, t, array)


def _assert_blocks_match(mesh, t, array):
    """sharding_view.blocks (the views' device grid) against the jax.Array's own shards."""
    held = sharding_view.blocks(mesh, t.axes)
    for shard in array.addressable_shards:
        block = tuple((s.start or 0) // n for s, n in zip(shard.index, t.shard_shape))
        assert shard.device.id in held[block], (shard.device.id, block, held)


def views() -> dict:
    """The sharding view of a 3-D tensor on a 2 x 4 mesh, the step view's tabs, the warning."""
    dev = _dev()
    mesh = xlakit.Mesh((2, 4), ("data", "model"))
    x = xlakit.mark_sharding(torch.ones(4, 4, 8).to(dev), mesh, ("data", None, "model"))
    big = xlakit.label(torch.ones(512, 1024).to(dev), "big")  # 2 MiB, whole on every device
    small = torch.ones(8).to(dev)
    out = (x * 2).sum() + big.sum() + small.sum()
    xlakit.mark_step()
    record = xlakit.last_step()
    text = repr(xlakit.sharding_view(record))
    assert "mesh (data=2, model=4), devices [0, 1, 2, 3, 4, 5, 6, 7]" in text, text
    assert "f32[4,4,8] ('data', None, 'model'): 64 B per device; blocks 2x1x4: 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7" \
        in text, text
    assert sharding_view.large_replicated(record) == ["input 1 big f32[512,1024]"]
    assert "WARNING: 1 input(s) and 0 output(s) of 1.0 MiB or more are replicated, whole on each of the 8 devices: " \
        "input 1 big" \
        in text, text
    html = xlakit.sharding_view(record)._repr_html_()
    assert html.count('<table class="grid">') == 1 + 2, html  # the mesh's grid, and x's two [i, :, :] grids
    assert "all-reduce" in html and "Memory per device (8 devices)" in html
    assert [title for title, _ in render.sections_html(record, None, False)][-2:] == \
        ["Sharding", "Collectives and memory"]
    assert "sharding: mesh (data=2, model=4) over 8 devices" in repr(record)
    assert out.item() == 4 * 4 * 8 * 2 + 512 * 1024 + 8
    return {"text": text}


def sharded_cost() -> dict:
    """A matmul split by rows over 8 devices: XLA counts one device's share, xlakit the
    whole program; the Cost panel compares the whole with XLA's count times 8."""
    dev = _dev()
    mesh = xlakit.Mesh((8,), ("data",))
    w = xlakit.mark_sharding(torch.randn(64, 64).to(dev), mesh, ("data", None))
    out = (w @ w.T).sum()
    xlakit.mark_step()
    record = xlakit.last_step()
    estimate = flops.by_module(record.graph).flops
    return {"estimate": estimate, "xla_per_device": record.cost.flops, "devices": record.memory.devices,
            "html": panels.cost_html(record), "value": out.item()}


def mlp_for_torch_xla() -> dict:
    """tests/spmd_torch_xla.py's program, on xlakit."""
    dev = _dev()
    mesh = xlakit.Mesh((2, 4), ("data", "model"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8)).to(dev)
    x = torch.randn(8, 16).to(dev)
    marks = {"0.weight": ("model", None), "2.weight": (None, "model"), "x": ("data", None)}
    tensors = {"0.weight": model[0].weight, "2.weight": model[2].weight, "x": x}
    for name, spec in marks.items():
        xlakit.mark_sharding(tensors[name], mesh, spec)
    losses, records = programs.sgd_steps(model, x, 3, lambda: (xlakit.mark_step(), xlakit.last_step())[1])
    tensors = {"0.weight": model[0].weight, "0.bias": model[0].bias, "2.weight": model[2].weight, "x": x}
    shards = {}
    for name, t in tensors.items():
        array = executor.current().read(recorder.unwrap(t)._state).array
        shards[name] = {s.device.id: [[sl.start or 0, sl.stop or n] for sl, n in zip(s.index, t.shape)]
                        for s in array.addressable_shards}
    labels = [p.label for p in records[-1].graph.params]
    specs = {name: records[-1].shardings.inputs[labels.index(name)].spec for name in tensors if name in labels}
    specs["x"] = records[-1].shardings.inputs[[p.aval for p in records[-1].graph.params].index("f32[8,16]")].spec
    return {"losses": losses, "params": {n: p.detach().cpu().tolist() for n, p in model.named_parameters()},
            "compiles": sum(r.cache != "hit" for r in records), "shards": shards, "specs": specs}


def bad_sharding_specs() -> dict:
    """Specs torch_xla refuses, each a clear error naming the tensor and line; the forms
    it accepts lay the tensor out as eager's values; the session goes on."""
    dev = _dev()
    mesh = xlakit.Mesh((2, 4), ("data", "model"))
    host = torch.arange(64.0).reshape(8, 8)
    t = host.to(dev)
    errors = {}
    for name, spec, tensor in [("repeated in one entry", (("data", "data"), None), t),
                               ("a bare string", "data", host.reshape(8, 2, 2, 2).to(dev)),
                               ("a bool entry", (True, None), t),
                               ("a bool inside an entry", (("data", False), None), t),
                               ("a bool spec", True, t),
                               ("None inside an entry", ((None, "data"), None), t),
                               ("an axis past the mesh", (2, None), t)]:
        try:
            xlakit.mark_sharding(tensor, mesh, spec)
        except ValueError as e:
            errors[name] = str(e)
    for spec in [(("data", "model"), None), [0, 1], ((1,), "data"), (None, None)]:
        u = xlakit.mark_sharding(host.to(dev) * 2, mesh, spec)
        torch.testing.assert_close(u.cpu(), host * 2)
    torch.testing.assert_close((t + 1).cpu(), host + 1)
    return errors


def compiled_step_keeps_shardings() -> dict:
    """A whole training step under torch.compile on a weight-sharded model, 4 calls, as eager:
    each parameter keeps its sharding (it was given back split another way, and the third
    call compiled the step again). Returns the specs after each call and the compile counts."""
    dev = _dev()
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    lazy = copy.deepcopy(eager).to(dev)
    mesh = xlakit.Mesh((8,), ("data",))
    xlakit.shard_module(lazy, mesh, "data")
    x, y = torch.randn(16, 16), torch.randn(16, 8)
    batches = {eager: (x, y), lazy: (x.to(dev), y.to(dev))}
    opts = {m: torch.optim.AdamW(m.parameters(), lr=LR, eps=EPS) for m in (eager, lazy)}
    xlakit.mark_step()

    def step(model):
        opts[model].zero_grad()
        loss = F.mse_loss(model(batches[model][0]), batches[model][1])
        loss.backward()
        opts[model].step()
        return loss

    def specs():  # one entry per dim (P('data') and P('data', None) are one layout)
        spec = {name: tuple(recorder.unwrap(p)._state.data.array.sharding.spec) for name, p in lazy.named_parameters()}
        return {name: str(s + (None,) * (p.dim() - len(s))) for (name, p), s in zip(lazy.named_parameters(),
                                                                                   spec.values())}

    before, compiled = specs(), torch.compile(step, backend="xlakit")
    after, compiles, eager_losses, lazy_losses = [], [], [], []
    for _ in range(4):
        eager_losses.append(step(eager).item())
        lazy_losses.append(compiled(lazy))
        xlakit.mark_step()
        lazy_losses[-1] = lazy_losses[-1].item()
        after.append(specs())
        compiles.append(executor.current().counters["compiles"] + executor.current().counters["persistent_cache_hits"])
    _assert_trained_alike(eager_losses, lazy_losses, eager, lazy)
    return {"before": before, "after": after, "compiles": compiles}
