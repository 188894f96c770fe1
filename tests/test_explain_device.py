"""xlakit.explain on device-resident models and inputs, and torch.compile(backend="xlakit")
of a step with a graph break on the device: each FX graph one executable, values equal
eager's, the break and its reason shown; a graph that cannot compile says so."""
import copy
import html

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same
from test_compiled_device import _failures, dynamo_log

import xlakit
from xlakit.integrations import breaks, dynamo
from xlakit.notebook import breaks_view

HERE = "test_explain_device.py"
TOL = dict(rtol=2e-4, atol=2e-5)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def branchy(x):
    y = x.sin() * 2
    if y.sum() > 0:                   # +2: a break
        y = y + 1
    return (y * y).cos()


BRANCH = branchy.__code__.co_firstlineno + 2


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        h = self.encoder(x)
        print("encoded")              # +2: a break between the encoder and the head
        return self.head(h).sin()


def _summary(report):
    """What a report says, but its note: per xlakit path its counts and reasons, each FX
    graph's ops and executables, each break's line, sides and Dynamo's type."""
    paths = [(p.path, p.graphs, p.breaks, p.why) for p in report.paths[:3]]  # torch_xla's are not xlakit's
    graphs = [(g.ops, g.compiled.executables, len(g.compiled.splits)) for g in report.fx_graphs]
    found = [(b.at, b.before, b.after, b.dynamo.title) for b in report.breaks]
    return paths, graphs, found


@pytest.mark.parametrize("case", ["module", "function"])
def test_explain_on_the_device_reports_what_it_reports_on_the_host(dev, case):
    torch.manual_seed(0)
    fn, x = (Net(), torch.randn(3, 4)) if case == "module" else (branchy, torch.linspace(0.1, 1.0, 8))
    host = xlakit.explain(fn, x)
    on_device = xlakit.explain(fn.to(dev) if case == "module" else fn, x.to(dev))
    assert _summary(on_device) == _summary(host)
    assert on_device.note == breaks.DEVICE_NOTE and host.note == breaks.NOTE
    (b,) = on_device.breaks
    line = Net.forward.__code__.co_firstlineno + 2 if case == "module" else BRANCH
    assert b.where.line == line and b.dynamo.code == ("GB0059" if case == "module" else "GB0170")
    # each FX graph ran as one executable on the device buffers, and later calls replay it
    assert all(g.compiled.executables == 1 and g.compiled.replays for g in on_device.fx_graphs)
    if case == "module":
        assert [n.module for n in on_device.fx_graphs[1].graph.nodes] == ["head", ""]


def test_a_compiled_step_with_a_break_runs_each_graph_as_one_executable_on_the_device(dev):
    compiled = torch.compile(branchy, backend="xlakit")
    calls = []
    with dynamo_log() as log, dynamo.compiled_graphs() as graphs:
        for k in (1.0, 2.0, 3.0):  # sin(x) > 0 on (0, 3]: the same branch each time
            x = torch.linspace(0.1, 1.0, 8) * k
            with xlakit.capture() as records:
                got = compiled(x.to(dev))
            assert_same(got, branchy(x), **TOL)
            calls.append([(r.trigger, r.cache) for r in records])
    assert log.xlakit_frames() == {} and not _failures(log)
    assert sum(log.frames.values()) == 2, log.frames  # branchy, and its resume after the break
    assert len(graphs) == 2 and all(g.replays and not g.splits for g in graphs), graphs
    assert [t for t, _ in calls[0]] == ["dynamo", "dynamo"]  # traced once
    assert calls[1] == calls[2] == [("compiled", "hit"), ("compiled", "hit")]  # then one executable per graph

    report = xlakit.explain(branchy, torch.linspace(0.1, 1.0, 8).to(dev))
    fx = report.path("Dynamo FX")
    assert (fx.graphs, fx.breaks) == (2, 1)
    assert fx.why == [f"{HERE}:{BRANCH}: {report.breaks[0].dynamo}"]
    assert report.breaks[0].dynamo.title == "Data-dependent branching"
    assert (report.path("Dynamo -> HLO (xlakit backend)").graphs, report.path("Dynamo -> HLO (xlakit backend)").breaks) == (2, 0)
    assert report.ops_per_graph == [["sin", "mul", "sum", "gt"], ["add", "mul", "cos"]]


def train_step(model, optimizer, x, y):
    loss = F.mse_loss(model(x), y)
    if loss > 0:                      # +2: a break (always taken: a squared error)
        loss = loss * 2
    loss.backward()                   # +4: Dynamo breaks at backward() too
    optimizer.step()
    optimizer.zero_grad()
    return loss


STEP = train_step.__code__.co_firstlineno


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_a_compiled_training_step_with_a_break_matches_eager_on_the_device(dev):
    eager = _mlp()
    model = copy.deepcopy(eager).to(dev)
    eager_opt, opt = (torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (eager, model))
    x, y = torch.randn(6, 4), torch.randn(6, 2)
    compiled = torch.compile(train_step, backend="xlakit")
    frames = []
    with dynamo_log() as log, dynamo.compiled_graphs() as graphs:
        for _ in range(4):
            with xlakit.capture() as records:
                got = compiled(model, opt, x.to(dev), y.to(dev))
            assert_same(got.detach(), train_step(eager, eager_opt, x, y).detach(), **TOL)
            frames.append(sum(log.frames.values()))
    for p, q in zip(model.parameters(), eager.parameters()):
        assert_same(p.detach(), q.detach(), **TOL)
    assert log.xlakit_frames() == {} and not _failures(log)
    assert frames[1] == frames[-1], frames  # no recompile after the first step
    # three FX graphs (to the `if`, to backward(), the optimizer's), each a forward and, the
    # first two, a backward, each replayed at the last step
    assert all(g.replays and not g.splits for g in graphs), graphs
    assert len({g.compile_id for g in graphs if g.forward}) >= 3
    # which run as two executables, cache hits: the `if` reads the loss (the first graph),
    # then the optimizer's graph ends the step (the second forward, both backwards, the update)
    assert [(r.trigger, r.cache) for r in records] == [("item", "hit"), ("compiled", "hit")], records
    assert len(records[0].donated) == 0  # a read: the step's other values still to come
    assert len(records[1].donated) == 2 * len(list(model.parameters()))  # parameters, momentum


def test_explain_of_a_training_step_on_the_device_leaves_the_callers_model_and_optimizer_alone(dev):
    model = _mlp().to(dev)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    report = xlakit.explain(train_step, model, opt, torch.randn(6, 4).to(dev), torch.randn(6, 2).to(dev))
    assert all(torch.equal(b, p.detach().cpu()) for b, p in zip(before, model.parameters()))
    assert not opt.state  # its copy took the steps
    assert [b.where.line for b in report.breaks] == [STEP + 2, STEP + 4]
    assert report.breaks[0].dynamo.title == "Data-dependent branching"
    assert "Tensor.backward()" in report.breaks[1].dynamo.title
    # each FX graph matched to what xlakit compiled of it: its forward, and the backward of the first two
    assert [(g.compiled is not None, g.backward is not None) for g in report.fx_graphs] == [
        (True, True), (True, True), (True, False)]
    assert all(c.executables == 1 for g in report.fx_graphs for c in (g.compiled, g.backward) if c is not None)
    # the view draws both: the static page, and the widget's tabs
    page = report._repr_html_()
    assert "FX graph 0 backward: as xlakit compiled it" in page and "FX graph 2 backward" not in page
    graph_rows = report.widget().children[-1]
    assert graph_rows.get_title(0) == "FX graph 0: 5 ops, 1 executable, 0 HLO splits, backward 1 executable, 0 HLO splits"
    tabs = graph_rows.children[0]
    assert [tabs.get_title(i) for i in range(len(tabs.children))] == ["graph 0", "graph 0 in HLO", "graph 0 backward in HLO"]


def resized(x):
    return F.interpolate((x * 2).view(1, 1, 2, 4), size=(2, 3), mode="bilinear", antialias=True).sum()


def large_indices(x):
    return torch.nonzero(x > 0.5).sum() + x.sum()


@pytest.mark.parametrize("case", ["no lowering", "data-dependent shape"])
def test_a_graph_that_cannot_compile_says_so_with_its_node_and_line(dev, case):
    fn, node, why = ((resized, "_upsample_bilinear2d_aa", "runs eagerly on CPU: no XLA lowering")
                     if case == "no lowering" else
                     (large_indices, "nonzero", "its output's shape depends on the data"))
    line = fn.__code__.co_firstlineno + 1
    x = torch.linspace(-1.0, 1.0, 8)
    # Dynamo keeps nonzero in the graph only when told to: then xlakit's backend must cut it
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(fn, backend="xlakit")
        with dynamo.compiled_graphs() as graphs:
            for _ in range(2):
                assert_same(compiled(x.to(dev)), fn(x), **TOL)
        report = xlakit.explain(fn, x.to(dev))
    (graph,) = graphs
    (split,) = graph.splits
    assert (split.node, split.reason, split.source.user.line) == (node, "fallback", line)
    assert split.why.startswith(why)
    assert not graph.replays  # traced at every call: its splits are the last call's, not one more per call
    compiled = report.path("Dynamo -> HLO (xlakit backend)")
    assert compiled.breaks == 1 and compiled.why[0].startswith(f"FX graph 0: {split.op} ({node}) fallback at {HERE}:{line} ({why}")
    assert report.breaks == [] and report.fx_graphs[0].compiled.executables == 2
    assert html.escape(why) in breaks_view.splits_html(report.fx_graphs[0].compiled)  # the view's "ended by" column


TRAIN_STEP_PROGRAM = """
import torch, xlakit
dev = xlakit.device()
def train_step(model, opt, x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    if loss > 0:
        loss = loss * 2
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(dev)
if EARLIER_BACKWARD:
    model(torch.randn(6, 4).to(dev)).sum().backward()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
report = xlakit.explain(train_step, model, opt, torch.randn(6, 4).to(dev), torch.randn(6, 2).to(dev))
print([(p.path, p.graphs, p.why) for p in report.paths[3:]])
print([(p.path, p.graphs, p.breaks) for p in report.paths[:3]])
"""


@pytest.mark.parametrize("earlier_backward", [False, True])
def test_torch_xlas_paths_of_a_training_step_run_or_say_why_not(new_python, earlier_backward):
    pytest.importorskip("torch_xla")
    # a fresh process (this one made torch_xla's device at its start: conftest.py). PyTorch's
    # autograd engine counts devices at the first backward(): explain() makes torch_xla's before
    # its own paths' backward(); after the user's own, torch_xla's paths cannot run, and say so
    program = f"EARLIER_BACKWARD = {earlier_backward}\n{TRAIN_STEP_PROGRAM}"
    theirs, ours = new_python("-c", program, check=True, timeout=600).stdout.strip().splitlines()
    if earlier_backward:
        assert theirs == str([(name, 0, [breaks.LATE_DEVICE_WHY]) for name in ("torch_xla LazyTensor", "torch_xla openxla")])
    else:
        assert theirs.startswith("[('torch_xla LazyTensor', 2, ") and "not run" not in theirs, theirs
    assert ours == str([("Dynamo FX", 3, 2), ("Dynamo -> HLO (xlakit backend)", 5, 0), ("Lazy (xlakit engine)", 2, 1)])


_CLOSED_OVER = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())


def reads_a_global_module(x):
    y = _CLOSED_OVER(x)
    if y.sum() > 0:                   # +2: a break
        y = y * 2
    return y


@pytest.mark.parametrize("batch_on", ["host", "device"])
def test_explain_of_a_function_of_a_module_on_the_device_that_it_does_not_take_as_an_argument(dev, batch_on):
    # the module is a global of the function, not an argument: explain could not copy it to
    # torch_xla's device, whose paths raised a device mismatch; a host batch ran on the host
    # beside the module's device parameters and Dynamo failed on the mixed devices
    torch.manual_seed(0)
    _CLOSED_OVER.to(dev)
    x = torch.randn(3, 4)
    report = xlakit.explain(reads_a_global_module, x if batch_on == "host" else x.to(dev))
    assert report.note == breaks.DEVICE_NOTE
    (b,) = report.breaks
    assert b.where.line == reads_a_global_module.__code__.co_firstlineno + 2 and b.dynamo.code == "GB0170"
    assert [(p.graphs, p.breaks) for p in report.paths[:3]] == [(2, 1), (2, 0), (2, 1)], report.paths
    for path in report.paths[3:]:     # torch_xla's, where it is installed
        assert path.why == [breaks.NOT_MOVED_WHY], path
