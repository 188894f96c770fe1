"""torch.compile of models whose parameters live on xlakit's device: Dynamo never
starts a frame in xlakit's code, values equal eager's."""
import collections
import contextlib
import copy
import logging
import os

import jax
import pytest
import torch
from conftest import assert_same

import xlakit

_XLAKIT_DIR = os.path.dirname(xlakit.__file__) + os.sep


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class DynamoLog:
    """What Dynamo logged: the files of the frames it started compiling, and every message."""

    def __init__(self):
        self.frames: collections.Counter = collections.Counter()
        self.messages: list[str] = []

    def xlakit_frames(self) -> dict:
        return {file: n for file, n in self.frames.items() if file.startswith(_XLAKIT_DIR)}


class _Handler(logging.Handler):
    def __init__(self, log: DynamoLog):
        super().__init__(logging.DEBUG)
        self.log = log

    def emit(self, record):
        if record.msg.startswith("torchdynamo start compiling"):  # (name, file, line, ...)
            self.log.frames[record.args[1]] += 1
        self.log.messages.append(record.getMessage())


# Dynamo's logs of each traced instruction, source line and call: a record per bytecode, formatted
# with the value stack, which made the tests that capture the log spend ~5% of their time logging;
# and its side-effect summaries, each with the Python stack above it (torch 2.13: the GPT-2
# training step test took 62.5 s alone with them, 27.7 s without)
_NOISY_LOGS = [*(f"torch._dynamo.symbolic_convert.__{name}" for name in ("trace_bytecode", "trace_source", "trace_call")),
               "torch._dynamo.side_effects.__side_effects"]


@contextlib.contextmanager
def dynamo_log():
    """Dynamo's log at DEBUG (its per-instruction trace logs left out), captured instead of printed."""
    logger, traces = logging.getLogger("torch._dynamo"), [logging.getLogger(name) for name in _NOISY_LOGS]
    log = DynamoLog()
    levels, handlers = [lg.level for lg in [logger, *traces]], logger.handlers[:]
    logger.handlers = [_Handler(log)]
    logger.setLevel(logging.DEBUG)
    for trace in traces:
        trace.setLevel(logging.INFO)
    try:
        yield log
    finally:
        logger.handlers = handlers
        for lg, level in zip([logger, *traces], levels):
            lg.setLevel(level)  # not `level =`: setLevel clears the loggers' cached isEnabledFor answers


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))



def _compiled_mlp(dev):
    """(eager MLP, its copy on the device, that copy compiled, an input) from seed 0."""
    torch.manual_seed(0)
    eager = MLP()
    model = copy.deepcopy(eager).to(dev)
    return eager, model, torch.compile(model, backend="xlakit"), torch.randn(3, 8)

def test_dynamo_starts_no_frame_in_xlakit_for_a_compiled_forward(dev):
    eager, model, compiled, x = _compiled_mlp(dev)
    with dynamo_log() as log:
        for _ in range(2):
            got = compiled(x.to(dev))
    assert_same(got.detach(), eager(x).detach())
    assert log.xlakit_frames() == {}, log.frames
    assert sum(log.frames.values()) == 1, log.frames  # the model's forward, once
    assert not _failures(log)


def test_dynamo_starts_no_frame_in_xlakit_for_a_compiled_training_step(dev):
    torch.manual_seed(0)
    eager = MLP()
    model = copy.deepcopy(eager).to(dev)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in (eager, model)]

    def step(model, optimizer, x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    compiled = torch.compile(step, backend="xlakit")
    x, y = torch.randn(3, 8), torch.randn(3, 4)
    with dynamo_log() as log:
        for _ in range(3):
            got = compiled(model, optimizers[1], x.to(dev), y.to(dev))
            want = step(eager, optimizers[0], x, y)
            assert_same(got.detach(), want.detach(), atol=1e-6, rtol=1e-5)
    for p, q in zip(model.parameters(), eager.parameters()):
        assert_same(p.detach(), q.detach(), atol=1e-6, rtol=1e-5)
    assert log.xlakit_frames() == {}, log.frames
    assert not _failures(log)


def test_compiling_a_module_does_not_warn_about_global_hooks(dev, recwarn):
    model = MLP().to(dev)
    modules = torch.nn.modules.module
    assert not modules._has_any_global_hook()  # xlakit's forward hooks are the modules' own
    assert all(len(m._forward_pre_hooks) == len(m._forward_hooks) == 1 for m in model.modules())
    torch.compile(model, backend="xlakit")(torch.randn(3, 8).to(dev))
    assert not [w for w in recwarn if "global hooks" in str(w.message)]


@pytest.mark.parametrize("order", ["move_then_compile", "compile_then_move", "compiled_block"])
def test_a_compiled_modules_wrapper_is_unhooked_after_its_first_call_and_names_its_parameters(dev, order):
    # hooks on the wrapper cost ~10 µs of each call; its parameters were named `_orig_mod.*`
    model = MLP()
    if order == "move_then_compile":
        compiled = torch.compile(model.to(dev), backend="xlakit")
    elif order == "compile_then_move":
        compiled = torch.compile(model, backend="xlakit").to(dev)
    else:  # a block compiled inside a model on the device, which runs first: names relative to it
        model.l2 = torch.compile(model.l2.to(dev), backend="xlakit")
        compiled = model.to(dev)
    with torch.no_grad():
        for _ in range(2):
            compiled(torch.randn(3, 8).to(dev))
    wrapper = model.l2 if order == "compiled_block" else compiled
    assert not wrapper._forward_pre_hooks and not wrapper._forward_hooks
    assert all(len(m._forward_pre_hooks) == len(m._forward_hooks) == 1 for m in wrapper._orig_mod.modules())
    records = [r for r in xlakit.steps()[-2:] if r.trigger in ("compiled", "mark_step", "dynamo")]
    labels = {p.label for r in records for p in r.graph.params} - {None, "scalar"}
    assert labels == {"l1.weight", "l1.bias", "l2.weight", "l2.bias"}, labels


# -- compiled inference and training steps against eager ------------------------------
# test_modules.py's and test_real_models.py's tolerances
TOL = dict(rtol=2e-4, atol=2e-5)
STEPS = 4


def mlp(p):
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(p), torch.nn.Linear(32, 4))
    return model, (torch.randn(16, 8),), torch.randn(16, 4), torch.nn.functional.mse_loss


def cnn(p):
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Dropout(p), torch.nn.Linear(8, 4))
    return model, (torch.randn(4, 3, 12, 12),), torch.randint(0, 4, (4,)), torch.nn.functional.cross_entropy


def gpt2(p):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                                  resid_pdrop=p, embd_pdrop=p, attn_pdrop=p)
    ids = torch.randint(0, 64, (2, 8))

    def loss(logits, labels):
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64), labels[:, 1:].reshape(-1))
    return _Logits(transformers.GPT2LMHeadModel(cfg)), (ids,), ids, loss


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        # the call a user writes: config.use_cache makes it build a DynamicCache, in training too
        return self.model(input_ids=ids).logits


MODELS = {"mlp": mlp, "cnn": cnn, "gpt2": gpt2}
OPTIMIZERS = {
    # eps 1e-6: see test_real_models.py (a zero true gradient is rounding noise, which Adam amplifies)
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, eps=1e-6),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
}


def _to(value, dev):
    return tuple(v.to(dev) for v in value) if isinstance(value, tuple) else value.to(dev)


@pytest.mark.parametrize("name", MODELS)
def test_compiled_inference_matches_eager(dev, name):
    torch.manual_seed(0)
    eager, inputs, _, _ = MODELS[name](0.0)
    eager.eval()
    model = copy.deepcopy(eager).to(dev)
    compiled = torch.compile(model, backend="xlakit")
    with dynamo_log() as log, xlakit.integrations.dynamo.compiled_graphs() as graphs:
        for _ in range(STEPS):
            before = len(xlakit.steps())
            with torch.no_grad():
                got = compiled(*_to(inputs, dev))
            records = xlakit.steps()[before:]
            assert_same(got, eager(*inputs).detach(), **TOL)
    assert log.xlakit_frames() == {}
    assert sum(log.frames.values()) == 1 and len(graphs) == 1, (log.frames, graphs)  # one frame, one graph
    # each later call: one execution of the graph's executable on the device buffers
    assert [(r.trigger, r.cache) for r in records] == [("compiled", "hit")]
    assert records[0].num_inputs > len(list(model.parameters()))  # the parameters are inputs, not constants
    # nodes are named by the module that ran them, as on the lazy path
    modules = {n.module for n in records[0].graph.nodes}
    assert {"model.transformer.h.1.attn", "model.lm_head"} <= modules if name == "gpt2" else {"0", "3"} <= modules
    assert not _failures(log)


def test_two_graphs_of_one_key_each_show_their_own_module_paths(dev):
    # the same MLP at the top and inside a Sequential: one key (paths are metadata), one
    # executable, two graphs whose records name their own modules
    torch.manual_seed(0)
    calls = [torch.compile(m.to(dev), backend="xlakit") for m in (MLP(), torch.nn.Sequential(MLP()))]
    x = torch.randn(3, 8).to(dev)
    with torch.no_grad():
        for _ in range(2):
            for call in calls:
                call(x)
        with xlakit.capture() as records:
            for call in calls * 2:
                call(x)
    assert len({r.key for r in records}) == 1 and [r.cache for r in records] == ["hit"] * 4, records
    paths = [{n.module for n in r.graph.nodes} - {""} for r in records]
    assert paths == [{"l1", "l2"}, {"0", "0.l1", "0.l2"}] * 2, paths  # "0": its own relu


def _device_bytes() -> int:
    return sum(a.nbytes for a in jax.live_arrays() if not a.is_deleted())


def test_a_compiled_calls_dropped_outputs_free_their_buffers(dev):
    # compiled calls make no sync: each call's dead output was kept until 10,000 tensors
    # had been registered (8 MiB per call of a Linear's output, 2.4 GB after 300 calls)
    compiled = torch.compile(torch.nn.Linear(8, 256).to(dev), backend="xlakit")
    x = torch.randn(64, 8).to(dev)
    with torch.no_grad():
        y = compiled(x)
        y = compiled(x)
        xlakit.wait()
        before = _device_bytes()
        for _ in range(20):
            y = compiled(x)
        xlakit.wait()
        assert _device_bytes() <= before, "the 19 dropped outputs are still held"
        assert_same(y, compiled._orig_mod.cpu()(x.cpu()), **TOL)


def _update_and_alias(x, y):
    y.add_(1)            # an input updated in place
    return x.t(), x * y  # a view of an input


def test_compiled_inference_that_updates_or_aliases_an_input_matches_eager(dev):
    # an inference graph is called without AOTAutograd's runtime wrappers only where they
    # would do nothing: here they copy y's new value in and make the view of x
    compiled = torch.compile(_update_and_alias, backend="xlakit")
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    xd, yd = x.to(dev), y.to(dev)
    with torch.no_grad():
        for _ in range(3):
            got, want = compiled(xd, yd), _update_and_alias(x, y)
            assert_same(got[0], want[0])
            assert_same(got[1], want[1], **TOL)
            assert_same(yd, y)
    xd.mul_(2)  # the view sees its base's update, as eager's does
    x.mul_(2)
    assert_same(got[0], want[0])


def _accumulate(x, total):
    total.add_(x)  # an input updated in place
    return total * 2


def test_compiled_inference_that_updates_an_input_matches_eager(dev):
    # called without AOTAutograd's runtime wrappers: xlakit gives the input its new value
    compiled = torch.compile(_accumulate, backend="xlakit")
    x, total = torch.randn(3, 4), torch.zeros(3, 4)
    xd, totald = x.to(dev), total.to(dev)
    row, eager_row = totald[1], total[1]  # a view of the input sees each update, as eager's
    versions = totald._version, total._version
    for _ in range(3):  # grad on: the graph, an inference one (nothing needs grad), runs with it off
        got, want = compiled(xd, totald), _accumulate(x, total)
        assert_same(got, want, **TOL)
        assert_same(totald, total, **TOL)
        assert_same(row, eager_row, **TOL)
    # counted as eager's in-place update is: autograd sees a saved tensor was changed
    assert totald._version - versions[0] == total._version - versions[1] == 3


def _failures(log: DynamoLog) -> list[str]:
    """Dynamo's messages that it could not fake a tensor or gave up recompiling."""
    return [m for m in log.messages if "meta converter" in m or "recompile_limit" in m]


def train_step(model, optimizer, inputs, target, loss_fn):
    loss = loss_fn(model(*inputs), target)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


# GPT-2 with AdamW only: SGD's momentum buffers (new at the second step) are the MLP's and the
# CNN's case; GPT-2 with SGD took 53 s of the latest column's CI (torch 2.13) for nothing more.
@pytest.mark.parametrize("name, opt_name", [(name, opt) for name in MODELS for opt in OPTIMIZERS
                                             if name != "gpt2" or opt == "adamw"])
def test_compiled_training_step_matches_eager(dev, name, opt_name):
    """Over 20 s for GPT-2 under torch 2.13 (27.7 s alone here, 62.5 s before _NOISY_LOGS held Dynamo's
    side-effect summaries back): Dynamo and AOTAutograd trace its training step's graphs."""
    # dropout in the MLP, its masks drawn again by torch's CPU generator at each replay; none in
    # the CNN, whose forward graph replays and donates BatchNorm's statistics
    dropout = 0.1 if name == "mlp" else 0.0
    torch.manual_seed(0)
    eager, inputs, target, loss_fn = MODELS[name](dropout)
    model = copy.deepcopy(eager).to(dev)
    eager_opt, opt = OPTIMIZERS[opt_name](eager.parameters()), OPTIMIZERS[opt_name](model.parameters())
    compiled = torch.compile(train_step, backend="xlakit")
    frames = []
    # what a fresh process has: no run an earlier test recorded after the same sync (train_step's
    # line) for this test's last step to replay, or to back off from
    xlakit.reset()
    with dynamo_log() as log, xlakit.integrations.dynamo.compiled_graphs() as graphs:
        # two steps more: SGD's momentum buffers, new at the second step, trace its graph again, and
        # the sync before that trace leaves BatchNorm's updates for the third: the fourth is the first
        # of the steps that repeat, the fifth the first recorded after the sync that ended a repeat,
        # and the sixth replays that recording
        for step in range(STEPS + 2):
            torch.manual_seed(step)  # dropout draws the same masks in both
            before = len(xlakit.steps())
            got = compiled(model, opt, _to(inputs, dev), target.to(dev), loss_fn)
            records = xlakit.steps()[before:]
            torch.manual_seed(step)
            want = train_step(eager, eager_opt, inputs, target, loss_fn)
            assert_same(got.detach(), want.detach(), **TOL)
            frames.append(sum(log.frames.values()))
    for (n, p), q in zip(model.state_dict().items(), eager.state_dict().values()):
        assert_same(p, q, **TOL), n  # parameters and BatchNorm's running statistics
    assert log.xlakit_frames() == {}
    assert frames[1] == frames[-1], frames  # no recompile after the first step
    assert len(graphs) >= 3, graphs  # forward, backward, optimizer step
    assert all(g.replays for g in graphs), graphs  # each runs its executable, not traced again
    # the last step: forward, backward and optimizer graphs one executable, and nothing else runs
    # (AdamW's step counts, wanted on the host, are its outputs, read after it); what it updates in place
    # is donated: parameters, momentum or both moments, BatchNorm's statistics
    assert [(r.trigger, r.cache) for r in records] == [("compiled", "hit")], records
    assert all(r.num_nodes > 1 for r in records), [r.num_nodes for r in records]
    # its graphs, recorded again as the step before recorded them, reuse that step's cut and key
    assert records[0].replay.recorded == 0 and records[0].replay.replayed >= records[0].num_nodes, records[0].replay
    modules = {n.module for r in records for n in r.graph.nodes}
    assert {"0", "backward.0", "optimizer"} <= modules if name != "gpt2" else {"model.lm_head", "optimizer"} <= modules
    shapes = [tuple(p.shape) for p in model.parameters()] * (2 if opt_name == "sgd_momentum" else 3)
    state = collections.Counter(shapes + [tuple(b.shape) for b in model.buffers()])
    donated = collections.Counter(d.shape for r in records for d in r.donated)
    assert not state - donated, (state, donated)
    assert all(shape == () for shape in donated - state), donated  # and dead temporaries: an uploaded scalar
    assert not _failures(log)


class _Block(torch.nn.Module):
    """Chains of pointwise ops and a norm between matmuls: what a default split saves for backward."""

    def __init__(self):
        super().__init__()
        self.up, self.norm, self.down = torch.nn.Linear(8, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)

    def forward(self, x):
        h = self.norm(torch.nn.functional.gelu(self.up(x)))
        return torch.softmax(self.down(h * torch.sigmoid(h)), dim=-1)


def _computed_outputs(gm: torch.fx.GraphModule) -> int:
    """How many of a graph's outputs it computes (not an input passed through)."""
    outputs = xlakit.integrations.fx_interpreter.flatten(gm.graph.output_node().args[0])
    return sum(isinstance(o, torch.fx.Node) and o.op != "placeholder" for o in outputs)


def _block_trained(dev, monkeypatch, partition) -> tuple[int, tuple]:
    """_Block's AdamW step compiled, its backward split off by `partition`, three steps checked against
    eager: (how many activations its forward returns past the loss, the last step's cost and peak memory)."""
    from xlakit.integrations import dynamo

    torch._dynamo.reset()
    monkeypatch.setattr(dynamo, "_recomputing_partition", partition)
    forwards, compile_fx = [], dynamo._compile_fx

    def spied(gm, example_inputs, *, forward, training):
        if forward and training:
            forwards.append(gm)
        return compile_fx(gm, example_inputs, forward=forward, training=training)
    monkeypatch.setattr(dynamo, "_compile_fx", spied)
    torch.manual_seed(0)
    eager = _Block()
    model = copy.deepcopy(eager).to(dev)
    eager_opt, opt = OPTIMIZERS["adamw"](eager.parameters()), OPTIMIZERS["adamw"](model.parameters())
    compiled = torch.compile(train_step, backend="xlakit")
    x, target, loss = torch.randn(16, 8), torch.randn(16, 8), torch.nn.functional.mse_loss
    for _ in range(3):
        before = len(xlakit.steps())
        assert_same(compiled(model, opt, (x.to(dev),), target.to(dev), loss).detach(),
                    train_step(eager, eager_opt, (x,), target, loss), **TOL)
    for p, q in zip(model.parameters(), eager.parameters()):
        assert_same(p.detach(), q, **TOL)
    record, = xlakit.steps()[before:]
    assert len(forwards) == 1, forwards
    return _computed_outputs(forwards[0]) - 1, (record.cost.flops, record.cost.bytes_accessed, record.memory.peak)


def test_a_compiled_training_steps_backward_recomputes_its_forward_at_no_cost_in_its_executable(dev, monkeypatch):
    """The backward of a training graph on the device recomputes its forward (dynamo._recomputing_partition):
    the forward returns only the loss, not the activations AOTAutograd's default split saves (each a tensor
    made at every call), and the one executable of forward, backward and optimizer has the default split's
    FLOPs, bytes and peak memory (XLA merges the recomputed ops with the forward's); values are eager's."""
    from torch._functorch.partitioners import default_partition

    from xlakit.integrations import dynamo

    saved, cost = _block_trained(dev, monkeypatch, dynamo._recomputing_partition)
    saved_by_default, default_cost = _block_trained(dev, monkeypatch, default_partition)
    assert saved == 0 and saved_by_default > 0, (saved, saved_by_default)
    assert cost == default_cost


@pytest.mark.parametrize("sync", ["mark_step", "item"])
def test_a_compiled_model_trained_by_a_lazy_optimizer_joins_the_lazy_step(dev, sync):
    # the model's forward and backward graphs wait for the step, and torch's optimizer runs
    # lazily: a step marker computes the whole step in one executable; with only the loss
    # read (no marker), each read computes this forward with the last step's backward and
    # update, which it reads: the same graph every step, none grows
    eager, model, compiled, x = _compiled_mlp(dev)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (eager, model)]
    sizes = []
    for step in range(STEPS):
        with xlakit.capture() as records:
            loss = compiled(x.to(dev) * step).square().mean()
            loss.backward()
            opts[1].step()
            opts[1].zero_grad()
            got = loss.item() if sync == "item" else (xlakit.mark_step(), loss.item())[1]
        want = eager(x * step).square().mean()
        want.backward()
        opts[0].step()
        opts[0].zero_grad()
        assert got == pytest.approx(want.item(), rel=2e-5)
        sizes.append([r.num_nodes for r in records])
    for p, q in zip(model.parameters(), eager.parameters()):
        assert_same(p.detach(), q.detach(), **TOL)
    if sync == "mark_step":  # the whole step in one execution; the loss read after it is computed
        assert [r.trigger for r in records] == ["mark_step"], records
    else:
        assert [r.trigger for r in records] == ["item"], records
        assert sizes[-1] == sizes[-2], sizes


@pytest.mark.parametrize("write", ["fill_", "data_fill_", "data_assign"])
def test_a_step_count_written_between_compiled_steps_is_read_anew(dev, write):
    # a step reads each host step count from the device value the step before computed, while
    # the host tensor still holds that value: however the user writes it, the next step reads it
    eager, model, _, x = _compiled_mlp(dev)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, eps=1e-6) for m in (eager, model)]
    y = torch.randn(x.shape[0], 4)
    compiled = torch.compile(train_step, backend="xlakit")
    for step in range(STEPS + 2):
        if step == STEPS:
            for opt in opts:
                for state in opt.state.values():
                    if write == "fill_":
                        state["step"].fill_(1.0)
                    elif write == "data_fill_":
                        state["step"].data.fill_(1.0)  # no version bump
                    else:
                        state["step"].data = torch.tensor(1.0)
        got = compiled(model, opts[1], (x.to(dev),), y.to(dev), torch.nn.functional.mse_loss)
        want = train_step(eager, opts[0], (x,), y, torch.nn.functional.mse_loss)
        assert_same(got.detach(), want.detach(), **TOL)
    for p, q in zip(model.parameters(), eager.parameters()):
        assert_same(p.detach(), q.detach(), **TOL)
    assert [s["step"].item() for s in opts[1].state.values()] == [s["step"].item() for s in opts[0].state.values()]


def test_step_counts_stay_the_host_tensors_eager_keeps_each_counted_once_a_step(dev):
    # each new count is written into the host tensor AdamW keeps, as eager's `step += 1` writes it:
    # the same tensor, its dtype, its version counted once a step; read from the step's own result,
    # which syncs nothing (one execution a step)
    eager, model, _, x = _compiled_mlp(dev)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, eps=1e-6) for m in (eager, model)]
    y = torch.randn(x.shape[0], 4)
    compiled = torch.compile(train_step, backend="xlakit")
    for step in range(STEPS):
        before = len(xlakit.steps())
        got = compiled(model, opts[1], (x.to(dev),), y.to(dev), torch.nn.functional.mse_loss)
        executions = len(xlakit.steps()) - before
        want = train_step(eager, opts[0], (x,), y, torch.nn.functional.mse_loss)
        assert_same(got.detach(), want.detach(), **TOL)
        if step == 0:
            counts = [s["step"] for s in opts[1].state.values()]
    assert executions == 1
    assert all(s["step"] is c for s, c in zip(opts[1].state.values(), counts))
    assert [(c.device, c.dtype, c.item(), c._version) for c in counts] == \
        [(s["step"].device, s["step"].dtype, s["step"].item(), s["step"]._version) for s in opts[0].state.values()]


@pytest.mark.parametrize("wait", [True, False], ids=["waiting", "dispatched_ahead"])
def test_step_counts_are_computed_on_the_host_and_reach_the_executable_from_it(dev, monkeypatch, wait):
    # each step's counts are computed by torch on the host from the host's, as eager computes them,
    # never read from the step's result (which waited for a step dispatched ahead); the next step's
    # executable takes them from the host with its call: no upload of their own (core/transfer.host_data),
    # one execution a step, one key
    import jax

    from xlakit.integrations import dynamo

    monkeypatch.setattr(xlakit.config, "wait_for_execution", wait)
    read, host_made, uploads = [], [], []
    monkeypatch.setattr(dynamo, "_computed_on_host", lambda t: read.append(t))
    part = dynamo._HostPart.__call__
    monkeypatch.setattr(dynamo._HostPart, "__call__", lambda *a: host_made.append(1) or part(*a))
    put = jax.device_put
    monkeypatch.setattr(jax, "device_put", lambda x, *a, **k: uploads.append(getattr(x, "shape", None)) or put(x, *a, **k))
    eager, model, _, x = _compiled_mlp(dev)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, eps=1e-6) for m in (eager, model)]
    y = torch.randn(x.shape[0], 4)
    xd, yd = x.to(dev), y.to(dev)
    compiled = torch.compile(train_step, backend="xlakit")
    keys = []
    for step in range(STEPS):
        with xlakit.capture() as records:
            got = compiled(model, opts[1], (xd,), yd, torch.nn.functional.mse_loss)
        want = train_step(eager, opts[0], (x,), y, torch.nn.functional.mse_loss)
        assert_same(got.detach(), want.detach(), **TOL)
        keys.append([r.key for r in records])
        if step == 0:
            uploads.clear()  # the first step traces its graphs
    xlakit.wait()
    assert (len(host_made), read, uploads) == (STEPS, [], [])
    assert all(k == keys[1] and len(k) == 1 for k in keys[1:]), keys  # after the first step's traces
    for p, q in zip(model.parameters(), eager.parameters()):
        assert_same(p.detach(), q.detach(), **TOL)
    assert [(s["step"].dtype, s["step"].item(), s["step"]._version) for s in opts[1].state.values()] == \
        [(s["step"].dtype, s["step"].item(), s["step"]._version) for s in opts[0].state.values()]


def test_the_next_step_reads_the_hosts_count_not_the_devices(dev, monkeypatch):
    # the host's count is what the next step reads: made to differ from the device's result here
    # (10 more each step), the step after reads the host's, as eager would
    from xlakit.integrations import dynamo

    part = dynamo._HostPart.__call__
    monkeypatch.setattr(dynamo._HostPart, "__call__", lambda *a: [c + 10 for c in part(*a)])
    _, model, _, x = _compiled_mlp(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-6)
    compiled = torch.compile(train_step, backend="xlakit")
    for _ in range(3):
        compiled(model, opt, (x.to(dev),), torch.randn(x.shape[0], 4).to(dev), torch.nn.functional.mse_loss)
    assert [s["step"].item() for s in opt.state.values()] == [33.0] * len(opt.state)  # 0, + 1 + 10 each step


def _amp_step(model, optimizer, x, y, whole):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=whole):  # backward and step too, or not
        loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return out, loss


@pytest.mark.parametrize("whole", [False, True], ids=["forward", "whole_step"])
def test_a_compiled_training_step_under_autocast_matches_eager_and_is_one_executable(dev, whole):
    # the region inside the compiled function casts as eager's does (the forward's output is bf16), and
    # the optimizer's graph, called inside a region, runs as AOTAutograd runs it (autocast off around
    # it) and joins the step as outside one
    eager, model, compiled_model, x = _compiled_mlp(dev)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (eager, model)]
    y = torch.randn(x.shape[0], 4)
    compiled = torch.compile(_amp_step, backend="xlakit")
    for _ in range(STEPS):
        with xlakit.capture() as records:
            got = compiled(model, opts[1], x.to(dev), y.to(dev), whole)
        want = _amp_step(eager, opts[0], x, y, whole)
        for g, w in zip(got, want):
            assert_same(g.detach(), w.detach(), rtol=1.6e-2, atol=1e-2)  # bf16 matmuls (tests/test_amp.py)
    for p, q in zip(model.parameters(), eager.parameters()):
        assert_same(p.detach(), q.detach(), rtol=1.6e-2, atol=1e-2)
    assert [(r.trigger, r.cache) for r in records] == [("compiled", "hit")], records


def test_inductors_fma_is_a_times_b_plus_c_rounded_once(dev):
    # torch 2.13's Dynamo writes addcmul_ / addcdiv_ (AdamW's moments) as this op
    from torch._inductor import inductor_prims  # noqa: F401 - registers prims.fma

    a, b, c = torch.randn(3, 256).unbind()
    got = torch.ops.prims.fma(a.to(dev), b.to(dev), c.to(dev))
    assert_same(got, (a.double() * b.double() + c.double()).float(), rtol=0, atol=0)


def test_a_recompile_says_why_dynamo_and_the_key_differ(dev):
    compiled = torch.compile(lambda x: (x * 2).sin(), backend="xlakit", dynamic=False)
    xlakit.clear_cache()  # the closest cached key must be this test's: another test may have cached one as close
    for length in (3, 4):
        x = torch.linspace(-1.0, 1.0, length)
        with xlakit.capture() as steps:
            assert_same(compiled(x.to(dev)), (x * 2).sin(), **TOL)
    (miss,) = [r for r in steps if r.cache != "hit"]
    assert "torch.compile recompiled" in miss.why[0] and "size mismatch" in miss.why[0], miss.why
    assert any("f32[4]" in w for w in miss.why[1:]), miss.why  # xlakit's key diff: the input's shape


def test_a_compiled_forward_on_pending_lazy_values_matches_eager(dev):
    eager, model, compiled, x = _compiled_mlp(dev)
    for step in range(1, 4):
        # the input and the parameters are pending lazy values, not yet computed
        with torch.no_grad():
            for m in (model, eager):
                for p in m.parameters():
                    p.mul_(0.5)
        got = compiled(x.to(dev) * step)
        assert_same(got.detach(), eager(x * step).detach(), **TOL)


def _generating_gpt2(dev):
    """(eager GPT-2, its copy on the device) from seed 0: tests/test_generation.py's model,
    weights wide enough that the tokens vary."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64,
                                     bos_token_id=99, eos_token_id=99, initializer_range=0.2)
    torch.manual_seed(0)
    eager = transformers.GPT2LMHeadModel(config).eval()
    return eager, copy.deepcopy(eager).to(dev)


def test_static_cache_generate_with_a_compiled_forward_gives_eagers_tokens(dev):
    eager, model = _generating_gpt2(dev)
    model.forward = torch.compile(model.forward, backend="xlakit")
    ids = torch.tensor([[5, 17, 42, 8]])
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation="static")
    with dynamo_log() as log, xlakit.capture() as steps:
        got = model.generate(ids.to(dev), **kwargs).cpu()
    assert got.tolist() == eager.generate(ids, **kwargs).tolist()
    assert log.xlakit_frames() == {} and not _failures(log)
    # the later decode steps run the decode graph's executable, updating the key and value
    # caches of both layers in their donated buffers
    decodes = [r for r in steps if r.trigger == "compiled"]
    assert len(decodes) >= 3 and all(len(r.donated) >= 4 for r in decodes), decodes


def _assert_same_cache(got, want):
    """Two transformers DynamicCaches hold the same keys and values, layer by layer."""
    assert len(got.layers) == len(want.layers)
    for mine, eagers in zip(got.layers, want.layers):
        assert_same(mine.keys, eagers.keys, **TOL)
        assert_same(mine.values, eagers.values, **TOL)


def test_a_compiled_forward_with_the_dynamic_cache_matches_eager(dev):
    # the cache's layers start empty, torch.tensor([], device=...) inside the compiled graph:
    # AOTAutograd failed on it (xlakit's lift_fresh kernel lifted the host constant past the fake mode)
    eager, model = _generating_gpt2(dev)
    compiled = torch.compile(model, backend="xlakit")
    prompt, next_ids = torch.tensor([[5, 17, 42, 8]]), torch.tensor([[60]])
    with dynamo_log() as log, torch.no_grad():
        got = compiled(input_ids=prompt.to(dev), use_cache=True)
        want = eager(input_ids=prompt, use_cache=True)
        assert_same(got.logits, want.logits, **TOL)
        _assert_same_cache(got.past_key_values, want.past_key_values)
        # a decode step on the cache the compiled prefill returned, which it extends
        got = compiled(input_ids=next_ids.to(dev), past_key_values=got.past_key_values, use_cache=True)
        want = eager(input_ids=next_ids, past_key_values=want.past_key_values, use_cache=True)
    assert_same(got.logits, want.logits, **TOL)
    _assert_same_cache(got.past_key_values, want.past_key_values)
    assert got.past_key_values.get_seq_length() == 5
    assert log.xlakit_frames() == {} and not _failures(log)


def test_dynamic_cache_generate_with_a_compiled_forward_gives_eagers_tokens(dev):
    eager, model = _generating_gpt2(dev)
    model.forward = torch.compile(model.forward, backend="xlakit")
    ids = torch.tensor([[5, 17, 42, 8]])
    kwargs = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)  # the default cache: DynamicCache
    with dynamo_log() as log, xlakit.integrations.dynamo.compiled_graphs() as graphs:
        got = model.generate(ids.to(dev), **kwargs).cpu()
    assert got.tolist() == eager.generate(ids, **kwargs).tolist()
    assert log.xlakit_frames() == {} and not _failures(log)
    # every graph, the prefill's and the decode steps', ran as one executable, then replayed
    assert graphs and all(g.executables == 1 and not g.splits and g.replays for g in graphs), graphs


def test_a_host_constant_in_a_graph_compiled_by_another_backend_is_faked(dev):
    # xlakit's lift_fresh kernel serves every device: with xlakit installed, torch.tensor(...)
    # on the host inside any AOTAutograd graph reached the fake mode as a real tensor
    x = torch.randn(3)
    compiled = torch.compile(lambda x: x + torch.tensor([1.0, 2.0, 3.0]), backend="aot_eager")
    assert torch.equal(compiled(x), x + torch.tensor([1.0, 2.0, 3.0]))


def _draws_and_more(x):
    noise = torch.rand_like(x)   # drawn again at each replay, as dropout's mask
    return x * noise + torch.nn.functional.dropout(x, 0.5, training=True) * torch.randn_like(x)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_replayed_draws_are_eagers_and_leave_the_generator_where_eager_does(dev, layout):
    compiled = torch.compile(_draws_and_more, backend="xlakit")
    x = torch.randn(6, 4) if layout == "contiguous" else torch.randn(4, 6).t()
    xd = x.to(dev) if layout == "contiguous" else x.t().to(dev).t()   # transposed on the device too
    with xlakit.integrations.dynamo.compiled_graphs() as graphs:
        for seed in range(4):
            torch.manual_seed(seed)
            got, after_got = compiled(xd), torch.rand(3)
            torch.manual_seed(seed)
            want, after_want = _draws_and_more(x), torch.rand(3)
            assert_same(got, want, **TOL)
            assert torch.equal(after_got, after_want)  # the same draws consumed, in the same order
    assert all(g.replays for g in graphs), graphs


FACTORY_DRAWS = {"randn": lambda x: x + torch.randn(3, device=x.device),
                 "rand": lambda x: x * torch.rand(3, device=x.device),
                 "randint": lambda x: x + torch.randint(0, 100, (3,), device=x.device)}


@pytest.mark.parametrize("draw", FACTORY_DRAWS)
def test_a_draw_eager_falls_back_for_is_traced_at_every_call(dev, draw):
    # a factory draw of a given size is an eager fallback, which a replay cannot repeat; on
    # torch 2.13 randn reaches xlakit as empty + normal_, an in-place draw below functionalization
    # (its value was lost: x + 0 at the first call)
    compiled = torch.compile(FACTORY_DRAWS[draw], backend="xlakit")
    x = torch.ones(3)
    with xlakit.integrations.dynamo.compiled_graphs() as graphs:
        for seed in range(3):
            torch.manual_seed(seed)
            got = compiled(x.to(dev))
            torch.manual_seed(seed)
            assert_same(got, FACTORY_DRAWS[draw](x), **TOL)
    assert graphs and not any(g.replays for g in graphs), graphs
